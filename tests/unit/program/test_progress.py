"""The per-rank progress library (mtc_program.progress): compute vs wait per step, the
collective with its sequence number, written by its thread while the loop is blocked, and
carried in the tier checkpointer's heartbeat when the two are linked (one file, one writer)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from mtc_program.progress import RankProgress
from mtc_program.tiers import TieredCheckpointer, TierSettings


def read(path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads(path.read_text())
    return data


def test_compute_and_wait_per_step_and_the_collective_while_blocked(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.json"
    prog = RankProgress(path, 0, 3, interval_s=0.05)
    prog.begin_step()
    time.sleep(0.05)  # compute
    with prog.collective("all_reduce"):
        time.sleep(0.1)  # waiting
    prog.step_done(1)
    release = threading.Event()

    def blocked() -> None:
        with prog.collective("all_reduce"):
            release.wait(5)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.3)  # the loop is blocked: only the writer thread can publish this
    beat = read(path)
    assert beat["attempt"] == 3 and beat["step"] == 1
    assert beat["collective"] == {"name": "all_reduce", "seq": 2, "state": "entered",
                                  "at": beat["collective"]["at"]}  # type: ignore[index]
    ((step, compute, wait),) = beat["steps"]  # type: ignore[misc]
    assert step == 1 and 0.04 <= compute < 1.0 and 0.09 <= wait < 1.0  # (a loaded machine)
    release.set()
    t.join()
    prog.close()
    assert read(path)["collective"]["state"] == "left"  # type: ignore[index]


def test_linked_to_the_checkpointer_one_heartbeat_carries_both(tmp_path: Path) -> None:
    path = tmp_path / "progress" / "rank-0.json"
    ckpt = TieredCheckpointer(TierSettings(rank=0, world_size=1, durable_dir=tmp_path / "d",
                                           progress_file=path, progress_interval_s=0.05,
                                           attempt=1))
    prog = RankProgress(None, 0, 1, interval_s=0.05)
    prog.link(ckpt)
    with prog.collective("barrier"):
        pass
    prog.step_done(1)
    ckpt.step_done(1)
    prog.close()
    beat = read(path)
    assert beat["step"] == 1 and "newest" in beat  # the checkpointer's fields ...
    assert beat["collective"]["seq"] == 1 and len(beat["steps"]) == 1  # type: ignore[index,arg-type]
