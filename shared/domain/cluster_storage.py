"""A cluster's storage, as the managed training clusters name it: a Filestore share mounted at
``/home`` (``homeDirectoryStorage``), Managed Lustre instances (a throughput tier in MB/s per
TiB and a capacity), and Cloud Storage buckets seen through Cloud Storage FUSE at
``/gcs/<bucket>``.

The Lustre tiers and their capacity bounds are Managed Lustre's published ones
(cloud.google.com/managed-lustre/docs/performance-tiers): 1,000 / 500 / 250 / 125 MBps per
TiB, from 9,000 / 18,000 / 36,000 / 72,000 GiB (the tier's small step) up to 10,008,000 /
20,016,000 / 40,032,000 / 12,240,000 GiB. The Dynamic tier's throughput depends on the data's
access pattern, so a save time cannot be derived from it: it is refused by name. A capacity
must be a multiple of the tier's small step (the larger step above a size is a multiple of
it: necessary, not the whole rule). A Lustre instance is mounted at ``mountPoint``, under
``/mnt/lustre/`` unless given (Vertex's ``LustreMount`` mounts there).

``mounts`` maps each to a directory of the deployment's output root: what the embedded
default binds at those paths in a rank's sandbox (``shared.adapters.compute.local.sandbox``).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.domain import validation as kit
from shared.domain.errors import ValidationError

# a rank's environment: JSON, each path the job sees -> where it is for this rank (the same
# path in a root server's sandbox, else the host directory under the output root)
STORAGE_MOUNTS = "MTC_STORAGE_MOUNTS"
HOME = "/home"
GCS = "/gcs"
LUSTRE_ROOT = "/mnt/lustre"
INSTANCE = re.compile(r"^projects/[^/]+/locations/[^/]+/instances/([a-z]([-a-z0-9]{0,61}[a-z0-9])?)$")
BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")
# MBps per TiB -> (min GiB: also the small step, max GiB): Managed Lustre's performance tiers
TIERS = {1000: (9_000, 10_008_000), 500: (18_000, 20_016_000), 250: (36_000, 40_032_000),
         125: (72_000, 12_240_000)}
DYNAMIC_TIER = 25  # aggregate MBps per TiB, access-pattern dependent: not modelled
GIB_PER_TIB = 1024
RESERVED = ("/", "/proc", "/sys", "/dev", "/tmp", "/etc", "/usr", "/bin", "/lib", "/root")


@dataclass(frozen=True)
class LustreInstance:
    name: str  # projects/P/locations/ZONE/instances/ID
    per_unit_storage_throughput: int  # MBps per TiB: the performance tier
    capacity_gib: int
    mount_point: str

    @property
    def instance_id(self) -> str:
        return self.name.rsplit("/", 1)[-1]

    @property
    def throughput_gb_s(self) -> float:
        """The instance's peak throughput, GB/s: its tier times its capacity."""
        return self.per_unit_storage_throughput * self.capacity_gib / GIB_PER_TIB / 1000.0

    @classmethod
    def parse(cls, value: Any, path: str) -> LustreInstance:
        data = kit.mapping(value, path, noun="an object")
        kit.only_keys(data, path, ("name", "perUnitStorageThroughput", "capacityGib",
                                   "mountPoint"))
        name = instance_name(kit.required(data, "name", path), kit.join(path, "name"))
        where = kit.join(path, "perUnitStorageThroughput")
        tier = kit.integer(kit.required(data, "perUnitStorageThroughput", path), where)
        if tier == DYNAMIC_TIER:
            raise ValidationError(where, "the Dynamic tier is not supported: its throughput "
                                         "follows the data's access pattern, so mtc cannot "
                                         "derive a checkpoint's save time from it")
        if tier not in TIERS:
            raise ValidationError(where, f"must be one of {', '.join(map(str, TIERS))} (MBps "
                                         f"per TiB), got {tier}")
        low, high = TIERS[tier]
        where = kit.join(path, "capacityGib")
        gib = kit.integer(kit.required(data, "capacityGib", path), where, low=low, high=high)
        if gib % low:
            raise ValidationError(where, f"must be a multiple of {low} GiB at {tier} MBps per "
                                         f"TiB, got {gib}")
        default = posixpath.join(LUSTRE_ROOT, name.rsplit("/", 1)[-1])
        mount = mount_path(kit.get(data, "mountPoint", default), kit.join(path, "mountPoint"))
        return cls(name, tier, gib, mount)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "perUnitStorageThroughput": self.per_unit_storage_throughput,
                "capacityGib": self.capacity_gib, "mountPoint": self.mount_point}


@dataclass(frozen=True)
class ClusterStorage:
    home: str | None = None  # a Filestore instance's resource name, mounted at /home
    lustres: tuple[LustreInstance, ...] = ()
    gcs_buckets: tuple[str, ...] = ()

    @classmethod
    def parse(cls, value: Any, path: str) -> ClusterStorage:
        data = kit.mapping(value, path, noun="an object")
        kit.only_keys(data, path, ("homeDirectoryStorage", "lustres", "gcsBuckets"))
        raw_home = data.get("homeDirectoryStorage")
        home = None if raw_home is None else instance_name(
            raw_home, kit.join(path, "homeDirectoryStorage"))
        lustres = kit.list_field(data, "lustres", path, LustreInstance.parse, required=False,
                                 non_empty=False)
        buckets = kit.list_field(data, "gcsBuckets", path, bucket_name, required=False,
                                 non_empty=False)
        seen: dict[str, str] = {}
        for i, lustre in enumerate(lustres):
            where = kit.join(kit.join(path, "lustres"), i)
            if lustre.name in [x.name for x in lustres[:i]]:
                raise ValidationError(kit.join(where, "name"), f"duplicate {lustre.name!r}")
            if lustre.mount_point in seen:
                raise ValidationError(kit.join(where, "mountPoint"),
                                      f"{lustre.mount_point} is already {seen[lustre.mount_point]}'s")
            seen[lustre.mount_point] = lustre.name
        for i, bucket in enumerate(buckets):
            if bucket in buckets[:i]:
                raise ValidationError(kit.join(kit.join(path, "gcsBuckets"), i),
                                      f"duplicate bucket {bucket!r}")
        return cls(home, lustres, buckets)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.home:
            out["homeDirectoryStorage"] = self.home
        if self.lustres:
            out["lustres"] = [x.to_dict() for x in self.lustres]
        if self.gcs_buckets:
            out["gcsBuckets"] = list(self.gcs_buckets)
        return out

    def mounts(self, output_root: Path, cluster_id: str) -> dict[str, str]:
        """Path a job sees -> the directory of the output root that holds it: the Filestore
        share and each Lustre instance under ``storage/<cluster>/``, a bucket where the
        deployment keeps its ``gs://`` tree (``gcs/<bucket>``), as its outputs are."""
        base = output_root / "storage" / cluster_id
        out: dict[str, str] = {}
        if self.home:
            out[HOME] = str(base / "home")
        for lustre in self.lustres:
            out[lustre.mount_point] = str(base / "lustre" / lustre.instance_id)
        for bucket in self.gcs_buckets:
            out[f"{GCS}/{bucket}"] = str(output_root / "gcs" / bucket)
        return out


def instance_name(value: Any, path: str) -> str:
    name = kit.text(value, path)
    if not INSTANCE.match(name):
        raise ValidationError(path, "must be an instance's full resource name, "
                                    f"projects/PROJECT/locations/ZONE/instances/ID; got {name!r}")
    return name


def bucket_name(value: Any, path: str) -> str:
    name = kit.text(value, path).removeprefix("gs://").rstrip("/")
    if not BUCKET.match(name) or ".." in name:
        raise ValidationError(path, f"must be a Cloud Storage bucket name (3-63 of a-z, 0-9, "
                                    f"'.', '-', '_'), got {value!r}")
    return name


def mount_path(value: Any, path: str) -> str:
    raw = kit.text(value, path)
    norm = posixpath.normpath(raw)
    if not raw.startswith("/") or norm != raw.rstrip("/") or ".." in raw.split("/"):
        raise ValidationError(path, f"must be an absolute, normalized path, got {raw!r}")
    for taken in (HOME, GCS, *RESERVED):
        if norm == taken or (taken != "/" and norm.startswith(taken + "/")) or (
                taken in (HOME, GCS) and taken.startswith(norm + "/")):
            raise ValidationError(path, f"{norm} is {taken}'s (not a mount point for Lustre)")
    return norm

