"""In-process restart of a PyTorch program (``mtc_program.torch_inprocess``), with real
gloo process groups on CPU: ``examples/torch_inprocess.py`` on two ranks, the test playing
the adapter (it writes the hold and restart orders a local compute writes). A hold ends the
call; the same process leaves its group, joins the next attempt's on a new port, restores
the cut from its own memory (no tier read) and ends with the weights of an uninterrupted
run. A crashed peer, and a warm standby taking its rank, are the integration test's
(``tests/integration/test_torch_inprocess.py``, through the local compute)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mtc_program import inprocess
from mtc_program.inprocess import HOLD, RESTART, Order

pytestmark = pytest.mark.slow  # real torch.distributed processes
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[3]
PROGRAM = ROOT / "examples" / "torch_inprocess.py"
STEPS = 60
ARGS = ("--steps", str(STEPS), "--memory-every", "5")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(tmp: Path, rank: int, attempt: int, port: int) -> dict[str, str]:
    """What an adapter gives a rank of the attempt (the control file apart)."""
    return {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "AIP_CHECKPOINT_DIR": str(tmp / "ckpt"), "AIP_MODEL_DIR": str(tmp / "model"),
            "MTC_JOB_ATTEMPT": str(attempt), "MTC_TIER1_DIR": str(tmp / f"mem{rank}" / "r"),
            "MTC_TIER1_EVERY": "5", "MTC_RESTORE_TIMEOUT_S": "30"}


def start(env: dict[str, str], log: Path, *extra: str) -> subprocess.Popen[bytes]:
    full = {"PATH": os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1", **env}
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, str(PROGRAM), *ARGS, *extra], env=full,
                                stdout=out, stderr=subprocess.STDOUT)


def wait_for(predicate: Callable[[], bool], what: str, procs: list[subprocess.Popen[bytes]],
             logs: list[Path], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        dead = [p.returncode for p in procs if p.poll() is not None]
        assert time.monotonic() < deadline and not dead, (
            what, dead, "\n".join(p.read_text() for p in logs if p.exists())[-4000:])
        time.sleep(0.02)


def newest_entry(memory: Path) -> int:
    steps = [int(p.name.split("-")[1]) for p in memory.glob("step-*")]
    return max(steps, default=0)


def uninterrupted(tmp: Path) -> str:
    """The weights' digest of a run without restarts (no control file: runs once)."""
    tmp.mkdir()
    port, logs = free_port(), [tmp / "r0.log", tmp / "r1.log"]
    procs = [start({**rank_env(tmp, r, 1, port), "MTC_TIER1_DIR": ""}, logs[r]) for r in (0, 1)]
    assert [p.wait(120) for p in procs] == [0, 0], logs[0].read_text()[-3000:]
    return digest(logs[0].read_text())


def digest(log: str) -> str:
    found = re.findall(r"done at step \d+: weights sha256 (\w+)", log)
    assert found, log[-3000:]
    return str(found[-1])


def order(control: Path, action: str, **kw: object) -> Order:
    current = inprocess.read_order(control)
    state = inprocess.read_state(control)
    gen = max(current.generation if current else 0, state.get("applied", 0),
              state.get("held", 0)) + 1
    made = Order(gen, action, **kw)  # type: ignore[arg-type]
    inprocess.atomic_write(control, made.to_json())
    return made


def test_held_live_ranks_rejoin_the_next_attempt_and_restore_from_memory(tmp_path: Path) -> None:
    """Both ranks are held alive (a hot swap elsewhere): they stop at one step, save, and
    both go on in their processes, in a group on the next attempt's port, restoring that
    step from their own memory. (A crashed peer with a warm standby taking its rank is
    tests/integration/test_torch_inprocess.py's, through the local compute.)"""
    expected = uninterrupted(tmp_path / "plain")
    tmp = tmp_path / "run"
    tmp.mkdir()
    ports = free_port(), free_port()
    controls = [tmp / f"ctl{r}" / "restart.json" for r in (0, 1)]
    logs = [tmp / "rank0.log", tmp / "rank1.log", tmp / "attempt2.log"]
    procs = [start({**rank_env(tmp, r, 1, ports[0]), "MTC_RESTART_FILE": str(controls[r])},
                   logs[r], "--step-time", "0.05") for r in (0, 1)]
    try:
        wait_for(lambda: all(inprocess.read_state(c).get("pid") for c in controls)
                 and newest_entry(tmp / "mem0" / "r") >= 10 and newest_entry(tmp / "mem1" / "r") >= 10,
                 "ranks training past step 10", procs, logs)
        assert [inprocess.read_state(c)["pid"] for c in controls] == [p.pid for p in procs]
        holds = {r: order(controls[r], HOLD, deadline=time.time() + 60) for r in (0, 1)}
        wait_for(lambda: all(inprocess.read_state(controls[r]).get("held") == h.generation
                             for r, h in holds.items()), "the holds answered", procs, logs)
        for r in (0, 1):  # attempt 2: a new rendezvous, each rank its own process
            order(controls[r], RESTART, env={**rank_env(tmp, r, 2, ports[1]),
                                             "MTC_RESTART_FILE": str(controls[r])},
                  log_path=str(logs[2]))
        codes = [p.wait(120) for p in procs]
        text = logs[2].read_text()
        assert codes == [0, 0], text[-4000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert "held (order" in logs[0].read_text()
    for r in (0, 1):  # the same processes, in a group on the new port
        assert f"rank {r}/2 pid {procs[r].pid}] call 1:" in text, text[-3000:]
    assert f"group of 2 on port {ports[1]}" in text
    # held alive: the stop step saved, both restore it from their own memory
    assert text.count("from this process's memory (no tier read)") == 2, text[-3000:]
    assert digest(text) == expected


def test_an_order_reaches_the_loop_through_the_call(tmp_path: Path) -> None:
    """``call.held()`` turns true once an order is written; ``call.check()`` raises ``Held``
    carrying it (a loop without ``Checkpointer`` drops its step that way)."""
    from mtc_program.inprocess import InProcessRestart
    from mtc_program.torch_inprocess import Call, Held, _Monitor
    from mtc_program.torch_runtime import Env
    from mtc_program.torch_tiers import OwnCopy

    control = tmp_path / "restart.json"
    monitor = _Monitor(InProcessRestart(control), abort_after_s=60.0)
    call = Call(Env.read({}), 0, OwnCopy(), monitor)
    try:
        assert not call.held()
        call.check()  # nothing yet
        hold = order(control, HOLD, deadline=time.time() + 60)
        deadline = time.monotonic() + 5
        while not call.held():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(Held) as raised:
            call.check()
        assert raised.value.order == hold
    finally:
        stopped = monitor.stop()
    assert stopped == hold
    assert not monitor.aborted  # seen by the loop: its group is left to it
