"""Real worker processes: environment, exits, signals, checkpoints, other processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from local_compute_support import FakeClock, poll_until

from shared.adapters.compute.local.compute import LocalCompute
from shared.adapters.compute.protocol import EXIT_KILLED, master_port
from shared.domain.events import JobCheckpointSaved, JobWorkersExited
from shared.ports import Gang, LaunchGroup
from tests.harness import Recorder, one_pool_gang

REPO = Path(__file__).resolve().parents[4]
TRAIN = REPO / "examples" / "train.py"
PY = sys.executable
pytestmark = pytest.mark.slow  # real worker subprocesses
MANAGED = (
    "CLOUD_ML_JOB_ID", "CLUSTER_SPEC", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "AIP_CHECKPOINT_DIR", "AIP_MODEL_DIR", "AIP_TENSORBOARD_LOG_DIR", "USER_VAR",
)  # fmt: skip


def gang(
    tmp_path: Path,
    command: tuple[str, ...],
    *,
    job_id: str = "job-1",
    attempt: int = 1,
    world_size: int = 1,
    env: tuple[tuple[str, str], ...] = (),
) -> Gang:
    nodes = [f"n{rank}" for rank in range(world_size)]
    return one_pool_gang(job_id, attempt, nodes, command, env, out=tmp_path / "out" / job_id)


def py(code: str) -> tuple[str, ...]:
    return (PY, "-c", textwrap.dedent(code))


def exits(recorder: Recorder) -> list[JobWorkersExited]:
    return [e for e in recorder.events if isinstance(e, JobWorkersExited)]


def wait_for_log(compute: LocalCompute, job_id: str, attempt: int, text: str) -> None:
    path = compute.log_path(job_id, attempt, 0)
    deadline = time.monotonic() + 10.0
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.02)


def test_workers_get_the_managed_environment(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    compute = make_compute()
    dump = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {MANAGED!r}}}))"
    workers = gang(tmp_path, py(dump), world_size=2, env=(("USER_VAR", "x"), ("RANK", "99")))
    compute.start_workers(workers)
    poll_until(compute, lambda: bool(exits(recorder)))
    port = master_port("job-1", 1, str(compute.state_dir))
    for rank in (0, 1):
        log = compute.log_path("job-1", 1, rank).read_text()
        env = json.loads(log.strip().splitlines()[-1])
        assert env["CLOUD_ML_JOB_ID"] == "job-1"
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), "2")  # the spec cannot override
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", str(port))
        assert env["USER_VAR"] == "x"
        cluster = json.loads(env["CLUSTER_SPEC"])
        assert cluster["cluster"]["workerpool0"] == [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"]
        assert cluster["task"]["type"] == "workerpool0" and cluster["task"]["index"] == rank
        assert cluster["job"]["job_id"] == "job-1" and cluster["job"]["attempt"] == 1
        for var, spec_dir in (
            ("AIP_CHECKPOINT_DIR", workers.checkpoint_dir),
            ("AIP_MODEL_DIR", workers.model_dir),
            ("AIP_TENSORBOARD_LOG_DIR", workers.tensorboard_dir),
        ):
            assert env[var] == spec_dir and Path(spec_dir).is_dir()
    salt = str(compute.state_dir)
    assert 20000 <= port < 32000 and port != master_port("job-1", 2, salt)


def test_two_deployments_on_one_host_give_the_same_job_different_ports() -> None:
    """Test clusters share a host's ports: the same job id and attempt in two servers must
    not rendezvous on one port (one's TCPStore would meet EADDRINUSE or the other's store)."""
    assert master_port("t1", 1, "/a/state") != master_port("t1", 1, "/b/state")
    assert master_port("t1", 1, "/a/state") == master_port("t1", 1, "/a/state")


def test_each_pool_s_ranks_see_their_own_pool_in_cluster_spec(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    dump = "import json, os, sys; print(json.dumps([sys.argv[1], os.environ['RANK'], os.environ.get('A'), "
    dump += "os.environ.get('B'), json.loads(os.environ['CLUSTER_SPEC'])]))"
    out = tmp_path / "out"
    groups = (LaunchGroup(0, 1, (PY, "-c", dump, "cmd-a"), (("A", "1"),)),
              LaunchGroup(1, 2, (PY, "-c", dump, "cmd-b"), (("B", "2"),)))
    compute = make_compute()
    compute.start_workers(Gang("pools", 1, ("n0", "n1", "n2"), groups, str(out / "c"), str(out / "m"),
                               str(out / "t")))
    poll_until(compute, lambda: bool(exits(recorder)))
    port = master_port("pools", 1, str(compute.state_dir))
    want = {0: ("cmd-a", "1", None, "workerpool0", 0), 1: ("cmd-b", None, "2", "workerpool1", 0),
            2: ("cmd-b", None, "2", "workerpool1", 1)}
    for rank, (command, a, b, pool, index) in want.items():
        line = compute.log_path("pools", 1, rank).read_text().strip().splitlines()[-1]
        got_command, got_rank, got_a, got_b, spec = json.loads(line)
        assert (got_command, got_rank, got_a, got_b) == (command, str(rank), a, b)
        assert spec["task"] == {"type": pool, "index": index, "node_id": f"n{rank}"}
        assert spec["cluster"] == {"workerpool0": [f"127.0.0.1:{port}"],
                                   "workerpool1": [f"127.0.0.1:{port + 1}", f"127.0.0.1:{port + 2}"]}
    assert exits(recorder)[0].exit_code == 0


def test_exit_is_observed_once_with_the_first_nonzero_code(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    compute = make_compute()
    # rank 2 would run far longer than the gang takes to end (a loaded machine starts the
    # ranks up to seconds apart: its own exit must never win the race with the SIGTERM)
    code = ("import os, sys, time; r = int(os.environ['RANK']); "
            "time.sleep(0.2 * r if r < 2 else 60); sys.exit(r)")
    compute.start_workers(gang(tmp_path, py(code), world_size=3))
    poll_until(compute, lambda: bool(exits(recorder)))
    for _ in range(3):
        compute.poll()
    # rank 1's failure ends the gang: rank 2 is stopped (SIGTERM) before it exits by itself
    assert exits(recorder) == [
        JobWorkersExited("job-1", 1, 1, "exit codes rank 0: 0, rank 1: 1, rank 2: 143;"
                         " rank 1 failed first, the gang ended with it")
    ]
    assert [w.exit_code for w in compute.workers("job-1")] == [0, 1, 143]


def test_start_workers_is_idempotent(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    compute = make_compute()
    workers = gang(tmp_path, py("print('hello')"), world_size=2)
    compute.start_workers(workers)
    compute.start_workers(workers)
    compute.start_workers(gang(tmp_path, py("print('other')"), world_size=2))  # same attempt
    poll_until(compute, lambda: bool(exits(recorder)))
    compute.start_workers(workers)  # even after they exited: the same attempt is not rerun
    compute.poll()
    assert len(compute.workers()) == 2 and len(exits(recorder)) == 1
    assert compute.log_path("job-1", 1, 0).read_text().count("hello") == 1


def test_sigterm_reaches_the_program_which_checkpoints_and_exits_75(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    compute = make_compute(in_process=False)  # (with it, the program is held: see
    # tests/integration/test_inprocess_restart.py and test_a_held_rank_not_taken_gets_sigterm)
    cmd = (PY, str(TRAIN), "--steps", "100000", "--checkpoint-every", "5", "--step-time", "0.01")
    compute.start_workers(gang(tmp_path, cmd))
    poll_until(compute, lambda: bool(recorder.of(JobCheckpointSaved)))
    compute.signal_workers("job-1", 1, grace_s=30.0)
    compute.signal_workers("job-1", 1, grace_s=60.0)  # a repeat sends nothing more
    poll_until(compute, lambda: bool(exits(recorder)))
    (exited,) = exits(recorder)
    assert exited.exit_code == 75
    saved = recorder.of(JobCheckpointSaved)
    assert recorder.events.index(saved[-1]) < recorder.events.index(exited)
    steps = [c.step for c in saved]
    assert steps == sorted(set(steps)) and all(c.attempt == 1 for c in saved)
    last = Path(saved[-1].path)
    assert last.name == f"ckpt-{steps[-1]:08d}.npz" and last.exists()
    with np.load(last) as z:
        assert int(z["step"]) == steps[-1]
    log = compute.log_path("job-1", 1, 0).read_text()
    assert log.count("SIGTERM received") == 1  # relayed once, not twice
    assert (last.parent / "LATEST").read_text().strip() == last.name


def test_sigkill_after_the_grace_period(
    make_compute: Callable[..., LocalCompute],
    recorder: Recorder,
    clock: FakeClock,
    tmp_path: Path,
) -> None:
    compute = make_compute()
    stubborn = """
        import signal, time
        signal.signal(signal.SIGTERM, lambda *a: print('got SIGTERM, ignoring', flush=True))
        print('ready', flush=True)
        time.sleep(60)
    """
    compute.start_workers(gang(tmp_path, py(stubborn)))
    wait_for_log(compute, "job-1", 1, "ready")
    compute.signal_workers("job-1", 1, grace_s=5.0)
    wait_for_log(compute, "job-1", 1, "got SIGTERM")
    clock.advance(4.9)
    for _ in range(5):
        compute.poll()
        time.sleep(0.02)
    assert exits(recorder) == []
    clock.advance(0.1)
    poll_until(compute, lambda: bool(exits(recorder)))
    assert exits(recorder)[0].exit_code == EXIT_KILLED


def test_stop_workers_kills_now_and_is_harmless_to_repeat(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    compute = make_compute()
    compute.start_workers(gang(tmp_path, py("import time; time.sleep(60)"), world_size=2))
    compute.stop_workers("job-1", 1)
    compute.stop_workers("job-1", 1)
    poll_until(compute, lambda: bool(exits(recorder)))
    assert exits(recorder)[0].exit_code == EXIT_KILLED
    compute.stop_workers("job-1", 1)  # attempt already gone
    compute.signal_workers("job-1", 1, 1.0)
    compute.stop_workers("no-such-job", 3)
    compute.signal_workers("no-such-job", 3, 1.0)
    compute.poll()
    assert len(exits(recorder)) == 1


def test_checkpoints_follow_the_file_name_convention(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    compute = make_compute()
    compute.start_workers(gang(tmp_path, py("import time; time.sleep(60)")))
    ckpt = Path(gang(tmp_path, ()).checkpoint_dir)
    np.savez(ckpt / "ckpt-00000010.npz", w=np.zeros(2))
    (ckpt / "ckpt-00000020.npz").write_bytes(b"PK\x03\x04 truncated")  # not a readable zip
    (ckpt / ".ckpt-00000030.npz.abc.tmp").write_bytes(b"")  # a writer's temp file
    (ckpt / "ckpt-00000040.tmp").write_bytes(b"")
    (ckpt / "ckpt-50").mkdir()  # a directory checkpoint, renamed into place
    (ckpt / "LATEST").write_text("ckpt-00000010.npz\n")
    compute.poll()
    compute.poll()
    assert [(c.step, Path(c.path).name) for c in recorder.of(JobCheckpointSaved)] == [
        (10, "ckpt-00000010.npz"),
        (50, "ckpt-50"),
    ]
    compute.stop_workers("job-1", 1)
    poll_until(compute, lambda: bool(exits(recorder)))

    # The next attempt shares the directory: old checkpoints are not reported again.
    recorder.events.clear()
    compute.start_workers(gang(tmp_path, py("print('attempt 2')"), attempt=2))
    np.savez(ckpt / "ckpt-00000060.npz", w=np.zeros(2))
    poll_until(compute, lambda: bool(exits(recorder)))
    assert [(c.attempt, c.step) for c in recorder.of(JobCheckpointSaved)] == [(2, 60)]


def test_another_process_sees_workers_this_one_started(
    state_dir: Path,
    make_compute: Callable[..., LocalCompute],
    recorder: Recorder,
    tmp_path: Path,
) -> None:
    """A CLI process starts workers and exits; a later process observes their exit."""
    starter = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from shared.adapters.compute.local.compute import LocalCompute
        from shared.ports import Gang, LaunchGroup

        class Clock:
            def now(self): return 1000.0

        def emit(event): print("unexpected", event); sys.exit(3)

        compute = LocalCompute(Path({str(state_dir)!r}), emit, Clock(), heartbeats=False)
        out = Path({str(tmp_path / "other")!r})
        compute.start_workers(Gang("bg", 1, ("n", "n"), (
            LaunchGroup(0, 1, ({PY!r}, "-c", "import time; time.sleep(0.3)"), ()),
            LaunchGroup(1, 1, ({PY!r}, "-c", "import time; time.sleep(60)"), ()),
        ), str(out / "c"), str(out / "m"), str(out / "t")))
        compute.close()
        """
    )
    subprocess.run([PY, "-c", starter], cwd=REPO, check=True, timeout=30)
    compute = make_compute()
    first, second = compute.workers("bg")
    assert (first.rank, second.rank, second.exit_code) == (0, 1, None)
    # rank 0 done first (else rank 1's death would end it with the gang: 143)
    poll_until(compute, lambda: compute.workers("bg")[0].exit_code == 0)
    os.killpg(second.pid, signal.SIGKILL)  # dies without an exit file: counts as killed
    poll_until(compute, lambda: bool(exits(recorder)))
    assert exits(recorder) == [JobWorkersExited(
        "bg", 1, 137, "exit codes rank 0: 0, rank 1: 137; rank 1 failed first, the gang ended with it")]
    make_compute().poll()  # a third instance: nothing new
    assert len(recorder.events) == 1


def test_kill_all_stops_every_live_worker(
    make_compute: Callable[..., LocalCompute], recorder: Recorder, tmp_path: Path
) -> None:
    compute = make_compute()
    sleep = py("import time; time.sleep(60)")
    compute.start_workers(gang(tmp_path, sleep, job_id="a"))
    compute.start_workers(gang(tmp_path, sleep, job_id="b"))
    compute.kill_all()
    compute.poll()
    assert sorted((e.job_id, e.exit_code) for e in exits(recorder)) == [("a", 137), ("b", 137)]


@pytest.mark.parametrize(("command", "code"), [(("no-such-program-xyz",), 127)])
def test_a_command_that_cannot_start_exits_127(
    make_compute: Callable[..., LocalCompute],
    recorder: Recorder,
    tmp_path: Path,
    command: tuple[str, ...],
    code: int,
) -> None:
    compute = make_compute()
    compute.start_workers(gang(tmp_path, command))
    poll_until(compute, lambda: bool(exits(recorder)))
    assert exits(recorder)[0].exit_code == code
    assert "cannot start" in compute.log_path("job-1", 1, 0).read_text()
