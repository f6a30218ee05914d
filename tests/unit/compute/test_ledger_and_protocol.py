"""The worker protocol's pure parts and the ledger's rules, the same over both stores."""

from __future__ import annotations

import json
import signal
import sqlite3
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from shared.adapters.compute.ledger import (
    CHECKPOINTS_SCHEMA,
    LedgerStore,
    MemoryLedger,
    SqliteLedger,
    all_ranks_exited,
    ranks_exited,
    repair_completed,
    report_checkpoints,
    signal_deadline,
    workers_exited,
)
from shared.adapters.compute.protocol import (
    ExitCode,
    attempt_exit,
    checkpoint_name,
    checkpoint_steps,
    managed_env,
    master_port,
)
from shared.ports import WorkerSpec

SCHEMA = CHECKPOINTS_SCHEMA + """
CREATE TABLE attempts (job_id TEXT, attempt INTEGER, world_size INTEGER, checkpoint_dir TEXT,
    started_at REAL, finalized INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (job_id, attempt));
CREATE TABLE repairs (node_id TEXT, attempt INTEGER, action TEXT, started_at REAL,
    completed_at REAL, PRIMARY KEY (node_id, attempt));
"""


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest) -> Iterator[LedgerStore]:
    if request.param == "memory":
        yield MemoryLedger()
        return
    db = sqlite3.connect(":memory:")
    db.executescript(SCHEMA)
    yield SqliteLedger(db)
    db.close()


def test_exit_codes() -> None:
    assert ExitCode.PREEMPTED == 75 and ExitCode.KILLED == 137
    assert ExitCode.for_signal(signal.SIGTERM) == ExitCode.TERMINATED == 143
    assert ExitCode.signal_of(137) == signal.SIGKILL and ExitCode.signal_of(75) is None
    assert attempt_exit({1: 75, 0: 0}) == (75, "exit codes rank 0: 0, rank 1: 75")
    assert attempt_exit({0: None}) == (137, "exit codes rank 0: 137")
    assert all_ranks_exited({0: 0, 1: 75}) and not all_ranks_exited({0: 0, 1: None})
    assert not all_ranks_exited({})


def test_checkpoint_discovery(tmp_path: Path) -> None:
    (tmp_path / checkpoint_name(100)).mkdir()
    (tmp_path / "ckpt-7.pt").write_text("x")
    (tmp_path / "ckpt-8.tmp").write_text("partial")
    (tmp_path / ".ckpt-9").write_text("hidden")
    (tmp_path / "ckpt-10.npz").write_text("not a zip")
    with zipfile.ZipFile(tmp_path / "ckpt-11.npz", "w") as z:
        z.writestr("a", "b")
    assert sorted(checkpoint_steps(tmp_path)) == [7, 11, 100]
    assert checkpoint_steps(tmp_path / "missing") == {}


def test_the_managed_environment_wins_over_the_spec() -> None:
    spec = WorkerSpec("j", 2, 1, 4, "n1", ("true",), (("RANK", "9"), ("MINE", "x")),
                      "/c", "/o/model", "/o/logs")
    env = managed_env(spec, "10.0.0.1")
    assert env["RANK"] == "1" and env["MINE"] == "x" and env["WORLD_SIZE"] == "4"
    assert env["MASTER_PORT"] == str(master_port("j", 2)) and env["MASTER_ADDR"] == "10.0.0.1"
    assert env["AIP_CHECKPOINT_DIR"] == "/c" and env["CLOUD_ML_JOB_ID"] == "j"


def test_cluster_spec_has_one_list_per_pool_and_the_index_within_the_pool() -> None:
    def spec(rank: int, pools: tuple[int, ...] = ()) -> dict[str, Any]:
        worker = WorkerSpec("j", 2, rank, 3, f"n{rank}", ("true",), (), "/c", "/o/model", "/o/logs")
        env = managed_env(worker, "10.0.0.1", pools)
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == "3"  # torch's: global
        return cast("dict[str, Any]", json.loads(env["CLUSTER_SPEC"]))

    port = master_port("j", 2)
    addresses = [f"10.0.0.1:{port + r}" for r in range(3)]
    for pools in ((), (3,)):  # one pool: the shape examples and users read, unchanged
        assert spec(2, pools) == {
            "cluster": {"workerpool0": addresses}, "environment": "cloud",
            "task": {"type": "workerpool0", "index": 2, "node_id": "n2"},
            "job": {"job_id": "j", "attempt": 2, "world_size": 3, "base_output_directory": "/o"}}
    tasks = [spec(r, (1, 2))["task"] for r in range(3)]
    assert [(t["type"], t["index"]) for t in tasks] == [("workerpool0", 0), ("workerpool1", 0),
                                                        ("workerpool1", 1)]
    assert spec(1, (1, 2))["cluster"] == {"workerpool0": addresses[:1], "workerpool1": addresses[1:]}
    with pytest.raises(ValueError, match="do not add up"):
        spec(0, (1, 1))


def test_an_attempt_starts_once_and_ends_once(store: LedgerStore) -> None:
    assert store.start_attempt("j", 1, 2, "/c", 0.0)
    assert not store.start_attempt("j", 1, 2, "/c", 1.0)
    assert store.attempt_ended("j", 1) is False and store.attempt_ended("j", 9) is None
    first = ranks_exited(store, "j", 1, {0: 75, 1: 75})
    assert first is not None and first.exit_code == 75
    assert workers_exited(store, "j", 1, 1) is None
    assert store.attempt_ended("j", 1) is True
    assert workers_exited(store, "j", 2, 0) is None  # never started: nothing to report


def test_each_checkpoint_step_once_per_directory(store: LedgerStore, tmp_path: Path) -> None:
    (tmp_path / "ckpt-10").mkdir()
    assert [e.step for e in report_checkpoints(store, "j", 1, str(tmp_path), 0.0)] == [10]
    (tmp_path / "ckpt-20").mkdir()
    assert [e.step for e in report_checkpoints(store, "j", 2, str(tmp_path), 1.0)] == [20]
    assert report_checkpoints(store, "j", 2, str(tmp_path), 2.0) == []


def test_a_repair_starts_once_per_node_and_attempt_and_completes_once(store: LedgerStore) -> None:
    assert store.start_repair("n", 1, "reboot", 0.0)
    assert not store.start_repair("n", 1, "reset_gpu", 0.0)  # the key is (node, attempt)
    assert repair_completed(store, "n", 2, "reboot", True, "", 1.0) is None  # never started
    done = repair_completed(store, "n", 1, "reboot", True, "ok", 1.0)
    assert done is not None and done.ok and done.attempt == 1
    assert repair_completed(store, "n", 1, "reboot", True, "ok", 2.0) is None


def test_an_attempt_is_signalled_once_and_its_deadline_only_comes_closer() -> None:
    assert signal_deadline(None, None, 100.0, 30.0) == (True, 130.0)
    assert signal_deadline(100.0, 130.0, 110.0, 30.0) == (False, None)  # later: kept
    assert signal_deadline(100.0, 130.0, 110.0, 5.0) == (False, 115.0)  # sooner: moved up
    assert signal_deadline(100.0, None, 110.0, 5.0) == (False, 115.0)
    assert signal_deadline(None, None, 100.0, -4.0) == (True, 100.0)  # no negative grace


def test_tier_env_puts_the_peer_copy_on_the_buddys_node(tmp_path: Path) -> None:
    from shared.adapters.compute.protocol import tier_env

    def root(node: str) -> Path:
        return tmp_path / node / "shm"

    nodes = ("a", "b", "c")
    env = [tier_env("job/1", r, nodes, root, tmp_path / "out" / "ckpt", ("a", "x", "c")) for r in range(3)]
    assert [e["MTC_TIER1_DIR"] for e in env] == [str(root(n) / "job_1" / f"rank-{r}")
                                                 for r, n in enumerate(nodes)]
    assert [e["MTC_TIER2_DIR"] for e in env] == [str(root(n) / "job_1" / "peer" / f"rank-{r}")
                                                 for r, n in enumerate(("b", "c", "a"))]
    assert env[0]["MTC_TIER2_SOURCE_DIR"] == str(root("x") / "job_1" / "peer" / "rank-0")  # before
    assert env[2]["MTC_PROGRESS_FILE"] == str(tmp_path / "out" / "mtc-progress" / "rank-2.json")
    spec = WorkerSpec("job/1", 1, 0, 3, "a", ("true",), (("MTC_TIER1_DIR", "mine"),), "c", "m", "t")
    assert managed_env(spec, tiers=env[0])["MTC_TIER1_DIR"] == env[0]["MTC_TIER1_DIR"]  # the service's
    assert managed_env(spec)["MTC_TIER1_DIR"] == "mine"  # no tiers given: the job's own, if any


def test_tier_env_sends_the_peer_copy_to_the_buddys_peer_store(tmp_path: Path) -> None:
    """Where the nodes run a peer store: the copy's address is the buddy's service, read back
    from the previous buddy's; no peer directory at all."""
    from shared.adapters.compute.protocol import tier_env

    def store(node: str) -> str:
        return f"http://{node}.example:7000"

    env = [tier_env("job/1", r, ("a", "b"), lambda n: tmp_path / n, tmp_path / "ckpt", ("x", "y"),
                    peer_store=store, token="s3") for r in range(2)]
    assert [e["MTC_TIER2_URL"] for e in env] == ["http://b.example:7000/job_1",
                                                 "http://a.example:7000/job_1"]
    assert env[0]["MTC_TIER2_SOURCE_URL"] == "http://y.example:7000/job_1"
    assert env[1]["MTC_TIER1_DIR"] == str(tmp_path / "b" / "job_1" / "rank-1")
    assert env[0]["MTC_TIER2_TOKEN"] == "s3" and "MTC_TIER2_DIR" not in env[0]


def test_tier_saves_are_reported_once_when_every_rank_holds_them(
        tmp_path: Path, store: LedgerStore) -> None:
    from shared.adapters.compute.ledger import report_tier_saves
    from shared.adapters.compute.protocol import progress_path

    ckpt = tmp_path / "out" / "checkpoints"

    def beat(rank: int, memory: int | None, peer: int | None, attempt: int = 2) -> None:
        path = progress_path(ckpt, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "attempt": attempt, "newest": {"memory": memory, "peer": peer, "durable": None},
            "dirs": {"memory": f"/m{rank}", "peer": f"/p{rank}"},
            "last_save": {"step": memory, "tiers": ["memory", "peer"], "blocking_s": 0.01 * (rank + 1)}}))

    beat(0, 20, 20)
    assert report_tier_saves(store, "j", 2, str(ckpt), 2, 1.0) == []  # rank 1 has not reported
    beat(1, 20, 10)
    got = report_tier_saves(store, "j", 2, str(ckpt), 2, 2.0)
    assert [(e.tier, e.step, e.path) for e in got] == [("memory", 20, "/m0/step-0000000020"),
                                                       ("peer", 10, "/p0/step-0000000010")]
    assert got[0].save_s == pytest.approx(0.02) and got[1].save_s == 0.0
    assert report_tier_saves(store, "j", 2, str(ckpt), 2, 3.0) == []  # once
    beat(1, 20, 20, attempt=1)  # a heartbeat of another attempt says nothing of this one
    assert report_tier_saves(store, "j", 2, str(ckpt), 2, 4.0) == []


def test_an_attempts_first_step_is_reported_once_from_rank_0s_heartbeat(
        tmp_path: Path, store: LedgerStore) -> None:
    """What the recovery policy measures startup by, on the local and Slurm computes."""
    from shared.adapters.compute.ledger import report_first_step
    from shared.adapters.compute.protocol import progress_path
    from shared.domain.events import JobFirstStep

    ckpt = tmp_path / "out" / "checkpoints"
    assert report_first_step(store, "j", 2, str(ckpt), 1.0) is None  # no heartbeat yet
    path = progress_path(ckpt, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"attempt": 1, "step": 40}))
    assert report_first_step(store, "j", 2, str(ckpt), 2.0) is None  # another attempt's
    path.write_text(json.dumps({"attempt": 2, "step": 0}))
    assert report_first_step(store, "j", 2, str(ckpt), 3.0) is None  # no step run yet
    path.write_text(json.dumps({"attempt": 2, "step": 41}))
    assert report_first_step(store, "j", 2, str(ckpt), 4.0) == JobFirstStep("j", 2, 41)
    path.write_text(json.dumps({"attempt": 2, "step": 45}))
    assert report_first_step(store, "j", 2, str(ckpt), 5.0) is None  # once per attempt
