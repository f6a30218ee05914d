"""Serving replicas as jobs: what a deployed model runs on the cluster.

A replica of a deployed model is a one-rank job on the cluster (``replica_body``), submitted
through job submission's command like any job, so it is queued, placed (a node serving one
replica), sandboxed, watched and healed like a training rank: a health fault on its node
drains the node and the job's recovery starts the replica on a healthy one before the node
is repaired. Its program follows Vertex AI's serving-container contract: it listens on
``AIP_HTTP_PORT`` and answers ``AIP_HEALTH_ROUTE`` and ``AIP_PREDICT_ROUTE``, the model at
``AIP_STORAGE_URI`` (https://cloud.google.com/vertex-ai/docs/predictions/custom-container-requirements).

The program is the model's own container command when it has one; a prebuilt PyTorch
prediction image (``PREBUILT``) maps to mtc's local serving runtime
(``mtc_program.torch_serving``, see docs/inference.md).
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shared.domain.errors import ValidationError
from shared.domain.model import Cluster, NodeState
from shared.policies.serving import PoolOffer, Wanted, choose_pool
from shared.service_layer.gangs import local_output_dir

# Vertex's prebuilt PyTorch prediction images (us-, europe-, asia- registries; cpu and gpu;
# any version tag): https://cloud.google.com/vertex-ai/docs/predictions/pre-built-containers
PREBUILT = re.compile(r"^(?:[a-z]+-)?docker\.pkg\.dev/vertex-ai(?:-restricted)?/prediction/"
                      r"pytorch-(?:cpu|gpu)\.\d+-\d+(?::[\w.-]+)?$")
# run as a script by its path: it imports nothing of mtc, so no PYTHONPATH is needed
RUNTIME = Path(__file__).resolve().parents[1] / "sdk" / "mtc_program" / "torch_serving.py"
MAX_MODEL_FILES = 1000
SERVING_RESTARTS = 1000  # a replica is restarted as long as it is deployed
OUT_OF_SERVICE = frozenset({NodeState.FAILED, NodeState.RETIRED, NodeState.PROVISIONING})


def default_routes(endpoint_id: str, deployed_id: str) -> tuple[str, str]:
    """Vertex's defaults for a custom container: the health and predict routes."""
    base = f"/v1/endpoints/{endpoint_id}/deployedModels/{deployed_id}"
    return base, f"{base}:predict"


def prebuilt(image_uri: str) -> bool:
    return bool(PREBUILT.fullmatch(image_uri.strip()))


def program(container: Mapping[str, Any], storage: str = "",
            python: str = sys.executable) -> list[str]:
    """The replica's command: the container's own, else the runtime a prebuilt image maps
    to, naming each file of the model (``storage``) after ``--package``: a sandboxed rank
    sees the files its command names in its job's buckets, read-only, and nothing else
    there; a 400 for an image mtc cannot run by itself."""
    command = list(container.get("command") or [])
    if command:
        return command + list(container.get("args") or [])
    image = str(container.get("imageUri") or "")
    if prebuilt(image):
        files = [a for f in model_files(storage) for a in ("--package", f)]
        return [python, str(RUNTIME), *files, *list(container.get("args") or [])]
    raise ValidationError("model.containerSpec", f"image {image!r} is not a prebuilt PyTorch "
                          "prediction image and the model has no command: mtc runs a "
                          "command on the cluster's nodes and cannot pull and run an image")


def model_files(storage: str) -> list[str]:
    """The files of a model's directory, at most ``MAX_MODEL_FILES``."""
    root = Path(storage) if storage else None
    if root is None or not root.is_dir():
        return []
    return sorted(str(p) for p in root.rglob("*") if p.is_file())[:MAX_MODEL_FILES]


def in_bucket(artifact_uri: str | None) -> bool:
    return bool(artifact_uri and artifact_uri.startswith("gs://"))


def replica_dirs(artifact_uri: str | None, storage: str, output_root: Path, *,
                 endpoint_id: str, deployed_id: str, index: int, job_id: str
                 ) -> tuple[str | None, str]:
    """A replica's output directory (None: the default one) and its ``AIP_STORAGE_URI``.

    A model in a bucket (``gs://B/...``) is read where it is: the replica's output goes
    beside it in the same bucket, so the model's files its command names are its job's own.
    A model anywhere else (a job's local model directory) is copied into the replica's own
    model directory first, as Vertex copies a model for its container: a sandboxed replica
    reads nothing of another job's outputs, and owns its copy."""
    if in_bucket(artifact_uri):
        assert artifact_uri is not None
        bucket = artifact_uri.removeprefix("gs://").split("/", 1)[0]
        return f"gs://{bucket}/mtc-serving/{endpoint_id}/{deployed_id}/replica-{index}", storage
    if not storage or not Path(storage).is_dir():
        return None, storage
    base = output_root.absolute() / "serving" / job_id
    shutil.copytree(storage, base / "model", dirs_exist_ok=True, symlinks=False)
    return str(base), str(base / "model")


def storage_path(artifact_uri: str | None, output_root: Path) -> str:
    """``AIP_STORAGE_URI`` as the replica reads it: the artifact's directory on the node
    (``gs://B/P`` is ``<output root>/gcs/B/P``, as a job's outputs are)."""
    if not artifact_uri:
        return ""
    return local_output_dir(artifact_uri, output_root, "")


def offers_of(clusters: Sequence[Cluster], in_service: Mapping[tuple[str, str], int]
              ) -> list[PoolOffer]:
    """Every (cluster, partition, pool machine) a replica could run on; ``in_service``: the
    nodes in service per (cluster, pool)."""
    out = []
    for cluster in clusters:
        pools = {p.pool_id: p for p in cluster.spec.node_pools}
        for partition in cluster.spec.partitions:
            for pool_id in partition.node_pool_ids:
                pool = pools.get(pool_id)
                if pool is None:
                    continue
                m = pool.machine_spec
                out.append(PoolOffer(cluster.cluster_id, cluster.created_at, partition.name,
                                     m.machine_type, m.accelerator_type, m.accelerator_count,
                                     in_service.get((cluster.cluster_id, pool_id), 0)))
    return out


def place(uow: Any, clusters: Sequence[Cluster], wanted: Wanted) -> PoolOffer:
    """The pool a deployed model's replicas run on, or a 400 saying what was wanted."""
    counts: dict[tuple[str, str], int] = {}
    for cluster in clusters:
        for node in uow.nodes.list(cluster.cluster_id):
            if node.state not in OUT_OF_SERVICE and not node.is_spare:
                counts[(cluster.cluster_id, node.pool)] = counts.get(
                    (cluster.cluster_id, node.pool), 0) + 1
    chosen = choose_pool(offers_of(clusters, counts), wanted)
    if chosen is None:
        where = f" in cluster {wanted.cluster_id}" if wanted.cluster_id else ""
        where += f" partition {wanted.partition}" if wanted.partition else ""
        raise ValidationError("deployedModel.dedicatedResources.machineSpec",
                              f"no partition{where} offers machine type "
                              f"{wanted.machine_type!r}"
                              + (f" with {wanted.accelerator_count} x "
                                 f"{wanted.accelerator_type}" if wanted.accelerator_type else ""))
    return chosen


def replica_body(*, display_name: str, command: Sequence[str], env: Mapping[str, str],
                 pool: PoolOffer, labels: Mapping[str, str], output: str | None
                 ) -> dict[str, Any]:
    """The job body of one serving replica: one rank on the chosen partition's machine,
    restarted as long as it is deployed, never timed out; ``output``: its output directory
    (in the model's bucket, so the files of the model its command names are its own)."""
    machine: dict[str, Any] = {"machineType": pool.machine_type}
    if pool.accelerator_type:
        machine.update(acceleratorType=pool.accelerator_type,
                       acceleratorCount=pool.accelerator_count)
    return {
        "displayName": display_name[:128],
        "jobSpec": {
            "workerPoolSpecs": [{
                "machineSpec": machine, "replicaCount": 1,
                "containerSpec": {"imageUri": "local", "command": list(command),
                                  "env": [{"name": k, "value": v} for k, v in env.items()]},
            }],
            "scheduling": {"partition": pool.partition, "maxRestarts": SERVING_RESTARTS},
            **({"baseOutputDirectory": {"outputUriPrefix": output}} if output else {}),
        },
        "labels": dict(labels),
    }
