"""The user-facing API shapes: the cluster spec and the CustomJob spec.

Parsing is validation: every rejection is a ValidationError naming the field path
(``jobSpec.workerPoolSpecs[0].machineSpec.acceleratorCount``) and the reason. The parsed
objects serialize back to the same camelCase JSON users wrote.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.domain import images
from shared.domain import validation as kit
from shared.domain.cluster_storage import ClusterStorage
from shared.domain.errors import ValidationError
from shared.domain.queues import QueueSpec
from shared.domain.queues import parse as parse_queues
from shared.domain.topology import Topology

ID_PATTERN = re.compile(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$")
DURATION_PATTERN = re.compile(r"^(\d+(\.\d+)?)s$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_NODES_PER_POOL = 100_000


def _obj(value: Any, path: str) -> Mapping[str, Any]:
    """A JSON object; the request body itself is named ``(body)``."""
    return kit.mapping(value, path or "(body)", noun="an object")


def _id(data: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> str | None:
    value = kit.string(data, key, path, required=required)
    if value is not None and not ID_PATTERN.match(value):
        raise ValidationError(
            kit.join(path, key),
            f"must be lowercase letters, digits and hyphens, start with a letter, "
            f"at most 63 characters; got {value!r}",
        )
    return value


def _duration_s(value: str, path: str) -> float:
    match = DURATION_PATTERN.match(value)
    if not match:
        raise ValidationError(path, f"must be a duration like '3600s', got {value!r}")
    return float(match.group(1))


# ---------------------------------------------------------------- machine spec


@dataclass(frozen=True)
class MachineSpec:
    machine_type: str
    accelerator_type: str | None = None
    accelerator_count: int = 0

    @classmethod
    def parse(cls, value: Any, path: str) -> MachineSpec:
        data = _obj(value, path)
        machine_type = kit.string(data, "machineType", path)
        accelerator_type = kit.string(data, "acceleratorType", path, required=False)
        count = kit.int_field(data, "acceleratorCount", path, required=False, minimum=0, maximum=16)
        if accelerator_type and count == 0:
            raise ValidationError(
                kit.join(path, "acceleratorCount"), "must be at least 1 when acceleratorType is set"
            )
        if count and not accelerator_type:
            raise ValidationError(
                kit.join(path, "acceleratorType"), "is required when acceleratorCount is set"
            )
        assert machine_type is not None
        return cls(machine_type, accelerator_type, count)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"machineType": self.machine_type}
        if self.accelerator_type:
            out["acceleratorType"] = self.accelerator_type
            out["acceleratorCount"] = self.accelerator_count
        return out


# ---------------------------------------------------------------- cluster spec


@dataclass(frozen=True)
class NodePoolSpec:
    pool_id: str
    machine_spec: MachineSpec
    node_count: int
    spare_count: int = 0
    topology: Topology | None = None  # racks, NVLink domains, switches (shared.domain.topology)

    @classmethod
    def parse(cls, value: Any, path: str) -> NodePoolSpec:
        data = _obj(value, path)
        pool_id = _id(data, "id", path)
        machine = MachineSpec.parse(kit.field(data, "machineSpec", path, dict, required=True),
                                    kit.join(path, "machineSpec"))
        nodes = kit.int_field(data, "nodeCount", path, minimum=0, maximum=MAX_NODES_PER_POOL)
        spares = kit.int_field(data, "spareCount", path, required=False, minimum=0,
                      maximum=MAX_NODES_PER_POOL)
        if spares > nodes:
            raise ValidationError(kit.join(path, "spareCount"),
                                  f"must not exceed nodeCount ({nodes}), got {spares}")
        topo_value = kit.field(data, "topology", path, dict, required=False)
        topology = None if topo_value is None \
            else Topology.parse(topo_value, kit.join(path, "topology"))
        if topology is not None:
            topology.check(nodes, kit.join(path, "topology"))
        assert pool_id is not None
        return cls(pool_id, machine, nodes, spares, topology)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.pool_id, "machineSpec": self.machine_spec.to_dict(),
               "nodeCount": self.node_count, "spareCount": self.spare_count}
        if self.topology is not None:
            out["topology"] = self.topology.to_dict()
        return out


@dataclass(frozen=True)
class PartitionSpec:
    name: str
    node_pool_ids: tuple[str, ...]

    @classmethod
    def parse(cls, value: Any, path: str) -> PartitionSpec:
        data = _obj(value, path)
        name = _id(data, "name", path)
        pools = kit.list_field(data, "nodePoolIds", path, _parse_pool_ref)
        assert name is not None
        return cls(name, pools)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "nodePoolIds": list(self.node_pool_ids)}


def _parse_pool_ref(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError(path, "must be a node pool id")
    return value


@dataclass(frozen=True)
class ClusterSpec:
    cluster_id: str
    display_name: str
    login_machine_type: str
    node_pools: tuple[NodePoolSpec, ...]
    partitions: tuple[PartitionSpec, ...]
    labels: tuple[tuple[str, str], ...] = ()  # e.g. mtc-recovery-mode: the cluster's pin
    storage: ClusterStorage | None = None  # its /home, Lustre and buckets (cluster_storage)
    queues: tuple[QueueSpec, ...] = ()  # team quotas (fair share); none: no quotas

    @classmethod
    def parse(cls, value: Any) -> ClusterSpec:
        data = _obj(value, "")
        cluster_id = _id(data, "clusterId", "")
        display_name = kit.string(data, "displayName", "", required=False) or cluster_id
        login = kit.field(data, "loginNode", "", dict, required=False) or {"machineType": "n2-standard-8"}
        login_type = kit.string(_obj(login, "loginNode"), "machineType", "loginNode")
        pools = kit.list_field(data, "nodePools", "", NodePoolSpec.parse)
        partitions = kit.list_field(data, "partitions", "", PartitionSpec.parse, required=False,
                           non_empty=False)
        pool_ids = [p.pool_id for p in pools]
        for i, pid in enumerate(pool_ids):
            if pid in pool_ids[:i]:
                raise ValidationError(f"nodePools[{i}].id", f"duplicate node pool id {pid!r}")
        if not partitions:  # one partition per pool, named after it, as Slurm users expect
            partitions = tuple(PartitionSpec(p.pool_id, (p.pool_id,)) for p in pools)
        owner: dict[str, str] = {}
        for i, part in enumerate(partitions):
            if part.name in [p.name for p in partitions[:i]]:
                raise ValidationError(f"partitions[{i}].name", f"duplicate partition {part.name!r}")
            for j, pid in enumerate(part.node_pool_ids):
                where = f"partitions[{i}].nodePoolIds[{j}]"
                if pid not in pool_ids:
                    raise ValidationError(where, f"unknown node pool {pid!r}")
                if pid in owner:
                    raise ValidationError(
                        where, f"node pool {pid!r} is already in partition {owner[pid]!r}")
                owner[pid] = part.name
        for i, pid in enumerate(pool_ids):
            if pid not in owner:
                raise ValidationError(f"nodePools[{i}].id", f"node pool {pid!r} is in no partition")
        assert cluster_id is not None and login_type is not None
        labels = _labels(kit.field(data, "labels", "", dict, required=False) or {}, "labels")
        raw = data.get("storage")
        storage = None if raw is None else ClusterStorage.parse(raw, "storage")
        sizes = {part.name: sum(p.node_count - p.spare_count for p in pools
                                if p.pool_id in part.node_pool_ids) for part in partitions}
        queued = parse_queues(data.get("queues"), "queues", sizes)
        return cls(cluster_id, display_name or cluster_id, login_type, pools, partitions,
                   labels, storage, queued)

    def partition_of(self, pool_id: str) -> str:
        return next(p.name for p in self.partitions if pool_id in p.node_pool_ids)

    def pool(self, pool_id: str) -> NodePoolSpec:
        return next(p for p in self.node_pools if p.pool_id == pool_id)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "clusterId": self.cluster_id,
            "displayName": self.display_name,
            "loginNode": {"machineType": self.login_machine_type},
            "nodePools": [p.to_dict() for p in self.node_pools],
            "partitions": [p.to_dict() for p in self.partitions],
        }
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.storage is not None and self.storage.to_dict():
            out["storage"] = self.storage.to_dict()
        if self.queues:
            out["queues"] = [q.to_dict() for q in self.queues]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClusterSpec:
        return cls.parse(d)


# ---------------------------------------------------------------- custom job spec


@dataclass(frozen=True)
class ContainerSpec:
    image_uri: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, value: Any, path: str) -> ContainerSpec:
        data = _obj(value, path)
        image = kit.string(data, "imageUri", path)
        command = kit.list_field(data, "command", path, _parse_arg, required=False, non_empty=False)
        args = kit.list_field(data, "args", path, _parse_arg, required=False, non_empty=False)
        env = kit.list_field(data, "env", path, _parse_env, required=False, non_empty=False)
        assert image is not None
        if command and not command[0].strip():  # it would only fail at run time
            raise ValidationError(f"{path}.command[0]", "must name the program to run (it is "
                                  "blank)")
        images.check_image(image, kit.join(path, "imageUri"))
        return cls(image, command, args, env)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"imageUri": self.image_uri}
        if self.command:
            out["command"] = list(self.command)
        if self.args:
            out["args"] = list(self.args)
        if self.env:
            out["env"] = [{"name": k, "value": v} for k, v in self.env]
        return out


@dataclass(frozen=True)
class PythonPackageSpec:
    executor_image_uri: str
    package_uris: tuple[str, ...]
    python_module: str
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, value: Any, path: str) -> PythonPackageSpec:
        data = _obj(value, path)
        image = kit.string(data, "executorImageUri", path)
        uris = kit.list_field(data, "packageUris", path, _parse_arg, required=False, non_empty=False)
        module = kit.string(data, "pythonModule", path)
        args = kit.list_field(data, "args", path, _parse_arg, required=False, non_empty=False)
        env = kit.list_field(data, "env", path, _parse_env, required=False, non_empty=False)
        assert image is not None and module is not None
        images.check_image(image, kit.join(path, "executorImageUri"))
        return cls(image, uris, module, args, env)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"executorImageUri": self.executor_image_uri,
                               "packageUris": list(self.package_uris),
                               "pythonModule": self.python_module}
        if self.args:
            out["args"] = list(self.args)
        if self.env:
            out["env"] = [{"name": k, "value": v} for k, v in self.env]
        return out


def _parse_arg(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ValidationError(path, f"must be a string, got {type(value).__name__}")
    return value


def _parse_env(value: Any, path: str) -> tuple[str, str]:
    data = _obj(value, path)
    name = kit.string(data, "name", path)
    val = kit.field(data, "value", path, str, required=False) or ""
    assert name is not None
    if not ENV_NAME.match(name):
        raise ValidationError(kit.join(path, "name"), "must be a shell identifier "
                              f"([A-Za-z_][A-Za-z0-9_]*), got {name!r}")
    return (name, val)


@dataclass(frozen=True)
class DiskSpec:
    """Recorded and returned; the nodes of a cluster already have their disks."""

    boot_disk_type: str = "pd-ssd"
    boot_disk_size_gb: int = 100

    @classmethod
    def parse(cls, value: Any, path: str) -> DiskSpec:
        data = _obj(value, path)
        kind = kit.string(data, "bootDiskType", path, required=False) or "pd-ssd"
        size = kit.int_field(data, "bootDiskSizeGb", path, required=False, minimum=10,
                             maximum=65536, default=100)
        return cls(kind, size)

    def to_dict(self) -> dict[str, Any]:
        return {"bootDiskType": self.boot_disk_type, "bootDiskSizeGb": self.boot_disk_size_gb}


@dataclass(frozen=True)
class WorkerPoolSpec:
    machine_spec: MachineSpec
    replica_count: int
    container_spec: ContainerSpec | None = None
    python_package_spec: PythonPackageSpec | None = None
    disk_spec: DiskSpec | None = None

    @classmethod
    def parse(cls, value: Any, path: str) -> WorkerPoolSpec:
        data = _obj(value, path)
        machine = MachineSpec.parse(kit.field(data, "machineSpec", path, dict, required=True),
                                    kit.join(path, "machineSpec"))
        replicas = kit.int_field(data, "replicaCount", path, required=False, minimum=1, maximum=100_000,
                        default=1)
        container = kit.field(data, "containerSpec", path, dict, required=False)
        package = kit.field(data, "pythonPackageSpec", path, dict, required=False)
        if (container is None) == (package is None):
            raise ValidationError(path, "needs exactly one of containerSpec or pythonPackageSpec")
        disk = kit.field(data, "diskSpec", path, dict, required=False)
        pool = cls(
            machine,
            replicas,
            ContainerSpec.parse(container, kit.join(path, "containerSpec")) if container else None,
            PythonPackageSpec.parse(package, kit.join(path, "pythonPackageSpec")) if package else None,
            DiskSpec.parse(disk, kit.join(path, "diskSpec")) if disk is not None else None,
        )
        try:
            pool.processes_per_replica()
        except ValidationError as exc:
            where = "containerSpec" if container else "pythonPackageSpec"
            raise ValidationError(kit.join(path, where) + "." + exc.path, exc.reason) from None
        return pool

    @property
    def image_uri(self) -> str:
        """The pool's image: the container's, or the package's executor image."""
        if self.container_spec is not None:
            return self.container_spec.image_uri
        assert self.python_package_spec is not None
        return self.python_package_spec.executor_image_uri

    def processes_per_replica(self) -> int:
        """Processes each replica runs (``images.processes_per_replica``)."""
        c, p = self.container_spec, self.python_package_spec
        env = dict(c.env if c is not None else p.env if p is not None else ())
        return images.processes_per_replica(self.machine_spec.accelerator_count, env)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"machineSpec": self.machine_spec.to_dict(),
                               "replicaCount": self.replica_count}
        if self.container_spec:
            out["containerSpec"] = self.container_spec.to_dict()
        if self.python_package_spec:
            out["pythonPackageSpec"] = self.python_package_spec.to_dict()
        if self.disk_spec:
            out["diskSpec"] = self.disk_spec.to_dict()
        return out


@dataclass(frozen=True)
class Scheduling:
    timeout_s: float | None = None
    restart_job_on_worker_restart: bool = False
    partition: str | None = None  # mtc extension: which cluster partition to run in
    priority: int = 0  # mtc extension: higher runs first
    max_restarts: int = 100  # mtc extension: give up after this many interruptions
    strategy: str = ""  # the provisioning strategy asked for (ON_DEMAND, SPOT, ...), recorded

    @classmethod
    def parse(cls, value: Any, path: str) -> Scheduling:
        data = _obj(value, path)
        timeout = kit.string(data, "timeout", path, required=False)
        restart = kit.field(data, "restartJobOnWorkerRestart", path, bool, required=False)
        partition = _id(data, "partition", path, required=False)
        priority = kit.int_field(data, "priority", path, required=False, minimum=-1000, maximum=1000)
        max_restarts = kit.int_field(data, "maxRestarts", path, required=False, minimum=0, default=100)
        strategy = kit.string(data, "strategy", path, required=False) or ""
        return cls(
            _duration_s(timeout, kit.join(path, "timeout")) if timeout else None,
            bool(restart), partition, priority, max_restarts, strategy,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"restartJobOnWorkerRestart": self.restart_job_on_worker_restart,
                               "priority": self.priority, "maxRestarts": self.max_restarts}
        if self.timeout_s is not None:
            out["timeout"] = f"{self.timeout_s:g}s"
        if self.partition:
            out["partition"] = self.partition
        if self.strategy:
            out["strategy"] = self.strategy
        return out


@dataclass(frozen=True)
class CustomJobSpec:
    display_name: str
    worker_pool_specs: tuple[WorkerPoolSpec, ...]
    scheduling: Scheduling = Scheduling()
    base_output_directory: str | None = None
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, value: Any) -> CustomJobSpec:
        data = _obj(value, "")
        name = kit.string(data, "displayName", "")
        job_spec = _obj(kit.field(data, "jobSpec", "", dict, required=True), "jobSpec")
        pools = kit.list_field(job_spec, "workerPoolSpecs", "jobSpec", WorkerPoolSpec.parse)
        sched_raw = kit.field(job_spec, "scheduling", "jobSpec", dict, required=False)
        scheduling = Scheduling.parse(sched_raw, "jobSpec.scheduling") if sched_raw else Scheduling()
        out_dir = kit.field(job_spec, "baseOutputDirectory", "jobSpec", dict, required=False)
        uri = kit.string(out_dir, "outputUriPrefix", "jobSpec.baseOutputDirectory") if out_dir else None
        labels = _labels(kit.field(data, "labels", "", dict, required=False) or {}, "labels")
        assert name is not None
        return cls(name, pools, scheduling, uri, labels)

    @property
    def replica_count(self) -> int:
        return sum(p.replica_count for p in self.worker_pool_specs)

    def to_dict(self) -> dict[str, Any]:
        job_spec: dict[str, Any] = {
            "workerPoolSpecs": [p.to_dict() for p in self.worker_pool_specs],
            "scheduling": self.scheduling.to_dict(),
        }
        if self.base_output_directory:
            job_spec["baseOutputDirectory"] = {"outputUriPrefix": self.base_output_directory}
        out: dict[str, Any] = {"displayName": self.display_name, "jobSpec": job_spec}
        if self.labels:
            out["labels"] = dict(self.labels)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CustomJobSpec:
        return cls.parse(d)


LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")


def _labels(value: Mapping[str, Any], path: str) -> tuple[tuple[str, str], ...]:
    """Labels as Google Cloud allows them: lowercase keys and values, at most 64 pairs."""
    if len(value) > 64:
        raise ValidationError(path, f"at most 64 labels, got {len(value)}")
    out = []
    for key, val in sorted(value.items()):
        if not LABEL_KEY.match(key):
            raise ValidationError(f"{path}.{key}", "a label key is 1-63 lowercase letters, "
                                  "digits, '_' or '-', starting with a letter")
        if not isinstance(val, str) or not LABEL_VALUE.match(val):
            raise ValidationError(f"{path}.{key}", "a label value is 0-63 lowercase letters, "
                                  "digits, '_' or '-'")
        out.append((key, val))
    return tuple(out)
