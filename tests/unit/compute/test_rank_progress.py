"""Per-rank heartbeats written by the program library (mtc_program.progress, its writer
thread included) and read by the adapters' RankWatch: a hang's culprit named on its node
once, stragglers as a condition on change only, and the plain file protocol."""

from __future__ import annotations

import json
import time
from pathlib import Path

from mtc_program.progress import RankProgress
from shared.adapters.compute.protocol import progress_path
from shared.adapters.compute.rank_progress import RankWatch, read_beats
from shared.policies.hangs import HangConfig, SlowConfig

NODES = {0: "n0", 1: "n1", 2: "n2", 3: "n3"}


def ranks(ckpt: Path, world: int = 4, interval: float = 0.05) -> list[RankProgress]:
    return [RankProgress(progress_path(ckpt, r), r, 1, interval) for r in range(world)]


def run_steps(progs: list[RankProgress], steps: int) -> None:
    for step in range(1, steps + 1):
        for p in progs:
            with p.collective("all_reduce"):
                pass
            p.step_done(step)


def test_the_rank_that_did_not_enter_the_collective_is_named_once(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    progs = ranks(ckpt)
    run_steps(progs, 6)
    progs[2].close()  # rank 2 stops after step 6: its writer stops with it
    waiting = [p.collective("all_reduce") for i, p in enumerate(progs) if i != 2]
    for w in waiting:
        w.__enter__()  # the others enter #7 and wait there
    time.sleep(0.3)  # the writer threads publish "entered #7"
    watch = RankWatch(hang=HangConfig(floor_s=0.5, min_steps=3))
    assert watch.scan("j1", 1, str(ckpt), NODES, time.time()) == []  # not past the limit yet
    facts = watch.scan("j1", 1, str(ckpt), NODES, time.time() + 2.0)
    assert [f.node_id for f in facts] == ["n2"]
    cond = facts[0].conditions[0]
    assert cond["type"] == "HangInJob" and cond["status"] == "true"
    assert cond["details"]["culprit"] == 2 and "did not enter all_reduce #7" in cond["reason"]
    assert watch.scan("j1", 1, str(ckpt), NODES, time.time() + 3.0) == []  # once per attempt
    for p in progs:
        p.close()


def test_a_later_attempt_that_progresses_lifts_the_hang(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    watch = RankWatch(hang=HangConfig(floor_s=0.1, min_steps=1))
    progs = ranks(ckpt, 2)
    run_steps(progs, 3)
    for p in progs:
        p.close()
    (hang,) = watch.scan("j1", 1, str(ckpt), {0: "n0", 1: "n1"}, time.time() + 5)
    progs = [RankProgress(progress_path(ckpt, r), r, 2, 0.05) for r in range(2)]
    run_steps(progs, 1)
    for p in progs:
        p.close()
    lifted = watch.scan("j1", 2, str(ckpt), {0: "n0", 1: "n1"}, time.time())
    assert [(f.node_id, f.conditions[0]["status"]) for f in lifted] == \
        [(hang.node_id, "false")]


def test_a_straggler_is_reported_on_change_only(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    watch = RankWatch(slow=SlowConfig(min_steps=4, warmup_steps=0))
    beats = {r: {"rank": r, "attempt": 1, "time": time.time(), "step": 10,
                 "progress_at": time.time(), "collective": None,
                 "steps": [[s, 0.13 if r == 3 else 0.1, 0.0] for s in range(1, 11)]}
             for r in range(4)}
    for r, b in beats.items():  # the plain file protocol, no library
        path = progress_path(ckpt, r)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(b))
    (slow,) = watch.scan("j1", 1, str(ckpt), NODES, time.time())
    assert slow.node_id == "n3" and slow.conditions[0]["type"] == "SlowInJob"
    assert slow.conditions[0]["details"]["ratio_to_peers"] == 1.3
    assert watch.scan("j1", 1, str(ckpt), NODES, time.time()) == []  # unchanged: nothing


def test_heartbeats_without_per_rank_progress_are_not_watched(tmp_path: Path) -> None:
    path = progress_path(tmp_path / "ckpt", 0)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"rank": 0, "attempt": 1, "step": 3, "time": 1.0}))
    assert read_beats(tmp_path / "ckpt", 1, 1) == {}
    assert RankWatch().scan("j1", 1, str(tmp_path / "ckpt"), {0: "n0"}, 1e12) == []
