"""What a worker pool's replicas run: its command and environment (docs/pytorch.md).

* **Custom container** (``containerSpec`` on any image not under ``vertex-ai/training/``): the
  command runs as a process on the node, without the image (there is no container runtime).
* **Prebuilt image** (``shared.domain.images``): the command, or ``python -m pythonModule``
  for a ``pythonPackageSpec``, runs under ``pyenv``, which sets up the image's local runtime
  and the job's packages (``packageUris``) on the node first.
* **Custom executor image with a pythonPackageSpec**: the workers' own Python (mtc's) is the
  runtime; the packages, if any, are installed over it the same way.
* **Several processes per replica** (``WorkerPoolSpec.processes_per_replica``): the program
  runs under ``torch_node`` (``torch.distributed.run`` per node).

Pure: paths are computed, nothing is touched; the node does the work when the gang starts.
"""

from __future__ import annotations

from pathlib import Path

from shared.domain import images
from shared.domain.errors import ValidationError
from shared.domain.specs import WorkerPoolSpec
from shared.handling import Deps
from shared.launch import PYENV, TORCH_NODE

Command = tuple[tuple[str, ...], tuple[tuple[str, str], ...]]
DEFAULT_RUNTIME = images.Runtime("python", "sys", "cpu")  # mtc's workers' own interpreter


def runtime_cache(deps: Deps) -> Path:
    """Where runtimes and package environments are cached: beside the job outputs, under the
    state directory (``<state>/jobs`` -> ``<state>/runtimes``)."""
    return deps.config.output_root.parent / "runtimes"


def gcs_bucket(uri: str) -> str | None:
    """The bucket of a ``gs://BUCKET/PATH`` URI, as ``package_path`` reads it; None: not one."""
    if not uri.startswith("gs://"):
        return None
    parts = [p for p in uri.removeprefix("gs://").split("/") if p not in ("", ".", "..")]
    return parts[0] if parts else None


def package_path(uri: str, deps: Deps) -> str:
    """A package URI as a file on the node: ``gs://B/P`` is ``<output root>/gcs/B/P`` (the
    stand-in for Cloud Storage, as for outputs); ``file://`` and plain paths as they are."""
    if uri.startswith("gs://"):
        parts = [p for p in uri.removeprefix("gs://").split("/") if p not in ("", ".", "..")]
        return str(deps.config.output_root.joinpath("gcs", *parts))
    return uri.removeprefix("file://")


def pool_command(pool: WorkerPoolSpec, deps: Deps) -> Command:
    """The pool's command and env (see the module)."""
    nproc = pool.processes_per_replica()
    found = images.prebuilt(pool.image_uri)
    c, p = pool.container_spec, pool.python_package_spec
    if c is not None:
        command = c.command + c.args
        if not command:
            raise ValidationError("containerSpec.command", "is required to run without an image")
        if found is None:
            return _maybe_torch_node(deps.config.python, command, nproc), c.env
        return _pyenv(found[0], (), command, nproc, deps), c.env
    assert p is not None
    module = ("-m", p.python_module, *p.args)
    if found is None and not p.package_uris:
        return _maybe_torch_node(deps.config.python, (deps.config.python, *module), nproc), p.env
    packages = tuple(package_path(u, deps) for u in p.package_uris)
    return _pyenv(found[0] if found else DEFAULT_RUNTIME, packages, module, nproc, deps), p.env


def _maybe_torch_node(python: str, command: tuple[str, ...], nproc: int) -> tuple[str, ...]:
    if nproc <= 1:
        return command
    return (python, str(TORCH_NODE), "--nproc-per-node", str(nproc), "--", *command)


def _pyenv(rt: images.Runtime, packages: tuple[str, ...], command: tuple[str, ...], nproc: int,
           deps: Deps) -> tuple[str, ...]:
    opts = ["--cache", str(runtime_cache(deps)), "--runtime", rt.runtime,
            "--framework", rt.framework, "--nproc-per-node", str(nproc)]
    for package in packages:
        opts += ["--package", package]
    return (deps.config.python, str(PYENV), *opts, "--", *command)
