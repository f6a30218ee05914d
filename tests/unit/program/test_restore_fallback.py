"""A restore checks every near-tier entry before use and falls back tier by tier (memory,
then the peer copy, then durable) for the same step, saying in the heartbeat which tier it
used, which entry failed and why; ``MTC_RESTORE_SKIP`` keeps it off the tiers named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mtc_program import entries
from mtc_program import protocol as n
from mtc_program.tiers import TieredCheckpointer, TierSettings

STEP = 20  # every tier holds it: memory and peer every 5, durable every 20


def state(step: int) -> dict[str, np.ndarray | bytes]:
    return {"w": np.full(4, float(step)), "rng": f"rng-{step}".encode()}


def settings(root: Path, **kw: object) -> TierSettings:
    base: dict[str, object] = dict(
        rank=0, world_size=1, durable_dir=root / "durable",
        tier1_dir=root / "n0" / "job" / "rank-0", tier2_dir=root / "n1" / "job" / "peer" / "rank-0",
        tier1_every=5, tier2_every=5, tier3_every=20, replicated=True,
        progress_file=root / "progress" / "rank-0.json", progress_interval_s=0.0)
    base.update(kw)
    return TierSettings(**base)  # type: ignore[arg-type]


def saved(root: Path, **kw: object) -> TierSettings:
    s = settings(root, **kw)
    cp = TieredCheckpointer(s, log=lambda _: None)
    for step in range(1, STEP + 1):
        cp.maybe_save(step, state(step))
    cp.close()
    return s


def corrupt(directory: Path | None) -> None:
    """Flip a byte of the step's payload: its manifest still parses, its hash no longer holds."""
    assert directory is not None
    payload = directory / n.entry_name(STEP) / n.PAYLOAD
    data = bytearray(payload.read_bytes())
    data[len(data) // 2] ^= 0xFF
    payload.write_bytes(bytes(data))


def restore(s: TierSettings) -> tuple[int, str, dict[str, object]]:
    lines: list[str] = []
    restored = TieredCheckpointer(s, log=lines.append).restore()
    assert restored is not None and restored.step == STEP
    w = restored.state["w"]
    assert isinstance(w, np.ndarray) and w.tolist() == [float(STEP)] * 4  # the right state
    assert s.progress_file is not None
    beat = json.loads(s.progress_file.read_text())
    return restored.step, restored.tier, beat["restore"]


def test_a_corrupted_memory_entry_falls_back_to_the_peer_copy(tmp_path: Path) -> None:
    s = saved(tmp_path)
    corrupt(s.tier1_dir)
    _step, tier, said = restore(s)
    assert tier == "peer"
    assert said["step"] == STEP and said["tier"] == "peer"
    assert said["failed"] == [{"tier": "memory", "step": STEP,
                               "why": "sha256 does not match its manifest"}]


def test_memory_and_peer_both_corrupted_fall_back_to_durable(tmp_path: Path) -> None:
    s = saved(tmp_path)
    corrupt(s.tier1_dir)
    corrupt(s.tier2_dir)
    _step, tier, said = restore(s)
    assert tier == "durable" and said["tier"] == "durable"
    assert [(f["tier"], f["step"]) for f in said["failed"]] == [("memory", STEP), ("peer", STEP)]


def test_a_truncated_entry_says_its_size(tmp_path: Path) -> None:
    s = saved(tmp_path)
    assert s.tier1_dir is not None
    payload = s.tier1_dir / n.entry_name(STEP) / n.PAYLOAD
    payload.write_bytes(payload.read_bytes()[:100])
    _, tier, said = restore(s)
    assert tier == "peer" and "100 bytes where its manifest says" in str(said["failed"])


def test_tiers_the_control_plane_skips_are_not_read(tmp_path: Path) -> None:
    """Whole entries, yet the restarts that read them made no progress: not read again."""
    s = saved(tmp_path)
    env = {n.TIER1_DIR: str(s.tier1_dir), n.TIER2_DIR: str(s.tier2_dir),
           n.RESTORE_SKIP: "memory"}
    skip_memory = TierSettings.from_env(env, durable_dir=s.durable_dir, rank=0, world_size=1)
    assert skip_memory.skip == ("memory",)
    _, tier, said = restore(settings(tmp_path, skip=skip_memory.skip))
    assert tier == "peer" and said["skipped"] == ["memory"] and said["failed"] == []
    _, tier, said = restore(settings(tmp_path, skip=("memory", "peer")))
    assert tier == "durable" and said["skipped"] == ["memory", "peer"]


def test_durable_is_never_skipped(tmp_path: Path) -> None:
    env = {n.TIER1_DIR: str(tmp_path / "m"), n.RESTORE_SKIP: "durable, peer ,bogus"}
    s = TierSettings.from_env(env, durable_dir=tmp_path / "d", rank=0, world_size=1)
    assert s.skip == ("peer",)


def test_check_names_what_is_wrong(tmp_path: Path) -> None:
    s = saved(tmp_path)
    assert s.tier1_dir is not None
    [newest, *_] = entries.list_entries(s.tier1_dir, "memory")
    assert entries.check(newest)[1] == ""
    newest.path.unlink()
    payload, why = entries.check(newest)
    assert payload is None and why.startswith("unreadable")
