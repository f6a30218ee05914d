"""SlurmCompute against an in-memory Slurm: mapping, drains, repairs, jobs, outages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from shared.adapters.compute.slurm.api import job_name, xid_line
from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.domain.events import (
    JobCheckpointSaved,
    JobWorkersExited,
    NodeHealthReported,
    NodeProvisioned,
    NodeRepairCompleted,
)
from shared.domain.health import RepairAction
from shared.domain.model import Node, NodeRole, NodeState
from shared.ports import Gang
from shared.probes.commands import CommandResult, ToolNotFound
from tests.harness import ManualClock, Recorder, one_pool_gang

from .fake_slurm import FakeJob, FakeSlurm


class Clock(ManualClock):
    def __init__(self, t: float = 1000.0) -> None:
        super().__init__(t)


Events = Recorder


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def slurm() -> FakeSlurm:
    return FakeSlurm()


@pytest.fixture
def make(
    tmp_path: Path, clock: Clock, events: Events, slurm: FakeSlurm
) -> Iterator[Callable[..., SlurmCompute]]:
    made: list[SlurmCompute] = []

    def build(**kwargs: Any) -> SlurmCompute:
        kwargs.setdefault("agent_probes", ("xid", "disk"))
        kwargs.setdefault("observe_interval_s", 0.0)
        compute = SlurmCompute(tmp_path / "compute", events, clock, cli=slurm, **kwargs)
        made.append(compute)
        return compute

    yield build
    for compute in made:
        compute.close()


def node(node_id: str, *, role: NodeRole = NodeRole.WORKER, replaces: str | None = None) -> Node:
    return Node(
        node_id,
        "c",
        "pool",
        "train",
        role,
        "a3-highgpu-8g",
        "NVIDIA_H100_80GB",
        8,
        NodeState.PROVISIONING,
        0.0,
        replaces=replaces,
    )


def provisioned(compute: SlurmCompute, *ids: str) -> dict[str, str]:
    for node_id in ids:
        compute.provision_node(node(node_id))
    compute.poll()
    return compute.mapping()


def no_tools(argv: Sequence[str], timeout_s: float) -> CommandResult:
    raise ToolNotFound(f"{argv[0]} not found on PATH")


def gang(job_id: str, attempt: int, tmp: Path, command: tuple[str, ...] = ("true",)) -> Gang:
    """Ranks 0 and 1 on w0 and w1."""
    return one_pool_gang(job_id, attempt, ("w0", "w1"), command, (("USER_VAR", "a,b=c"),),
                         out=tmp / "out" / job_id)


# ---------------------------------------------------------------- nodes


def test_provisioning_maps_free_static_nodes_and_drains_them_until_checked(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm, events: Events
) -> None:
    compute = make()
    compute.provision_node(node("c-login", role=NodeRole.LOGIN))
    mapping = provisioned(compute, "w0", "w1")
    assert mapping == {"w0": "n1", "w1": "n2"}
    ups = events.of(NodeProvisioned)
    assert [(e.node_id, e.ok) for e in ups] == [("c-login", True), ("w0", True), ("w1", True)]
    assert "Slurm node n1 (static node)" in ups[1].detail
    assert slurm.nodes["n1"].reason == "mtc: w0 provisioned, running its first checks"
    assert "DRAIN" in slurm.nodes["n2"].flags and "DRAIN" not in slurm.nodes["n3"].flags
    compute.provision_node(node("w0"))  # a repeat is a no-op
    compute.poll()
    assert len(events.of(NodeProvisioned)) == 3
    compute.uncordon("w0")  # passed its checks
    assert "DRAIN" not in slurm.nodes["n1"].flags
    compute.uncordon("w0")  # not drained any more: Slurm refuses, which is fine
    assert [a.kind for a in compute.alerts()] == []


def test_a_replacement_powers_up_a_cloud_node_and_is_up_only_when_slurm_says_so(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm, events: Events
) -> None:
    compute = make()
    slurm.nodes["c1"].flags.add("POWERING_UP")  # power_up below clears POWERED_DOWN only
    compute.provision_node(node("w0-r1", replaces="w0"))
    compute.poll()
    assert compute.slurm_node_of("w0-r1") == "c1"
    assert slurm.count("power_up") == 1 and events.of(NodeProvisioned) == []
    slurm.nodes["c1"].flags.discard("POWERING_UP")
    compute.poll()
    [up] = events.of(NodeProvisioned)
    assert up.ok and "cloud node, powered up" in up.detail


def test_no_free_node_alerts_then_fails_after_the_timeout(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm, events: Events, clock: Clock
) -> None:
    compute = make(provision_timeout_s=30.0, slurm_nodes=("n1",))
    provisioned(compute, "w0")
    compute.provision_node(node("w1"))
    compute.poll()
    assert [a.kind for a in compute.alerts()] == ["no-capacity"]
    clock.advance(31)
    compute.poll()
    failed = [e for e in events.of(NodeProvisioned) if not e.ok]
    assert [e.node_id for e in failed] == ["w1"] and "no free Slurm node" in failed[0].detail


def test_cordon_drains_once_per_reason_and_uncordon_resumes(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm
) -> None:
    compute = make()
    provisioned(compute, "w0")
    compute.uncordon("w0")
    compute.cordon("w0", "gpu_fell_off_bus: reboot")
    compute.cordon("w0", "gpu_fell_off_bus: reboot")
    assert [c for c in slurm.calls if c[0] == "drain"][-1] == ("drain", "n1", "mtc: gpu_fell_off_bus: reboot")
    assert slurm.count("drain") == 2  # the verify drain, then the fault (once)
    compute.uncordon("w0")
    assert "DRAIN" not in slurm.nodes["n1"].flags


def test_reboot_repair_completes_when_slurmd_restarted_then_reports_a_post_repair_check(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm, events: Events
) -> None:
    compute = make(agent_probes=("xid", "nvidia_smi"), agent_runner=no_tools)
    provisioned(compute, "w0")
    compute.inject_xid("w0", 79)
    compute.cordon("w0", "gpu_fell_off_bus: reboot")
    compute.start_repair("w0", RepairAction.REBOOT, 1)
    compute.start_repair("w0", RepairAction.REBOOT, 1)  # the same attempt: no second reboot
    assert slurm.count("reboot") == 1 and "DRAIN" in slurm.nodes["n1"].flags
    compute.poll()
    assert events.of(NodeRepairCompleted) == []  # still rebooting
    slurm.finish_reboot("n1")
    compute.poll()
    [done] = events.of(NodeRepairCompleted)
    assert done.ok and done.node_id == "w0" and done.attempt == 1 and "rebooted" in done.detail
    post = [e for e in events.of(NodeHealthReported) if e.source == "post-repair-check"]
    assert len(post) == 1
    by_type = {c["type"]: c for c in post[0].conditions}
    assert by_type["XidError"]["status"] == "false"  # a new boot: a new, empty kernel log
    assert by_type["EccUncorrectable"]["status"] == "unknown"  # no nvidia-smi here: unknown
    logs = sorted(p.name for p in compute.kernel_log("n1").parent.glob("kern.log*"))
    assert len(logs) == 2  # the old log was rotated away
    assert "DRAIN" in slurm.nodes["n1"].flags  # back, but out of service until checks pass


def test_reimage_wipes_the_scratch_dir(make: Callable[..., SlurmCompute], slurm: FakeSlurm) -> None:
    compute = make()
    provisioned(compute, "w0")
    junk = compute.scratch_dir("n1") / "junk"
    junk.write_text("x")
    compute.start_repair("w0", RepairAction.REIMAGE, 1)
    slurm.finish_reboot("n1")
    compute.poll()
    assert not junk.exists() and compute.scratch_dir("n1").is_dir()


def test_replace_swaps_in_a_cloud_node_under_the_same_id(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm, events: Events
) -> None:
    compute = make()
    provisioned(compute, "w0")
    compute.cordon("w0", "lemon")
    compute.start_repair("w0", RepairAction.REPLACE, 1)
    assert ("power_down", "n1") in slurm.calls
    compute.poll()
    assert compute.slurm_node_of("w0") == "c1" and ("power_up", "c1") in slurm.calls
    compute.poll()
    [done] = events.of(NodeRepairCompleted)
    assert done.ok and "replaced by c1" in done.detail
    assert slurm.nodes["c1"].reason == "mtc: lemon"  # still out until its checks pass


def test_delete_node_powers_down_faulty_and_cloud_nodes_and_releases_healthy_ones(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm
) -> None:
    compute = make()
    provisioned(compute, "w0", "w1")
    compute.cordon("w0", "lemon: replace")
    compute.delete_node("w0")
    assert ("power_down", "n1") in slurm.calls and slurm.nodes["n1"].reason.startswith("mtc: retired")
    compute.delete_node("w1")  # healthy (still in its verify drain): back to the free pool
    assert ("power_down", "n2") not in slurm.calls and "DRAIN" not in slurm.nodes["n2"].flags
    assert compute.mapping() == {}


# ---------------------------------------------------------------- workers


def test_one_sbatch_per_attempt_with_the_managed_environment(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm, tmp_path: Path
) -> None:
    compute = make()
    provisioned(compute, "w0", "w1")
    workers = gang("job-a", 1, tmp_path)
    compute.start_workers(workers)
    compute.start_workers(workers)  # a repeat is a no-op
    assert slurm.count("sbatch") == 1
    [job] = slurm.queue.values()
    assert job.name == job_name("job-a", 1, compute.instance) and job.nodes == ("n1", "n2")
    assert job.argv["requeue"] and job.argv["open_mode"] == "append" and job.argv["partition"] == "mtc"
    assert "--ntasks-per-node=1" in job.argv["extra"] and job.argv["nodes"] == 2
    assert slurm.partitions == {"mtc": "ALL"}
    task = (compute.run_dir("job-a", 1) / "task.sh").read_text()
    assert 'export RANK="${SLURM_PROCID' in task and "CLOUD_ML_JOB_ID=job-a" in task
    assert compute.slurm_job_id("job-a", 1) == job.job_id


def test_the_task_script_gives_each_rank_its_identity(
    make: Callable[..., SlurmCompute], tmp_path: Path
) -> None:
    """Run the generated task.sh as srun would on node n2 for task 1."""
    compute = make()
    provisioned(compute, "w0", "w1")
    probe = "import json, os; print(json.dumps(dict(os.environ)))"
    compute.start_workers(gang("job-b", 3, tmp_path, command=(sys.executable, "-c", probe)))
    run_dir = compute.run_dir("job-b", 3)
    env = {"PATH": os.environ["PATH"], "SLURM_PROCID": "1", "SLURMD_NODENAME": "n2"}
    out = subprocess.run(
        ["bash", str(run_dir / "task.sh")], env=env, capture_output=True, text=True, timeout=30, check=True
    )
    got = json.loads(out.stdout)
    assert got["RANK"] == "1" and got["WORLD_SIZE"] == "2" and got["MTC_NODE_ID"] == "w1"
    assert got["CLOUD_ML_JOB_ID"] == "job-b" and got["USER_VAR"] == "a,b=c"
    assert got["AIP_CHECKPOINT_DIR"].endswith("job-b/checkpoints") and got["MTC_JOB_ATTEMPT"] == "3"
    cluster_spec = json.loads(got["CLUSTER_SPEC"])
    assert cluster_spec["task"] == {"type": "workerpool0", "index": 1, "node_id": "w1"}
    assert (run_dir / "rank-1.exit").read_text().strip() == "0"


def test_exit_files_give_one_workers_exited_after_the_checkpoints(
    make: Callable[..., SlurmCompute], events: Events, tmp_path: Path
) -> None:
    compute = make()
    provisioned(compute, "w0", "w1")
    workers = gang("job-c", 1, tmp_path)
    compute.start_workers(workers)
    run_dir = compute.run_dir("job-c", 1)
    (run_dir / "rank-1.exit").write_text("75\n")
    compute.poll()
    assert events.of(JobWorkersExited) == []
    ckpt = Path(workers.checkpoint_dir)
    (ckpt / "ckpt-00000040.tmp").write_text("partial")  # not complete: ignored
    (ckpt / "ckpt-40").mkdir()
    (run_dir / "rank-0.exit").write_text("75\n")
    compute.poll()
    compute.poll()
    assert [e.step for e in events.of(JobCheckpointSaved)] == [40]
    [exited] = events.of(JobWorkersExited)
    assert exited.exit_code == 75 and "rank 0: 75, rank 1: 75" in exited.detail
    kinds = [type(e).__name__ for e in events.events if isinstance(e, JobCheckpointSaved | JobWorkersExited)]
    assert kinds == ["JobCheckpointSaved", "JobWorkersExited"]


def test_a_job_gone_without_exit_files_counts_as_killed(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm, events: Events, clock: Clock, tmp_path: Path
) -> None:
    compute = make()
    provisioned(compute, "w0", "w1")
    compute.start_workers(gang("job-d", 1, tmp_path))
    (compute.run_dir("job-d", 1) / "rank-0.exit").write_text("0\n")
    slurm.queue.clear()  # gone from squeue (NODE_FAIL long ago, or scancel)
    compute.poll()
    clock.advance(2)
    compute.poll()
    [exited] = events.of(JobWorkersExited)
    assert exited.exit_code == 137 and "gone from squeue" in exited.detail


def test_slurm_requeueing_an_attempt_by_itself_ends_it(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm, events: Events, clock: Clock, tmp_path: Path
) -> None:
    compute = make()
    provisioned(compute, "w0", "w1")
    compute.start_workers(gang("job-e", 1, tmp_path))
    [job] = slurm.queue.values()
    job.state, job.restart_cnt = "PENDING", 1
    compute.poll()
    clock.advance(2)
    compute.poll()
    [exited] = events.of(JobWorkersExited)
    assert exited.exit_code == 137 and "requeued by Slurm itself" in exited.detail
    assert ("cancel", str(job.job_id)) in slurm.calls


def test_signal_is_scancel_term_then_cancel_after_the_grace(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm, clock: Clock, tmp_path: Path
) -> None:
    compute = make()
    provisioned(compute, "w0", "w1")
    compute.start_workers(gang("job-f", 1, tmp_path))
    [job] = slurm.queue.values()
    compute.signal_workers("job-f", 1, 10.0)
    compute.signal_workers("job-f", 1, 10.0)  # once only
    assert [c for c in slurm.calls if c[0] == "signal"] == [("signal", str(job.job_id), "TERM")]
    clock.advance(5)
    compute.poll()
    assert slurm.count("cancel") == 0
    clock.advance(6)
    compute.poll()
    assert slurm.count("cancel") == 1 and job.state == "CANCELLED"


def test_a_lost_sbatch_answer_is_adopted_not_submitted_twice(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm, tmp_path: Path
) -> None:
    compute = make()
    provisioned(compute, "w0", "w1")
    name = job_name("job-g", 1, compute.instance)
    slurm.queue[77] = FakeJob(77, name, ("n1", "n2"))
    compute.start_workers(gang("job-g", 1, tmp_path))
    assert slurm.count("sbatch") == 0 and compute.slurm_job_id("job-g", 1) == 77


# ---------------------------------------------------------------- outages


def test_an_unreachable_controller_is_retried_with_backoff_and_an_alert(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm, clock: Clock, events: Events, tmp_path: Path
) -> None:
    compute = make(retry_initial_s=1.0, retry_max_s=8.0)
    provisioned(compute, "w0", "w1")
    compute.start_workers(gang("job-h", 1, tmp_path))
    slurm.down = True
    compute.cordon("w0", "xid 79")  # must not raise into the handler
    assert [a.kind for a in compute.alerts()][:1] == ["slurm-unreachable"]
    slurm.queue.clear()  # squeue would say the job is gone, but squeue does not answer
    calls = len(slurm.calls)
    for _ in range(40):  # 40 polls over 20 s: backoff keeps the tries to a few
        clock.advance(0.5)
        compute.poll()
    assert 2 <= len(slurm.calls) - calls <= 12, slurm.calls[calls:]
    assert events.of(JobWorkersExited) == []  # nothing inferred from a silent controller
    assert "DRAIN" in slurm.nodes["n1"].flags and slurm.nodes["n1"].reason.endswith("first checks")
    slurm.down = False
    waited = 0.0
    while slurm.nodes["n1"].reason != "mtc: xid 79" and waited < 30:
        clock.advance(0.5)
        waited += 0.5
        compute.poll()
    assert slurm.nodes["n1"].reason == "mtc: xid 79"
    assert waited <= 10.0  # the next probe of the controller (backoff) finds it, then the drain runs


def test_the_agent_reports_an_xid_once_and_is_silent_while_its_node_is_down(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm, clock: Clock, events: Events
) -> None:
    compute = make(agent_interval_s=1.0)
    provisioned(compute, "w0")
    compute.kernel_log("n1").write_text(xid_line(48))
    clock.advance(1)
    compute.poll()
    clock.advance(1)
    compute.poll()
    reports = [e for e in events.of(NodeHealthReported) if e.node_id == "w0"]
    xid = [next(c for c in r.conditions if c["type"] == "XidError") for r in reports]
    assert [c["status"] for c in xid[-2:]] == ["true", "false"]
    assert xid[-2]["details"]["xids"] == [48]
    slurm.nodes["n1"].flags.add("NOT_RESPONDING")
    count = len(events.of(NodeHealthReported))
    clock.advance(1)
    compute.poll()
    assert len(events.of(NodeHealthReported)) == count


def test_an_outage_does_not_time_out_a_repair(
    make: Callable[..., SlurmCompute], slurm: FakeSlurm, clock: Clock, events: Events
) -> None:
    compute = make(repair_timeout_s=60.0, retry_max_s=5.0)
    provisioned(compute, "w0")
    compute.start_repair("w0", RepairAction.REBOOT, 1)
    slurm.down = True
    for _ in range(60):  # 5 minutes without an answer
        clock.advance(5)
        compute.poll()
    slurm.down = False
    for _ in range(4):
        clock.advance(5)
        compute.poll()
    assert events.of(NodeRepairCompleted) == []  # still waiting: the outage did not count
    slurm.finish_reboot("n1")
    clock.advance(5)
    compute.poll()
    [done] = events.of(NodeRepairCompleted)
    assert done.ok


def test_a_hang_is_named_on_the_slurm_node_of_its_culprit_rank(
    make: Callable[..., SlurmCompute], events: Events, clock: Clock, tmp_path: Path
) -> None:
    """The Slurm adapter reads every rank's heartbeat (rank r on the attempt's r-th node) and
    reports the hang's culprit on its mtc node (shared.adapters.compute.rank_progress)."""
    import json

    from shared.adapters.compute.protocol import progress_path
    from shared.domain.events import NodeHealthReported

    compute = make()
    provisioned(compute, "w0", "w1")
    workers = gang("job-h", 1, tmp_path)
    compute.start_workers(workers)
    now = clock.now()
    for rank, (seq, inside) in enumerate(((8, True), (7, False))):  # rank 1 never entered #8
        path = progress_path(workers.checkpoint_dir, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({
            "rank": rank, "attempt": 1, "time": now, "step": 7, "progress_at": now,
            "beat_every_s": 1.0, "steps": [[s, 0.5, 0.1] for s in range(1, 8)],
            "collective": {"name": "all_reduce", "seq": seq,
                           "state": "entered" if inside else "left", "at": now}}))
    compute.poll()
    assert events.of(NodeHealthReported) == [] or all(
        c["type"] != "HangInJob" for e in events.of(NodeHealthReported) for c in e.conditions)
    clock.advance(30.0)  # past 3 x p99 (0.6 s), floored at 10 s
    compute.poll()
    hung = [e for e in events.of(NodeHealthReported)
            if any(c["type"] == "HangInJob" for c in e.conditions)]
    assert [e.node_id for e in hung] == ["w1"]
    assert hung[0].conditions[0]["details"]["culprit"] == 1
