"""The tiers' settings: where each tier is and how often it saves, read from the managed
environment's variables (``mtc_program.protocol``), with the program's defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mtc_program import protocol as n
from mtc_program.env import env_int as _int


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    try:
        value = float(raw) if raw else default
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, got {raw!r}")
    return value


def _path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name, "").strip()
    return Path(raw) if raw else None


@dataclass(frozen=True)
class TierSettings:
    """Where the tiers are and how often each saves (0: never)."""

    rank: int
    world_size: int
    durable_dir: Path
    tier1_dir: Path | None = None
    tier2_dir: Path | None = None
    tier2_source_dir: Path | None = None
    tier2_url: str = ""  # the buddy's peer store (then tier2_dir is not written)
    tier2_source_url: str = ""
    tier2_token: str = ""
    # how long a restore waits for the previous buddy's service to answer: it is started by
    # the buddy's own task of the same attempt, which a loaded node may launch seconds later
    tier2_wait_s: float = 30.0
    tier1_every: int = 0
    tier2_every: int = 0
    tier3_every: int = 0
    keep: int = 3
    durable_keep: int = 0  # 0: keep every durable checkpoint (as programs did before tiers)
    progress_file: Path | None = None
    progress_interval_s: float = 5.0
    replicated: bool = True
    attempt: int | None = None
    restore_timeout_s: float = 120.0
    skip: tuple[str, ...] = ()  # tiers not to restore from (never durable)

    @property
    def tiered(self) -> bool:
        return self.tier1_dir is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, durable_dir: Path, rank: int, world_size: int,
                 tier1_every: int = 10, tier3_every: int = 100,
                 replicated: bool = True) -> TierSettings:
        """The settings the managed environment gives; the keyword values are the
        program's defaults, the ``MTC_TIER*_EVERY`` variables override them. No
        ``MTC_TIER1_DIR``: durable only, every ``tier3_every`` steps."""
        t1 = _path(env, n.TIER1_DIR)
        every1 = _int(env, n.TIER1_EVERY, tier1_every) if t1 else 0
        t2 = _path(env, n.TIER2_DIR) if t1 else None
        url = env.get(n.TIER2_URL, "").strip() if t1 else ""
        attempt_raw = env.get(n.JOB_ATTEMPT, "").strip()
        return cls(
            rank=rank, world_size=world_size, durable_dir=durable_dir,
            tier1_dir=t1, tier2_dir=t2,
            tier2_source_dir=(_path(env, n.TIER2_SOURCE_DIR) or t2) if t1 else None,
            tier2_url=url, tier2_source_url=env.get(n.TIER2_SOURCE_URL, "").strip() or url,
            tier2_token=env.get(n.TIER2_TOKEN, "").strip(),
            tier1_every=every1,
            tier2_every=_int(env, n.TIER2_EVERY, every1) if t2 or url else 0,
            tier3_every=_int(env, n.TIER3_EVERY, tier3_every),
            keep=_int(env, n.TIER_KEEP, 3, 1),
            durable_keep=_int(env, n.TIER3_KEEP, 0),
            progress_file=_path(env, n.PROGRESS_FILE),
            progress_interval_s=_float(env, n.PROGRESS_INTERVAL_S, 5.0),
            replicated=replicated,
            attempt=int(attempt_raw) if attempt_raw.isdigit() else None,
            restore_timeout_s=float(_int(env, n.RESTORE_TIMEOUT_S, 120, 1)),
            skip=skipped(env),
        )


def skipped(env: Mapping[str, str]) -> tuple[str, ...]:
    """The near tiers ``MTC_RESTORE_SKIP`` rules out (unknown names ignored: the durable
    tier is the last resort and is never skipped)."""
    named = {t.strip() for t in env.get(n.RESTORE_SKIP, "").split(",")}
    return tuple(t for t in (n.MEMORY, n.PEER) if t in named)
