"""A cluster's storage through the API: Vertex's fields (``homeDirectoryStorage``, a pool's
``lustres``) and mtc's ``mtcStorage`` are accepted, stored and shown on get and list, reach
the domain's cluster spec, and a value mtc cannot honour is a 400 naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from tests.serving import PARENT, cluster_body
from tests.unit.api.conftest import Api

CLUSTERS = f"/v1beta1/{PARENT}/modelDevelopmentClusters"
HOME = "projects/p/locations/us-central1-a/instances/home"
LUSTRE = "projects/p/locations/us-central1-a/instances/lfs"


def storage_body(**lustre: Any) -> dict[str, Any]:
    body = cluster_body(workers=2)
    body["nodePools"][1]["lustres"] = [LUSTRE]
    body["orchestratorSpec"]["slurmSpec"]["homeDirectoryStorage"] = HOME
    body["mtcStorage"] = {"lustreInstances": [{"name": LUSTRE, "perUnitStorageThroughput": 1000,
                                               "capacityGib": 72000, **lustre}],
                          "gcsBuckets": ["my-data"]}
    return body


def test_storage_is_accepted_stored_and_shown(api: Api) -> None:
    resp = api.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=s1", storage_body())
    assert resp.status_code == 200, resp.json
    with api.app.transaction() as uow:
        cluster = uow.clusters.get("s1")
    assert cluster is not None and cluster.spec.storage is not None
    storage = cluster.spec.storage
    assert storage.home == HOME and storage.gcs_buckets == ("my-data",)
    (lustre,) = storage.lustres
    assert (lustre.per_unit_storage_throughput, lustre.capacity_gib) == (1000, 72000)
    assert lustre.mount_point == "/mnt/lustre/lfs"  # Vertex's LustreMount root, by default
    assert lustre.throughput_gb_s == pytest.approx(1000 * 72000 / 1024 / 1000)
    got = api.call("GET", f"{CLUSTERS}/s1").json
    assert got["orchestratorSpec"]["slurmSpec"]["homeDirectoryStorage"] == HOME
    assert got["nodePools"][1]["lustres"] == [LUSTRE]
    shown = got["mtcStorage"]["lustreInstances"][0]
    assert int(shown["perUnitStorageThroughput"]) == 1000 and shown["name"] == LUSTRE
    assert got["mtcStorage"]["gcsBuckets"] == ["my-data"]
    listed = api.call("GET", CLUSTERS).json["modelDevelopmentClusters"]
    assert listed[0]["mtcStorage"] == got["mtcStorage"]


@pytest.mark.parametrize(("change", "field"), [
    ({"perUnitStorageThroughput": 25}, "mtcStorage.lustreInstances[0].perUnitStorageThroughput"),
    ({"perUnitStorageThroughput": 300}, "mtcStorage.lustreInstances[0].perUnitStorageThroughput"),
    ({"capacityGib": 9000, "perUnitStorageThroughput": 125},
     "mtcStorage.lustreInstances[0].capacityGib"),
    ({"capacityGib": 10000}, "mtcStorage.lustreInstances[0].capacityGib"),
    ({"mountPoint": "/home/lfs"}, "mtcStorage.lustreInstances[0].mountPoint"),
    ({"mountPoint": "relative"}, "mtcStorage.lustreInstances[0].mountPoint"),
])
def test_a_lustre_mtc_cannot_honour_is_refused_by_name(api: Api, change: dict[str, Any],
                                                        field: str) -> None:
    resp = api.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=s2", storage_body(**change))
    assert resp.status_code == 400 and field in str(resp.json), resp.json
    with api.app.transaction() as uow:
        assert uow.clusters.get("s2") is None


def _no_filestores(body: dict[str, Any]) -> None:
    body["nodePools"][1]["filestores"] = [HOME]


def _bad_home(body: dict[str, Any]) -> None:
    body["orchestratorSpec"]["slurmSpec"]["homeDirectoryStorage"] = "home"


def _undescribed(body: dict[str, Any]) -> None:
    body["mtcStorage"]["lustreInstances"] = []


def _unmounted(body: dict[str, Any]) -> None:
    body["nodePools"][1]["lustres"] = []


def _bad_bucket(body: dict[str, Any]) -> None:
    body["mtcStorage"]["gcsBuckets"] = ["Not_A/Bucket"]


@pytest.mark.parametrize(("edit", "field"), [
    (_no_filestores, "nodePools[1].filestores"),
    (_bad_home, "orchestratorSpec.slurmSpec.homeDirectoryStorage"),
    (_undescribed, "nodePools[1].lustres[0]"),
    (_unmounted, "mtcStorage.lustreInstances[0].name"),
    (_bad_bucket, "mtcStorage.gcsBuckets[0]"),
])
def test_storage_it_cannot_honour_is_refused_by_name(api: Api, edit: Any, field: str) -> None:
    body = storage_body()
    edit(body)
    resp = api.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=s3", body)
    assert resp.status_code == 400 and field in str(resp.json), resp.json


def test_worker_pools_mounting_different_lustres_are_refused(api: Api) -> None:
    body = storage_body()
    body["nodePools"].append({**body["nodePools"][1], "id": "gpu2", "lustres": []})
    body["orchestratorSpec"]["slurmSpec"]["partitions"].append({"id": "gpu2",
                                                               "nodePoolIds": ["gpu2"]})
    resp = api.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=s4", body)
    assert resp.status_code == 400 and "nodePools[2].lustres" in str(resp.json), resp.json


def test_the_openapi_document_shows_the_storage_fields() -> None:
    from services.api.http import ROUTES
    from services.api.openapi import document

    schemas = document(ROUTES)["components"]["schemas"]

    def props(name: str) -> set[str]:
        return set(schemas[name]["properties"])

    assert "homeDirectoryStorage" in props("SlurmSpec")
    assert {"lustres", "filestores"} <= props("NodePool")
    assert "mtcStorage" in props("ModelDevelopmentCluster")
    assert {"lustreInstances", "gcsBuckets"} <= props("MtcStorage")


def test_an_update_changes_the_storage(api: Api) -> None:
    made = api.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=s5", storage_body())
    assert made.status_code == 200, made.json
    api.done(made.json)  # READY: an update needs it
    faster = storage_body(perUnitStorageThroughput=500, capacityGib=36000)
    resp = api.call("PATCH", f"{CLUSTERS}/s5", faster)
    assert resp.status_code == 200, resp.json
    with api.app.transaction() as uow:
        cluster = uow.clusters.get("s5")
    assert cluster is not None and cluster.spec.storage is not None
    assert cluster.spec.storage.lustres[0].per_unit_storage_throughput == 500
    shown = api.call("GET", f"{CLUSTERS}/s5").json["mtcStorage"]["lustreInstances"][0]
    assert int(shown["capacityGib"]) == 36000


def test_a_bucket_another_project_owns_is_refused_and_nothing_is_made(api: Api) -> None:
    """A cluster's buckets are mounted into every job on it, so they are its project's own,
    as every bucket a job names: another project's is a 403 naming the field."""
    assert api.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=s1",
                    storage_body()).status_code == 200  # PARENT's project owns my-data now
    other = "projects/other/locations/us-central1"
    resp = api.call("POST", f"/v1beta1/{other}/modelDevelopmentClusters"
                    "?modelDevelopmentClusterId=s2", storage_body())
    assert resp.status_code == 403, resp.json
    assert "mtcStorage.gcsBuckets[0]" in resp.json["error"]["message"]
    assert api.call("GET", f"/v1beta1/{other}/modelDevelopmentClusters/s2").status_code == 404
