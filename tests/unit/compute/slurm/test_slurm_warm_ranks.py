"""Slurm's warm processes without a cluster: which ranks are held (all or none), which are
parked, which the next attempt takes (``SlurmWarm``), and the task's handover to a held
program (``handover``), against the program side's own reader (``mtc_program.inprocess``)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from mtc_program.inprocess import HOLD, RESTART, Order, read_order, state_path
from shared.adapters.compute.slurm import handover
from shared.adapters.compute.slurm.view import SlurmView
from shared.adapters.compute.slurm.warm import WARM_SCHEMA, SlurmWarm, control_path
from shared.ports import Gang, LaunchGroup, RecoveryPlan

JOB = "j"
NODES = ("a", "b", "c")


def answer(control: Path, **state: int) -> None:
    state_path(control).write_text(json.dumps({"pid": 4242, **state}))


@pytest.fixture
def db() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.row_factory = sqlite3.Row
    conn.executescript(WARM_SCHEMA + "CREATE TABLE attempts (job_id TEXT, attempt INTEGER,"
                       " slurm_job_id INTEGER);")
    return conn


def gang(attempt: int, plan: RecoveryPlan | None = None) -> Gang:
    return Gang(JOB, attempt, NODES, (LaunchGroup(0, 3, ("true",), ()),), "c", "m", "t",
                recovery=plan)


def setup(tmp_path: Path, db: sqlite3.Connection) -> tuple[SlurmWarm, Path]:
    def run_dir(job: str, attempt: int) -> Path:
        return tmp_path / job / f"attempt-{attempt}"

    warm = SlurmWarm(SlurmView(up_since=0.0), run_dir, park_s=20.0)
    first = run_dir(JOB, 1)
    for r in range(3):
        control_path(first, r).parent.mkdir(parents=True)
    warm.host(db, gang(1), first, ["n1", "n2", "n3"])
    return warm, first


def test_a_gang_is_held_only_when_every_live_rank_declared(tmp_path: Path,
                                                           db: sqlite3.Connection) -> None:
    warm, run = setup(tmp_path, db)
    answer(control_path(run, 0))
    answer(control_path(run, 1))
    assert warm.hold(db, JOB, 1) == frozenset()  # rank 2 never declared: signal them all
    assert read_order(control_path(run, 0)) is None
    (run / "rank-2.exit").write_text("137\n")  # the rank that failed is out of the gang
    assert warm.hold(db, JOB, 1) == {0, 1}
    order = read_order(control_path(run, 0))
    assert order is not None and order.action == HOLD and order.deadline is not None
    assert warm.park(db, JOB, 1, 100.0) == {}  # not answered yet: still in the attempt
    answer(control_path(run, 0), held=order.generation)
    assert warm.park(db, JOB, 1, 100.0) == {0: 75}


def test_the_next_in_place_attempt_takes_the_parked_processes_on_their_nodes(
        tmp_path: Path, db: sqlite3.Connection) -> None:
    warm, run = setup(tmp_path, db)
    (run / "rank-2.exit").write_text("137\n")
    for r in (0, 1):
        answer(control_path(run, r))
    assert warm.hold(db, JOB, 1) == {0, 1}
    for r in (0, 1):
        order = read_order(control_path(run, r))
        assert order is not None
        answer(control_path(run, r), held=order.generation)
    assert warm.park(db, JOB, 1, 100.0) == {0: 75, 1: 75}
    second = tmp_path / JOB / "attempt-2"
    second.mkdir()
    assert warm.takes(db, gang(2, RecoveryPlan("in_place"))) == [0, 1]
    take = json.loads((second / "rank-1.take").read_text())
    assert take == {"control": str(control_path(run, 1)), "exit_file": str(run / "rank-1.exit")}
    assert (second / "rank-1.oldpeer").read_text() == str(run / "peer-store-1.pid")
    assert not (second / "rank-2.take").exists()  # its process died: a new one
    # the rank goes on with the process's own control file: the next hold reaches it
    row = db.execute("SELECT control FROM warm_ranks WHERE job_id = ? AND attempt = 2 AND"
                     " rank = 1", (JOB,)).fetchone()
    assert row["control"] == str(control_path(run, 1))


def test_a_requeue_takes_nothing_and_a_parked_process_not_taken_is_ended(
        tmp_path: Path, db: sqlite3.Connection) -> None:
    warm, run = setup(tmp_path, db)
    answer(control_path(run, 0))
    (run / "rank-1.exit").write_text("0\n")
    (run / "rank-2.exit").write_text("1\n")
    assert warm.hold(db, JOB, 1) == {0}
    order = read_order(control_path(run, 0))
    assert order is not None
    answer(control_path(run, 0), held=order.generation)
    assert warm.park(db, JOB, 1, 100.0) == {0: 75}
    spec = next(gang(2).workers())
    assert warm.take(db, spec, None, {}, "") is None  # a requeue: new processes
    before = time.time()
    warm.end(db, JOB, 100.0)
    ended = read_order(control_path(run, 0))
    assert ended is not None and ended.action == HOLD and ended.generation > order.generation
    assert ended.deadline is not None and ended.deadline <= time.time() and ended.deadline >= before - 1


def test_the_handover_restarts_the_held_program_and_keeps_its_exit_code(tmp_path: Path) -> None:
    control = tmp_path / "rank-0.ctl" / "restart.json"
    control.parent.mkdir()
    control.write_bytes(Order(3, HOLD, deadline=time.time() + 20).to_json())
    answer(control, held=3, applied=2)
    launcher_exit, exit_file = tmp_path / "held.exit", tmp_path / "rank-0.exit"
    take = tmp_path / "rank-0.take"
    take.write_text(json.dumps({"control": str(control), "exit_file": str(launcher_exit)}))
    env = tmp_path / "rank-0.env"
    env.write_bytes(b"RANK=0\0MTC_JOB_ATTEMPT=2\0MTC_RESTART_FILE=/elsewhere\0")
    codes: list[int] = []
    task = threading.Thread(target=lambda: codes.append(
        handover.hand_over(str(take), str(env), str(exit_file), interval_s=0.01)))
    task.start()
    deadline = time.monotonic() + 10
    while (order := read_order(control)) is None or order.action != RESTART:
        assert time.monotonic() < deadline, "no restart order"
        time.sleep(0.01)
    assert order.generation == 4 and order.log_path == ""
    assert order.env == {"RANK": "0", "MTC_JOB_ATTEMPT": "2"}  # its own control file stays
    answer(control, held=0, applied=4)  # the program applied it
    launcher_exit.write_text("0\n")  # and later ended
    task.join(10)
    assert codes == [0] and exit_file.read_text().strip() == "0"


def test_a_handover_to_a_process_that_is_gone_fails_the_rank(tmp_path: Path) -> None:
    launcher_exit = tmp_path / "held.exit"
    launcher_exit.write_text("75\n")
    take = tmp_path / "rank-0.take"
    take.write_text(json.dumps({"control": str(tmp_path / "c.json"),
                                "exit_file": str(launcher_exit)}))
    env = tmp_path / "env"
    env.write_bytes(b"RANK=0\0")
    exit_file = tmp_path / "rank-0.exit"
    assert handover.hand_over(str(take), str(env), str(exit_file)) == handover.GONE
    assert exit_file.read_text().strip() == str(handover.GONE)
