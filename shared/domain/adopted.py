"""Jobs mtc adopts rather than submits: a user's own ``sbatch`` in a partition mtc manages.

Such a job is a CustomJob-shaped record so the job view, checkpoint-resume and goodput treat it
like any other; its labels say where it came from (``mtc-origin: slurm``, the Slurm job id and
user). The origin is set by mtc only: a CustomJob submitted through the API may not carry it.
Slurm, not mtc, places an adopted job, so scheduling leaves it alone; mtc checkpoints and
requeues it when a node under it fails.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from shared.domain.specs import CustomJobSpec

ORIGIN_LABEL = "mtc-origin"
SLURM_ORIGIN = "slurm"
SLURM_JOB_LABEL = "mtc-slurm-job-id"
SLURM_USER_LABEL = "mtc-slurm-user"
RESERVED_LABELS = frozenset({ORIGIN_LABEL, SLURM_JOB_LABEL, SLURM_USER_LABEL})
ADOPTED_IMAGE = "slurm-batch-script"  # no container: the user's batch script runs as is


def adopted_job_id(slurm_job_id: int) -> str:
    return f"slurm-{int(slurm_job_id)}"


def may_be_adopted(job_id: str) -> bool:
    """Whether ``job_id`` has the shape ``adopted_job_id`` gives."""
    return _ADOPTED_ID.fullmatch(job_id) is not None


_ADOPTED_ID = re.compile(r"slurm-[0-9]+")


def origin(spec: CustomJobSpec) -> str:
    """"slurm" for an adopted job, "" for one submitted through mtc."""
    return dict(spec.labels).get(ORIGIN_LABEL, "")


def adopted(spec: CustomJobSpec) -> bool:
    return origin(spec) == SLURM_ORIGIN


def _label_value(text: str) -> str:
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def adopted_spec(*, name: str, slurm_job_id: int, user: str, command: str, machine_type: str,
                 replicas: int) -> CustomJobSpec:
    """The CustomJob spec an adopted job is shown with: one pool, one replica per node, the
    batch script as its command, the origin labels."""
    command_args: Sequence[str] = [command[:4096]] if command.strip() else []
    return CustomJobSpec.parse({
        "displayName": (name.strip() or adopted_job_id(slurm_job_id))[:128],
        "jobSpec": {"workerPoolSpecs": [{
            "machineSpec": {"machineType": machine_type},
            "replicaCount": max(1, replicas),
            "containerSpec": {"imageUri": ADOPTED_IMAGE, "command": list(command_args)},
        }]},
        "labels": {ORIGIN_LABEL: SLURM_ORIGIN, SLURM_JOB_LABEL: str(int(slurm_job_id)),
                   SLURM_USER_LABEL: _label_value(user)},
    })
