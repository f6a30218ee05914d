"""A cluster's storage in the domain: parsed from the spec's ``storage``, back to the same
document, each part mapped to a directory of the output root; a mount point that would
shadow the system or the other mounts is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.domain.cluster_storage import ClusterStorage
from shared.domain.errors import ValidationError
from shared.domain.specs import ClusterSpec

HOME = "projects/p/locations/z/instances/home"
LFS = "projects/p/locations/z/instances/lfs"
DOC = {"homeDirectoryStorage": HOME, "gcsBuckets": ["data"],
       "lustres": [{"name": LFS, "perUnitStorageThroughput": 250, "capacityGib": 72000,
                    "mountPoint": "/scratch"}]}


def test_the_storage_round_trips_through_the_cluster_spec() -> None:
    spec = ClusterSpec.parse({"clusterId": "c", "storage": DOC, "nodePools": [
        {"id": "gpu", "machineSpec": {"machineType": "a3-highgpu-8g"}, "nodeCount": 1}]})
    assert spec.storage is not None and spec.to_dict()["storage"] == DOC
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    assert spec.storage.lustres[0].throughput_gb_s == pytest.approx(250 * 72000 / 1024 / 1000)


def test_each_part_maps_to_a_directory_of_the_output_root() -> None:
    storage = ClusterStorage.parse(DOC, "storage")
    assert storage.mounts(Path("/out"), "c") == {
        "/home": "/out/storage/c/home", "/scratch": "/out/storage/c/lustre/lfs",
        "/gcs/data": "/out/gcs/data"}


@pytest.mark.parametrize("mount", ["/", "/etc/lfs", "/home/lfs", "/gcs", "/mnt/../etc", "x"])
def test_a_mount_point_that_would_shadow_another_is_refused(mount: str) -> None:
    doc = {"lustres": [{**DOC["lustres"][0], "mountPoint": mount}]}  # type: ignore[index]
    with pytest.raises(ValidationError, match=r"storage\.lustres\[0\]\.mountPoint"):
        ClusterStorage.parse(doc, "storage")


def test_two_lustres_at_one_mount_point_are_refused() -> None:
    one = DOC["lustres"][0]  # type: ignore[index]
    doc = {"lustres": [one, {**one, "name": LFS + "2"}]}
    with pytest.raises(ValidationError, match=r"storage\.lustres\[1\]\.mountPoint"):
        ClusterStorage.parse(doc, "storage")
