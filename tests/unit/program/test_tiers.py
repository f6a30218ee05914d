"""mtc_program.tiers as a library: where each tier's entry goes, what a torn entry is,
the consistent cut, a lost node, retention, the heartbeat and the background writer."""

from __future__ import annotations

import json
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from mtc_program import entries
from mtc_program.tiers import Restored, TieredCheckpointer, TierSettings


def state(step: int) -> dict[str, np.ndarray | bytes]:
    return {"w": np.arange(6, dtype=np.float64).reshape(2, 3) * step, "rng": f"rng-{step}".encode()}


def settings(root: Path, rank: int = 0, world: int = 1, **kw: object) -> TierSettings:
    """Rank ``rank`` on node ``n<rank>``; its buddy (rank+1) % world on the next node."""
    buddy = (rank + 1) % world
    base: dict[str, object] = dict(
        rank=rank, world_size=world, durable_dir=root / "durable",
        tier1_dir=root / f"n{rank}" / "job" / f"rank-{rank}",
        tier2_dir=root / f"n{buddy}" / "job" / "peer" / f"rank-{rank}",
        tier1_every=5, tier2_every=5, tier3_every=20, replicated=False,
        attempt=2 if world > 1 else None, restore_timeout_s=10.0)
    base.update(kw)
    return TierSettings(**base)  # type: ignore[arg-type]


def run_steps(cp: TieredCheckpointer, last: int) -> None:
    for step in range(1, last + 1):
        cp.maybe_save(step, state(step))
    cp.close()


def assert_state(restored: Restored | None, step: int) -> None:
    assert restored is not None and restored.step == step
    want = state(step)
    assert restored.state["rng"] == want["rng"]
    got = restored.state["w"]
    assert isinstance(got, np.ndarray) and got.tobytes() == np.asarray(want["w"]).tobytes()


def restore_all(all_settings: list[TierSettings]) -> list[Restored | None]:
    """Every rank restores at once, as the ranks of a gang do (they agree through files)."""
    with ThreadPoolExecutor(len(all_settings)) as pool:
        return list(pool.map(lambda s: TieredCheckpointer(s, log=lambda _: None).restore(),
                             all_settings))


def test_each_tier_gets_its_entries_in_its_own_format(tmp_path: Path) -> None:
    s = settings(tmp_path)
    run_steps(TieredCheckpointer(s), 20)
    assert [e.step for e in entries.list_entries(s.tier1_dir, "memory")] == [20, 15, 10]  # type: ignore[arg-type]
    assert [e.step for e in entries.list_entries(s.tier2_dir, "peer")] == [20, 15, 10]  # type: ignore[arg-type]
    # durable (sharded): the rank's own entries; replicated: the protocol's ckpt-<step>.npz
    own = tmp_path / "durable" / "ranks" / "rank-0"
    assert [e.step for e in entries.list_entries(own, "durable")] == [20]
    r = settings(tmp_path / "r", replicated=True)
    run_steps(TieredCheckpointer(r), 20)
    assert sorted(p.name for p in (tmp_path / "r" / "durable").iterdir()) == [
        "ckpt-00000020.npz", "ckpt-00000020.npz.manifest.json", "ckpt-00000020.npz.save_s"]


def test_restore_prefers_memory_then_peer_then_durable(tmp_path: Path) -> None:
    s = settings(tmp_path, tier3_every=5)
    run_steps(TieredCheckpointer(s), 12)
    got = TieredCheckpointer(s).restore()
    assert_state(got, 10)
    assert got is not None and got.tier == "memory"
    shutil.rmtree(s.tier1_dir)  # type: ignore[arg-type]
    got = TieredCheckpointer(s).restore()
    assert got is not None and got.tier == "peer"
    shutil.rmtree(s.tier2_dir)  # type: ignore[arg-type]
    got = TieredCheckpointer(s).restore()
    assert_state(got, 10)
    assert got is not None and got.tier == "durable"


def _no_manifest(entry: Path) -> None:
    (entry / entries.MANIFEST).unlink()


def _bad_hash(entry: Path) -> None:
    payload = bytearray((entry / entries.PAYLOAD).read_bytes())
    payload[len(payload) // 2] ^= 0xFF  # same size, other bytes
    (entry / entries.PAYLOAD).write_bytes(bytes(payload))


def _truncated(entry: Path) -> None:
    payload = (entry / entries.PAYLOAD).read_bytes()
    (entry / entries.PAYLOAD).write_bytes(payload[: len(payload) // 2])


@pytest.mark.parametrize("tear", [_no_manifest, _bad_hash, _truncated])
def test_a_torn_entry_is_skipped_for_the_next_whole_one(tmp_path: Path, tear: object) -> None:
    s = settings(tmp_path, tier2_dir=None, tier2_every=0, tier3_every=0)
    run_steps(TieredCheckpointer(s), 15)
    tear(s.tier1_dir / entries.entry_name(15))  # type: ignore[operator]
    got = TieredCheckpointer(s, log=lambda _: None).restore()
    assert_state(got, 10)


def test_a_torn_durable_checkpoint_is_skipped(tmp_path: Path) -> None:
    s = settings(tmp_path, tier1_dir=None, tier2_dir=None, tier1_every=0, tier2_every=0,
                 tier3_every=5, replicated=True)
    run_steps(TieredCheckpointer(s), 10)
    newest = tmp_path / "durable" / "ckpt-00000010.npz"
    newest.write_bytes(newest.read_bytes()[:100])
    assert_state(TieredCheckpointer(s, log=lambda _: None).restore(), 5)


def test_ranks_restore_the_newest_step_all_of_them_hold(tmp_path: Path) -> None:
    ranks = [settings(tmp_path, r, 2, tier3_every=0) for r in range(2)]
    for s in ranks:
        run_steps(TieredCheckpointer(s), 15)
    for d in (ranks[1].tier1_dir, ranks[1].tier2_dir):  # rank 1's step 15 is torn everywhere
        _no_manifest(d / entries.entry_name(15))  # type: ignore[operator]
    got = restore_all(ranks)
    assert [g.step if g else None for g in got] == [10, 10]  # not rank 0's newer 15


def test_a_lost_node_takes_its_memory_and_the_peer_copies_it_held(tmp_path: Path) -> None:
    """Node n0 runs rank 0 and holds rank 1's peer copy (rank 1's buddy is rank 0); losing it
    leaves rank 0's copy on n1 (its buddy's node), so both ranks restore the newest step."""
    ranks = [settings(tmp_path, r, 2, tier3_every=0) for r in range(2)]
    for s in ranks:
        run_steps(TieredCheckpointer(s), 15)
    shutil.rmtree(tmp_path / "n0")  # the node is gone, with its memory
    got = restore_all(ranks)
    assert got[0] is not None and got[0].tier == "peer"
    assert got[1] is not None and got[1].tier == "memory"
    assert_state(got[0], 15)
    assert_state(got[1], 15)


def test_nothing_anywhere_starts_from_scratch(tmp_path: Path) -> None:
    ranks = [settings(tmp_path, r, 2) for r in range(2)]
    assert restore_all(ranks) == [None, None]


def test_retention_is_bounded_on_every_tier(tmp_path: Path) -> None:
    s = settings(tmp_path, keep=2, tier3_every=5, durable_keep=2, replicated=True)
    run_steps(TieredCheckpointer(s), 30)
    for d in (s.tier1_dir, s.tier2_dir):
        assert sorted(p.name for p in d.iterdir()) == [  # type: ignore[union-attr]
            entries.entry_name(25), entries.entry_name(30)]
    assert sorted(p.name for p in (tmp_path / "durable").glob("ckpt-*.npz")) == [
        "ckpt-00000025.npz", "ckpt-00000030.npz"]


def test_a_memory_save_blocks_only_for_the_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``save`` returns before the entry is written (the write waits on a gate only the test
    opens), the writer thread writes it, and it holds the state as it was at ``save``."""
    gate, real = threading.Event(), entries.write_entry
    writers: list[str] = []

    def gated(*args: object, **kw: object) -> Path:
        assert gate.wait(10)
        writers.append(threading.current_thread().name)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(entries, "write_entry", gated)
    s = settings(tmp_path, tier3_every=0)
    cp = TieredCheckpointer(s)
    live = state(5)
    report = cp.save(5, live, ("memory", "peer"))
    assert report.tiers == ("memory", "peer")
    assert not (s.tier1_dir / entries.entry_name(5)).exists()  # type: ignore[operator]
    live["w"][:] = -1.0  # type: ignore[index]  # the program trains on at once
    gate.set()
    cp.close()
    assert writers == ["mtc-tier-writer"] * 2
    assert [(t, st) for t, st, _ in cp.written.writes] == [("memory", 5), ("peer", 5)]
    assert threading.current_thread().name not in writers
    assert_state(TieredCheckpointer(s).restore(), 5)


def test_without_tier_variables_it_is_durable_only(tmp_path: Path) -> None:
    s = TierSettings.from_env({}, durable_dir=tmp_path / "d", rank=0, world_size=1, tier3_every=10)
    assert not s.tiered and (s.tier1_every, s.tier2_every, s.tier3_every) == (0, 0, 10)
    cp = TieredCheckpointer(s)
    assert cp.due(10) == ("durable",) and cp.due(5) == ()
    run_steps(cp, 10)
    assert sorted(p.name for p in (tmp_path / "d").glob("ckpt-*")) == [
        "ckpt-00000010.npz", "ckpt-00000010.npz.manifest.json", "ckpt-00000010.npz.save_s"]


def test_the_environment_sets_the_tiers(tmp_path: Path) -> None:
    env = {"MTC_TIER1_DIR": str(tmp_path / "t1"), "MTC_TIER2_DIR": str(tmp_path / "t2"),
           "MTC_TIER1_EVERY": "4", "MTC_TIER3_EVERY": "40", "MTC_JOB_ATTEMPT": "3"}
    s = TierSettings.from_env(env, durable_dir=tmp_path, rank=1, world_size=2)
    assert (s.tier1_every, s.tier2_every, s.tier3_every, s.attempt) == (4, 4, 40, 3)
    assert s.tier2_source_dir == tmp_path / "t2"  # none given: where this attempt copies to
    with pytest.raises(ValueError, match="MTC_TIER1_EVERY"):
        TierSettings.from_env({**env, "MTC_TIER1_EVERY": "often"}, durable_dir=tmp_path,
                              rank=0, world_size=1)


def test_the_heartbeat_is_rate_bounded_and_says_what_each_tier_holds(tmp_path: Path) -> None:
    beat = tmp_path / "progress" / "rank-0.json"
    s = settings(tmp_path, progress_file=beat, progress_interval_s=3600.0)
    cp = TieredCheckpointer(s)
    cp.step_done(1)
    first = beat.stat().st_mtime_ns, beat.read_text()
    for step in range(2, 5):  # no save, the interval not over: no new heartbeat
        cp.step_done(step)
    assert (beat.stat().st_mtime_ns, beat.read_text()) == first
    cp.save(20, state(20))  # a durable save always beats
    cp.close()
    body = json.loads(beat.read_text())
    assert body["step"] == 20 and body["newest"] == {"memory": 20, "peer": 20, "durable": 20}
    assert body["last_save"]["tiers"] == ["memory", "peer", "durable"]
    assert body["last_save"]["blocking_s"] > 0


def test_the_first_step_after_a_restore_beats_at_once(tmp_path: Path) -> None:
    """Fault to resumed is read from it: the rate bound must not delay that heartbeat."""
    beat = tmp_path / "progress" / "rank-0.json"
    s = settings(tmp_path, progress_file=beat, progress_interval_s=3600.0)
    run_steps(TieredCheckpointer(s), 20)
    again = TieredCheckpointer(s, log=lambda _: None)
    again.step_done(3)  # the first step of a start beats
    assert json.loads(beat.read_text())["step"] == 3
    assert_state(again.restore(), 20)  # the restore beats (forced) ...
    assert json.loads(beat.read_text())["step"] == 20
    again.step_done(21)  # ... and so does the first step after it, within the interval
    assert json.loads(beat.read_text())["step"] == 21
    again.step_done(22)  # then the bound holds again
    assert json.loads(beat.read_text())["step"] == 21


def test_a_failure_in_the_background_writer_never_hangs_the_next_save(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer thread that died of one bad save left the next ``save`` blocked on the full
    queue and ``close`` on its join: the program hung instead of training on."""
    real = entries.encode
    calls: list[int] = []

    def encode_once_bad(snapshot: dict[str, np.ndarray | bytes]) -> bytes:
        calls.append(1)
        if len(calls) == 1:  # the writer's first snapshot
            raise ValueError("a payload it cannot encode")
        return real(snapshot)

    monkeypatch.setattr(entries, "encode", encode_once_bad)
    cp = TieredCheckpointer(settings(tmp_path, tier3_every=1000), log=lambda _: None)
    done = threading.Event()

    def train() -> None:
        for step in (5, 10, 15):
            cp.save(step, state(step), ("memory", "peer"))
        cp.close()
        done.set()

    threading.Thread(target=train, daemon=True).start()
    assert done.wait(20), "the save or the close hung after the writer's failure"
    assert any("cannot encode" in e for e in cp.written.errors)
    assert cp.newest["memory"] == 15 and cp.newest["peer"] == 15
