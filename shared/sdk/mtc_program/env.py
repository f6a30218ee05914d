"""The managed environment read and checked once (standard library only): what the control
plane, ``torchrun`` or Vertex AI gives a rank (``mtc_program.protocol`` names it all).

``ManagedEnv.read`` checks every value and raises ``ConfigError`` naming the variable (a
program exits ``ExitCode.CONFIG`` with that line rather than a traceback). ``CLUSTER_SPEC``'s
``task.index`` counts within its worker pool, so the rank it implies adds the sizes of the
pools before it (``RANK`` counts across pools, pool after pool); ``RANK`` and the spec must
agree. A ``gs://`` directory (Vertex's, and mtc's in its sandbox) is read as its file path
under ``/gcs/`` (``protocol.local_path``). Outside a managed environment (run by hand) the
directories fall back to ``<output>/checkpoints`` and ``<output>/model``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtc_program import protocol as p


class ConfigError(ValueError):
    """A garbage variable (or flag): the message names it."""


def env_int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    """``env[name]`` as an integer >= ``minimum``; ``default`` when unset or blank."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {raw!r}")
    return value


def _spec(env: Mapping[str, str]) -> tuple[dict[str, Any] | None, int | None]:
    """``CLUSTER_SPEC`` parsed, and the global rank its task implies (None: no task)."""
    raw = env.get(p.CLUSTER_SPEC, "").strip()
    if not raw:
        return None, None
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p.CLUSTER_SPEC} is not valid JSON: {exc}") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{p.CLUSTER_SPEC} must be a JSON object")
    if "task" not in spec:
        return spec, None
    task = spec["task"]
    index = task.get("index") if isinstance(task, dict) else None
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ConfigError(f"{p.CLUSTER_SPEC} task.index must be an integer >= 0, got {index!r}")
    pool = re.fullmatch(r"workerpool(\d+)", str(task.get("type", "workerpool0")))
    cluster = spec.get("cluster")
    pools: dict[str, Any] = cluster if isinstance(cluster, dict) else {}
    before = [pools.get(f"workerpool{i}") for i in range(int(pool[1]) if pool else 0)]
    return spec, index + sum(len(b) for b in before if isinstance(b, list))


@dataclass(frozen=True)
class ManagedEnv:
    job_id: str
    rank: int
    world_size: int
    master_addr: str
    master_port: int | None
    cluster_spec: dict[str, Any] | None
    checkpoint_dir: Path
    model_dir: Path
    tensorboard_dir: Path | None
    attempt: int | None  # MTC_JOB_ATTEMPT: 1, 2, ... (None: run by hand)

    @property
    def chief(self) -> bool:
        return self.rank == 0

    @classmethod
    def read(cls, env: Mapping[str, str], output: Path = Path("out")) -> ManagedEnv:
        """Read and check what the managed service put in ``env`` (see the module)."""
        spec, spec_rank = _spec(env)
        rank = env_int(env, p.RANK, spec_rank if spec_rank is not None else 0)
        if spec_rank is not None and rank != spec_rank:
            raise ConfigError(f"{p.RANK}={rank} disagrees with {p.CLUSTER_SPEC} "
                              f"task.index={spec_rank}")
        world_size = env_int(env, p.WORLD_SIZE, 1, 1)
        if rank >= world_size:
            raise ConfigError(f"{p.RANK}={rank} must be smaller than {p.WORLD_SIZE}={world_size}")
        port_raw = env.get(p.MASTER_PORT, "").strip()
        port = env_int(env, p.MASTER_PORT, 0, 1) if port_raw else None
        if port is not None and port > 65535:
            raise ConfigError(f"{p.MASTER_PORT} must be a port number (1-65535), got {port_raw!r}")
        ckpt, model, tb = (p.local_path(env.get(n, "").strip()) for n in p.JOB_DIRS)
        attempt = env_int(env, p.JOB_ATTEMPT, 0, 1) if env.get(p.JOB_ATTEMPT, "").strip() else None
        return cls(
            job_id=env.get(p.JOB_ID, "") or "local", rank=rank, world_size=world_size,
            master_addr=env.get(p.MASTER_ADDR, "127.0.0.1"), master_port=port, cluster_spec=spec,
            checkpoint_dir=Path(ckpt or output / "checkpoints"),
            model_dir=Path(model or output / "model"),
            tensorboard_dir=Path(tb) if tb else None, attempt=attempt)
