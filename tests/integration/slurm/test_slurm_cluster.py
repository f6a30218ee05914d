"""SlurmCli and the node agent against a real Slurm 22.05 cluster on this host."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from services.node_agent.cli import main as agent_main
from shared.adapters.compute.slurm.cli import SlurmCli, SlurmJob, SlurmPermanentError, SlurmTransientError

from .conftest import Cluster, timing, wait_for

pytestmark = pytest.mark.integration

STEP = """#!/bin/bash
# One task per node: say where it runs, then wait for SIGTERM like a training worker would.
out=$1
trap 'echo "TERM $SLURMD_NODENAME" >> "$out/term-$SLURM_JOB_ID-$SLURMD_NODENAME"; exit 0' TERM
echo "start $SLURMD_NODENAME restart=${SLURM_RESTART_COUNT:-0} mark=$MTC_TEST_MARK"
while true; do sleep 0.2; done
"""
BATCH = """#!/bin/bash
echo "batch restart=${SLURM_RESTART_COUNT:-0}"
srun {step} {out}
"""


def write_job(cluster: Cluster, name: str) -> tuple[str, Path]:
    out = cluster.jobs_dir / name
    shutil.rmtree(out, ignore_errors=True)  # output is appended: start from nothing
    out.mkdir()
    step = out / "step.sh"
    step.write_text(STEP)
    step.chmod(0o755)
    batch = out / "batch.sh"
    batch.write_text(BATCH.replace("{step}", str(step)).replace("{out}", str(out)))
    batch.chmod(0o755)
    return str(batch), out


def job(slurm: SlurmCli, job_id: int) -> SlurmJob:
    return slurm.job(job_id)


def output(out: Path) -> str:
    path = out / "slurm.out"
    return path.read_text() if path.exists() else ""


def test_cluster_is_up_and_start_is_idempotent(cluster: Cluster, slurm: SlurmCli) -> None:
    nodes = {n.name: n for n in slurm.nodes()}
    assert sorted(nodes) == ["c1", "c2", "n1", "n2", "n3", "n4"]
    assert all(nodes[f"n{i}"].state == "idle" and nodes[f"n{i}"].available for i in range(1, 5))
    assert nodes["c1"].powered_down and "CLOUD" in nodes["c1"].state_flags
    pids = {n: cluster.slurmd_pid(n) for n in ("n1", "n2", "n3", "n4")}
    start = time.monotonic()
    again = cluster.script("start")
    assert again.returncode == 0 and "already running" in again.stderr
    timing("cluster.sh start when already running", time.monotonic() - start)
    assert {n: cluster.slurmd_pid(n) for n in pids} == pids
    status = cluster.script("status")
    assert status.returncode == 0 and "slurmctld running" in status.stdout


def test_drain_and_resume(slurm: SlurmCli) -> None:
    slurm.drain("n4", "mtc test: XidError 79")
    node = slurm.node("n4")
    assert node.drained and node.reason == "mtc test: XidError 79" and not node.available
    slurm.resume("n4")
    assert not slurm.node("n4").drained
    # slurmctld flags a resumed node NOT_RESPONDING until its next ping answers (~0.3 s here).
    took = wait_for(lambda: slurm.node("n4").available, 30, "n4 available again")
    timing("resume to available", took)
    with pytest.raises(SlurmPermanentError, match="Invalid node state"):
        slurm.resume("n4")  # not drained any more: Slurm refuses, and says so


def test_two_node_job_gets_sigterm_on_every_node(cluster: Cluster, slurm: SlurmCli) -> None:
    script, out = write_job(cluster, "sigterm")
    submitted = time.monotonic()
    job_id = slurm.submit(
        script, nodes=2, job_name="sigterm", env={"MTC_TEST_MARK": "a,b=c"}, output=str(out / "slurm.out")
    )
    took = wait_for(lambda: output(out).count("start ") == 2, 60, "both tasks to start")
    timing("sbatch to 2 tasks running", time.monotonic() - submitted)
    running = job(slurm, job_id)
    assert running.job_state == "RUNNING" and len(running.node_list) == 2 and running.requeue
    assert "mark=a,b=c" in output(out)  # env with commas survives (passed via the environment)
    sent = time.monotonic()
    slurm.signal_job(job_id, "TERM")
    nodes = running.node_list
    wait_for(lambda: all((out / f"term-{job_id}-{n}").exists() for n in nodes), 30, "SIGTERM on both nodes")
    timing("scancel --signal=TERM to both tasks trapping it", time.monotonic() - sent)
    wait_for(lambda: job(slurm, job_id).job_state not in ("RUNNING", "COMPLETING"), 30, "job end")
    assert took >= 0


def test_requeue_moves_the_job_off_a_drained_node(cluster: Cluster, slurm: SlurmCli) -> None:
    script, out = write_job(cluster, "requeue")
    job_id = slurm.submit(script, nodes=2, job_name="requeue", output=str(out / "slurm.out"))
    wait_for(lambda: output(out).count("restart=0 ") == 2, 60, "first run")
    first = job(slurm, job_id)
    bad = first.node_list[0]
    slurm.drain(bad, "mtc test: requeue away")
    try:
        requeued = time.monotonic()
        slurm.requeue(job_id)
        wait_for(lambda: output(out).count("start ") == 4, 90, "the requeued run to start")
        timing("scontrol requeue to running again", time.monotonic() - requeued)
        again = job(slurm, job_id)
        assert again.job_state == "RUNNING" and again.restart_cnt == 1
        assert bad not in again.node_list
        assert "batch restart=1" in output(out)  # open-mode=append kept the first run's output
        assert "batch restart=0" in output(out)
    finally:
        slurm.cancel(job_id)
        slurm.resume(bad)


def test_reboot_returns_the_node_to_idle(cluster: Cluster, slurm: SlurmCli) -> None:
    before = cluster.slurmd_pid("n3")
    assert before is not None
    start = time.monotonic()
    slurm.reboot("n3", "mtc test reboot")

    def back() -> bool:
        node = slurm.node("n3")
        pid = cluster.slurmd_pid("n3")
        return pid is not None and pid != before and node.state == "idle" and not node.state_flags

    wait_for(back, 60, "n3 rebooted and idle")
    timing("scontrol reboot ASAP to idle", time.monotonic() - start)


def test_cloud_node_power_up_and_down(cluster: Cluster, slurm: SlurmCli) -> None:
    assert slurm.node("c1").powered_down and cluster.slurmd_pid("c1") is None
    start = time.monotonic()
    slurm.power_up("c1")
    wait_for(lambda: (n := slurm.node("c1")).state == "idle" and not n.state_flags[1:], 60, "c1 up")
    timing("power_up to idle", time.monotonic() - start)
    assert not slurm.node("c1").powered_down and cluster.slurmd_pid("c1") is not None
    start = time.monotonic()
    slurm.power_down("c1")
    wait_for(lambda: slurm.node("c1").powered_down and cluster.slurmd_pid("c1") is None, 60, "c1 down")
    timing("power_down to powered down", time.monotonic() - start)
    node = slurm.node("c1")
    assert "POWERING_DOWN" not in node.state_flags


def test_real_errors_are_classified(cluster: Cluster, slurm: SlurmCli, tmp_path: Path) -> None:
    with pytest.raises(SlurmPermanentError, match="Invalid node name"):
        slurm.drain("zz9", "x")
    with pytest.raises(SlurmPermanentError, match="Invalid job id"):
        slurm.requeue(999999)
    with pytest.raises(SlurmPermanentError, match="Invalid job id"):
        slurm.signal_job(999999)
    # A controller that does not answer: point a copy of slurm.conf at a dead port.
    conf = Path(cluster.slurm_conf).read_text().replace("SlurmctldPort=", "SlurmctldPort=1", 1)
    dead = tmp_path / "slurm.conf"
    dead.write_text(conf)
    unreachable = SlurmCli(timeout_s=3.0, slurm_conf=str(dead))
    with pytest.raises(SlurmTransientError):
        unreachable.nodes()
    with pytest.raises(SlurmTransientError):
        unreachable.drain("n1", "x")


def test_agent_healthcheck_drains_its_node(cluster: Cluster, slurm: SlurmCli, tmp_path: Path) -> None:
    """The agent run by hand, as slurmd would run it, drains the node through scontrol."""
    log = tmp_path / "kern.log"
    log.write_text("NVRM: Xid (PCI:0000:3b:00): 79, pid=7, name=python3, GPU has fallen off the bus.\n")
    argv = [
        "--slurm-healthcheck",
        "--drain-on-fault",
        "--skip",
        "nvidia_smi,dcgm,speed,disk",
        "--xid-source",
        str(log),
        "--slurm-conf",
        cluster.slurm_conf,
    ]
    try:
        assert agent_main(argv, environ={**os.environ, "SLURMD_NODENAME": "n2"}) == 0
        node = slurm.node("n2")
        assert node.drained and node.reason.startswith("mtc-agent XidError: XID 79 on 0000:3b:00")
    finally:
        slurm.resume("n2")


def test_health_check_program_drains_on_an_injected_xid(cluster: Cluster, slurm: SlurmCli) -> None:
    """The plain-drain baseline: slurmd's HealthCheckProgram (the agent) sees the XID and drains."""
    injected = time.monotonic()
    with (cluster.faults_dir / "n1.log").open("a") as handle:
        handle.write("NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=x, An uncorrectable double bit error\n")
    try:
        wait_for(lambda: slurm.node("n1").drained, 60, "n1 drained by its health check")
        timing("XID in the log to node drained by HealthCheckProgram", time.monotonic() - injected)
        assert slurm.node("n1").reason.startswith("mtc-agent XidError: XID 48")
    finally:
        slurm.resume("n1")
    # Each XID is reported once: a health check over the same log, grown by a line that is
    # not an XID, leaves the resumed node alone (its cursor is past the XID)
    seen = cluster.faults_dir / "n1.seen"
    before = seen.read_text()
    with (cluster.faults_dir / "n1.log").open("a") as handle:
        handle.write("kernel: eth0: link up\n")
    wait_for(lambda: seen.read_text() != before, 60, "n1's health check run again")
    time.sleep(2)  # the agent that run started has read the log and exited by now
    assert not slurm.node("n1").drained
