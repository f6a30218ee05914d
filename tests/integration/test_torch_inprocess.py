"""In-process restart of a PyTorch job on the embedded default: ``examples/torch_inprocess.py``
on 2 nodes (gloo on CPU, ``mtc_program.torch_inprocess``). An app crash of rank 1 recovers in
place: rank 0 keeps its process (the same launcher and program pids), leaves the broken
process group, joins the next attempt's on its new port and restores the cut from its own
memory (no tier read); rank 1 is the node's warm standby, which had imported torch and
built its model without joining a group. The job ends with an uninterrupted run's weights."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from services.cli.bench_live import MACHINE, kill_ranks
from services.job_submission import commands as job_commands
from services.wiring.embedded import embedded
from shared.config import ControlPlaneConfig
from shared.domain.model import JobState, NodeRole
from tests.integration.test_inprocess_restart import chief_step, job, program_pid, ready, standbys

pytestmark = pytest.mark.slow  # real torch.distributed processes
pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_inprocess.py"
STEPS = 100  # the standbys (importing torch) are ready well before the end, on a loaded machine too
ARGS = ("--steps", str(STEPS), "--memory-every", "5")
JOB = "inproc-1"  # the name the shared helpers look for
CLUSTER = {"clusterId": "ip", "displayName": "torch in-process restart",
           "nodePools": [{"id": "h100", "nodeCount": 2, "machineSpec": MACHINE}],
           "partitions": [{"name": "train", "nodePoolIds": ["h100"]}]}
SPEC = {"displayName": "torch-inproc", "labels": {"mtc-recovery-mode": "in_place"}, "jobSpec": {
    "workerPoolSpecs": [{"machineSpec": MACHINE, "replicaCount": 2, "containerSpec": {
        "imageUri": "local/examples:latest", "command": [sys.executable, str(EXAMPLE)],
        "args": [*ARGS, "--step-time", "0.15"],
        "env": [{"name": "MTC_TIER1_EVERY", "value": "5"},
                {"name": "MTC_PROGRESS_INTERVAL_S", "value": "0.1"}]}}],
    "scheduling": {"partition": "train", "restartJobOnWorkerRestart": True}}}


def digest(text: str) -> str:
    found = re.findall(rf"done at step {STEPS}: weights sha256 (\w+)", text)
    assert found, text[-3000:]
    return str(found[-1])


def test_an_app_crash_restarts_the_torch_survivor_in_its_process(tmp_path: Path) -> None:
    config = replace(ControlPlaneConfig(), output_root=tmp_path / "jobs", grace_period_s=10.0)
    app = embedded(tmp_path / "state", config=config,
                   compute_options={"provision_duration_s": 0.1, "agent_interval_s": 0.5})
    try:
        with app.transaction() as uow:
            job_commands.create_cluster(CLUSTER, uow, app.deps)
        assert app.run(lambda: ready(app), timeout_s=30)
        with app.transaction() as uow:
            job_commands.submit_job("ip", SPEC, uow, app.deps, JOB)
        # one warm standby per node, torch imported and its model built, before the fault
        assert app.run(lambda: len(standbys(app)) == 2, timeout_s=60, poll_s=0.05)
        assert app.run(lambda: chief_step(app) >= 10
                       and job(app).recovery.tiers.get("memory") is not None,
                       timeout_s=60, poll_s=0.02)
        assert chief_step(app) < STEPS - 10, "the job nearly done before the fault"
        first = {w.rank: w for w in app.compute.workers(JOB) if w.attempt == 1}
        warm = standbys(app)
        program = program_pid(first[0].pid)
        kill_ranks(app.compute, JOB, 1, first[1].node_id)  # rank 1's program crashes
        assert app.run(lambda: job(app).attempt >= 2, timeout_s=30, poll_s=0.02)
        again = {w.rank: w for w in app.compute.workers(JOB) if w.attempt == 2}
        assert job(app).recovery.decisions[-1]["mode"] == "in_place", job(app).recovery.decisions
        assert again[0].pid == first[0].pid and program_pid(again[0].pid) == program
        assert again[1].pid == warm[first[1].node_id]  # the node's warm standby
        assert app.run(lambda: job(app).terminal, timeout_s=90, poll_s=0.05)
        assert job(app).state is JobState.SUCCEEDED
        assert job(app).restart_count == 1
    finally:
        app.compute.kill_all()
        app.close()
    held = Path(first[0].log_path).read_text()
    assert "step dropped (RuntimeError)" in held and "held (order" in held, held[-3000:]
    log = Path(again[0].log_path).read_text()  # the attempt's own log, the same process
    port = re.search(rf"pid {program}\] call 1: step (\d+) of {STEPS}, group of 2 on port (\d+)", log)
    assert port is not None, log[-3000:]
    assert int(port[2]) != int(re.findall(r"on port (\d+)", held)[0])  # the new rendezvous
    assert f"restore: step {port[1]} from this process's memory (no tier read)" in log, log
    standby_log = Path(app.compute.state_dir, "logs", JOB, f"standby-{first[1].node_id}.log")
    assert "standby ready: waiting to be given a rank" in standby_log.read_text()
    plain = tmp_path / "plain"  # the same job, uninterrupted, for its weights
    port_free = 29_000 + os.getpid() % 1000
    runs = [subprocess.Popen(
        [sys.executable, str(EXAMPLE), *ARGS], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={"PATH": os.environ.get("PATH", ""), "RANK": str(r), "WORLD_SIZE": "2",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port_free),
             "AIP_CHECKPOINT_DIR": str(plain / "c")}) for r in (0, 1)]
    outs = [r.communicate(timeout=60)[0].decode() for r in runs]
    assert [r.returncode for r in runs] == [0, 0], outs[0][-3000:]
    assert digest(log) == digest(outs[0])


def test_a_spare_joins_a_scaled_down_torch_job_without_killing_it(tmp_path: Path) -> None:
    """An elastic torch job (2 replicas, at least 1) with no spare ready: an XID 79 scales it
    down to rank 0 alone, in its process; once the drained spare is back the job grows by a
    hot swap, rank 0 held and re-joined in the same process to a group of 2 with the spare's
    new rank. rank 0's program is one process from the first attempt to the last."""
    from services.cli.bench_live import LocalFaults
    from services.repair import operator
    from shared.resilience.bench_config import bench_config

    # the blast-radius guard sized for a 3-node cluster: with the spare drained it would hold
    # the XID's repair (a third of the partition out), as the recovery benchmark's does not
    config = replace(bench_config(), output_root=tmp_path / "jobs")
    app = embedded(tmp_path / "state", config=config,
                   compute_options={"provision_duration_s": 0.1, "agent_interval_s": 0.5})
    cluster = {**CLUSTER, "nodePools": [{"id": "h100", "nodeCount": 3, "spareCount": 1,
                                         "machineSpec": MACHINE}]}
    pool = SPEC["jobSpec"]["workerPoolSpecs"][0]  # type: ignore[index]
    spec = {**SPEC, "labels": {"mtc-min-replicas": "1"}, "jobSpec": {
        **SPEC["jobSpec"], "workerPoolSpecs": [{**pool, "containerSpec": {  # type: ignore[dict-item]
            **pool["containerSpec"], "args": [*ARGS, "--step-time", "0.2",
                                              "--checkpoint-every", "5"]}}]}}
    try:
        with app.transaction() as uow:
            job_commands.create_cluster(cluster, uow, app.deps)
        assert app.run(lambda: ready(app), timeout_s=30)
        with app.transaction() as uow:
            job_commands.submit_job("ip", spec, uow, app.deps, JOB)
        assert app.run(lambda: chief_step(app) >= 5, timeout_s=60, poll_s=0.02)
        first = {w.rank: w for w in app.compute.workers(JOB) if w.attempt == 1}
        program = program_pid(first[0].pid)
        with app.transaction() as uow:  # the spare drained: nothing to swap in
            [spare] = [n.node_id for n in uow.nodes.list("ip") if n.role is NodeRole.WORKER
                       and n.node_id not in {w.node_id for w in first.values()}]
            operator.act(operator.DRAIN, "ip", spare, "no spare ready", "test", uow, app.deps)
        LocalFaults(app).xid(first[1].node_id, 79, app.deps.clock.now())
        assert app.run(lambda: job(app).attempt >= 2, timeout_s=30, poll_s=0.02)
        assert job(app).recovery.decisions[-1]["mode"] == "scale_down", job(app).recovery.decisions
        [alone] = [w for w in app.compute.workers(JOB) if w.attempt == 2]
        assert alone.pid == first[0].pid and program_pid(alone.pid) == program
        with app.transaction() as uow:  # the spare is back: the job grows onto it
            operator.act(operator.RESUME, "ip", spare, "the spare is back", "test", uow, app.deps)
        assert app.run(lambda: job(app).attempt >= 3, timeout_s=30, poll_s=0.02)
        assert job(app).recovery.decisions[-1]["mode"] == "hot_swap", job(app).recovery.decisions
        grown = {w.rank: w for w in app.compute.workers(JOB) if w.attempt == 3}
        assert grown[0].pid == first[0].pid and program_pid(grown[0].pid) == program
        assert grown[1].node_id == spare
        assert app.run(lambda: job(app).terminal, timeout_s=90, poll_s=0.05)
        assert job(app).state is JobState.SUCCEEDED
    finally:
        app.compute.kill_all()
        app.close()
    log = Path(grown[0].log_path).read_text()
    assert re.search(rf"pid {program}\] call 2: step \d+ of {STEPS}, group of 2", log), log
    assert f"done at step {STEPS}" in log
