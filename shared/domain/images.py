"""Vertex AI's prebuilt training containers, and the local runtime each one maps to (data).

Vertex documents prebuilt training images for PyTorch, TensorFlow, scikit-learn and XGBoost
(https://cloud.google.com/vertex-ai/docs/training/pre-built-containers), named
``<region>-docker.pkg.dev/vertex-ai/training/<framework>-<cpu|gpu|tpu|xla>.<version>.<py>:<tag>``.
mtc runs no images: on the embedded default and on Slurm a prebuilt image stands for a local
*runtime*, a virtualenv that has the framework (``shared.adapters.runtimes``). Here the one
torch is the installed 2.13 CPU build, so every PyTorch URI, whatever version it names, maps to
it (``framework_version`` of the runtime says which one that is; the URI's version is recorded
in ``asked``). An image under ``vertex-ai/training/`` that is not in this table is refused (a
400 naming the field); any other image is a custom container, run as the command it gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mtc_program.protocol import PROCESSES_PER_NODE
from shared.domain.errors import ValidationError

PREBUILT_RE = re.compile(
    r"^(?:(?:us|europe|asia)-docker\.pkg\.dev)/vertex-ai/training/"
    r"(?P<name>[a-z0-9][a-z0-9._-]*?)(?::(?P<tag>[A-Za-z0-9._-]+))?$")


@dataclass(frozen=True)
class Runtime:
    """What a prebuilt image maps to: the local runtime (``runtime``: its cache name, the
    framework modules it must import) and the accelerator the image is built for."""

    runtime: str
    framework: str  # the module the runtime must provide (torch)
    accelerator: str  # cpu, gpu or xla (every one runs its program once per replica)


# family (the image name without its version) -> runtime. The versions Vertex lists
# (pytorch-gpu.2-4.py310, pytorch-cpu.2-1.py310, ...) all map to the family's runtime.
PREBUILT: dict[str, Runtime] = {
    "pytorch-cpu": Runtime("pytorch", "torch", "cpu"),
    "pytorch-gpu": Runtime("pytorch", "torch", "gpu"),
    "pytorch-xla": Runtime("pytorch", "torch", "xla"),
    "pytorch-tpu": Runtime("pytorch", "torch", "xla"),
    # sklearn-cpu and xgboost-cpu would be Runtime("sklearn", "sklearn", "cpu") and
    # Runtime("xgboost", "xgboost", "cpu"), but neither package is installed on these machines
}
# the version part Vertex uses: 2-4, 1-13, 2-4.py310 (framework version, then Python)
VERSION_RE = re.compile(r"^(?P<family>[a-z]+-[a-z]+)\.(?P<version>\d+-\d+)(?:\.py\d+)?$")


def prebuilt(uri: str) -> tuple[Runtime, str] | None:
    """The runtime a prebuilt image maps to and the framework version it names; None for a
    custom image. ValueError for an image under ``vertex-ai/training/`` mtc does not know."""
    m = PREBUILT_RE.match(uri)
    if m is None:
        return None
    v = VERSION_RE.match(m.group("name"))
    runtime = PREBUILT.get(v.group("family")) if v else None
    if v is None or runtime is None:
        known = ", ".join(f"{k}.<version>" for k in PREBUILT)
        raise ValueError(f"{uri!r} is not a prebuilt training image mtc maps to a local "
                         f"runtime (known: {known}; see docs/pytorch.md)")
    return runtime, v.group("version").replace("-", ".")


def check_image(uri: str, path: str) -> None:
    """A 400 naming ``path`` for an unknown prebuilt image (see the module)."""
    try:
        prebuilt(uri)
    except ValueError as exc:
        raise ValidationError(path, str(exc)) from None


def processes_per_replica(accelerator_count: int, env: dict[str, str]) -> int:
    """How many processes a replica runs (docs/pytorch.md): one, as Vertex starts a replica's
    program once whatever the image, so ``RANK`` and ``WORLD_SIZE`` count replicas; several
    only when the pool's env asks with ``MTC_PROCESSES_PER_NODE``: a number, or ``gpu`` for
    one per accelerator (``machineSpec.acceleratorCount``, as ``torchrun
    --nproc-per-node=gpu``)."""
    asked = env.get(PROCESSES_PER_NODE, "")
    if not asked:
        return 1
    if asked == "gpu":
        if accelerator_count < 1:
            raise ValidationError(f"env.{PROCESSES_PER_NODE}",
                                  "is 'gpu' but machineSpec.acceleratorCount is not set")
        return accelerator_count
    if not asked.isdigit() or not 1 <= int(asked) <= 64:
        raise ValidationError(f"env.{PROCESSES_PER_NODE}", f"must be 1-64 or 'gpu', got {asked!r}")
    return int(asked)
