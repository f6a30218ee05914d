"""Gangs: the ranks of an attempt live and die together, and nothing outlives its launcher.

Real processes: a rank is ``worker_launcher`` leading its own process group, with the
training command as its child. A rank killed with SIGKILL must end the attempt for every rank
(SIGTERM to the others' groups, SIGKILL after the grace period), reported once with the
killed rank's code; a killed launcher must take its training process with it.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shared.adapters.clock import SystemClock
from shared.adapters.compute.local.compute import LocalCompute
from shared.adapters.compute.protocol import EXIT_KILLED, checkpoint_steps
from shared.domain.events import JobWorkersExited
from shared.ports import Gang
from tests.harness import Recorder, one_pool_gang

pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
              pytest.mark.slow]  # real worker subprocesses

GRACE_S = 2.0
# how long past the grace period an end may take: liveness bounds, not measurements (a loaded
# 2-core CI machine starts and reaps Python processes slowly)
MARGIN_S = 8.0

# Checkpoints every 50 ms, atomically; ``IGNORE_TERM=1`` makes a rank ignore SIGTERM, so only
# the SIGKILL after the grace period can end it. A rank writes ``ready-<rank>`` once its signal
# disposition is set: a signal sent before that meets Python's default (a loaded machine starts
# the interpreter slowly), so the tests wait for it.
TRAIN = textwrap.dedent(
    """
    import os, signal, time
    if os.environ.get("IGNORE_TERM") == os.environ["RANK"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    d = os.environ["AIP_CHECKPOINT_DIR"]
    rank, step = os.environ["RANK"], 0
    open(os.path.join(d, f"ready-{rank}"), "w").close()
    while True:
        step += 1
        if rank == "1":
            tmp = os.path.join(d, f".ckpt-{step:08d}.tmp")
            open(tmp, "w").write(str(step))
            os.replace(tmp, os.path.join(d, f"ckpt-{step:08d}"))
        time.sleep(0.05)
    """
)


def gang(tmp_path: Path, job_id: str, env: tuple[tuple[str, str], ...] = ()) -> Gang:
    return one_pool_gang(job_id, 1, ("n0", "n1"), (sys.executable, "-c", TRAIN), env,
                         out=tmp_path / "out" / job_id)


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (from /proc: the launcher's training process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2 :].split()[0] not in ("Z", "X")


def wait(compute: LocalCompute, done: Callable[[], bool], timeout_s: float) -> float:
    start = time.monotonic()
    while not done():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not reached within {timeout_s:g}s")
        compute.poll()
        time.sleep(0.05)
    return time.monotonic() - start


def exits(recorder: Recorder) -> list[JobWorkersExited]:
    return [e for e in recorder.events if isinstance(e, JobWorkersExited)]


@pytest.fixture
def compute(tmp_path: Path) -> Iterator[tuple[LocalCompute, Recorder]]:
    recorder = Recorder()
    made = LocalCompute(tmp_path / "state", recorder, SystemClock(), heartbeats=False,
                        gang_grace_s=GRACE_S)
    yield made, recorder
    made.kill_all()
    made.close()


def trainers(compute: LocalCompute, started: Gang) -> dict[int, int]:
    """rank -> pid of the training process (the launcher's child), once both run and have
    set their signal dispositions (``ready-<rank>``)."""
    found: dict[int, int] = {}

    def both() -> bool:
        for w in compute.workers(started.job_id):
            kids = children(w.pid)
            if kids:
                found[w.rank] = kids[0]
        ready = Path(started.checkpoint_dir)
        return len(found) == 2 and all((ready / f"ready-{rank}").exists() for rank in found)

    wait(compute, both, 10.0)
    return found


@pytest.mark.parametrize("ignore_term", [False, True], ids=["term", "term-ignored"])
def test_one_rank_killed_ends_the_gang(
    compute: tuple[LocalCompute, Recorder], tmp_path: Path, ignore_term: bool
) -> None:
    local, recorder = compute
    env = (("IGNORE_TERM", "0"),) if ignore_term else ()
    started = gang(tmp_path, "g1", env)
    local.start_workers(started)
    pids = trainers(local, started)
    os.kill(pids[1], signal.SIGKILL)  # rank 1 dies; rank 0 must not train on alone
    took = wait(local, lambda: not alive(pids[0]), GRACE_S + MARGIN_S)
    wait(local, lambda: bool(exits(recorder)), MARGIN_S)
    for _ in range(5):
        local.poll()
    [ended] = exits(recorder)  # once
    assert ended.exit_code == EXIT_KILLED, ended  # the killed rank's code, not rank 0's
    assert "rank 1: 137" in ended.detail and "rank 1 failed first" in ended.detail
    rank0 = 128 + (signal.SIGKILL if ignore_term else signal.SIGTERM)
    assert f"rank 0: {rank0}" in ended.detail
    assert [w.exit_code for w in local.workers("g1")] == [rank0, EXIT_KILLED]
    if ignore_term:
        assert took >= GRACE_S - 0.5  # SIGTERM first, SIGKILL only after the grace period


def test_killed_launcher_leaves_no_orphans(
    compute: tuple[LocalCompute, Recorder], tmp_path: Path
) -> None:
    local, recorder = compute
    workers = gang(tmp_path, "g2")
    local.start_workers(workers)
    pids = trainers(local, workers)
    launcher = local.workers("g2")[1].pid
    os.kill(launcher, signal.SIGKILL)  # the launcher, not its training process
    wait(local, lambda: not alive(pids[1]), MARGIN_S)  # its train child went with it
    assert not Path(f"/proc/{pids[1]}").exists() or not alive(pids[1])
    wait(local, lambda: bool(exits(recorder)), GRACE_S + MARGIN_S)
    [ended] = exits(recorder)
    assert ended.exit_code == EXIT_KILLED and "rank 1 failed first" in ended.detail
    ckpts = Path(workers.checkpoint_dir)
    before = set(checkpoint_steps(ckpts))
    time.sleep(0.5)  # it checkpointed every 50 ms while it ran
    assert set(checkpoint_steps(ckpts)) == before
    assert not alive(pids[0])
