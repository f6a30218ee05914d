"""In place on the embedded default with real processes (examples/train.py).

The training program has no tier library in this branch: its tier-1 (memory) save is
reported by the test, the event the library's report becomes (a stand-in, stated). The rest
is real: the agent's XID 13 report, triage's RESTART_JOB, the SIGTERM, the durable save and
exit 75 of real worker processes, and the next attempt's real processes on the same nodes,
told ``MTC_RECOVERY_MODE=in_place`` through their environment.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.cli.demo import CLUSTER_SPEC, demo_compute_options, job_spec
from services.job_submission import commands as job_commands
from services.wiring.embedded import embedded
from shared.domain.events import JobCheckpointSaved, JobRequeued
from shared.domain.health import Condition, ConditionStatus, ConditionType
from shared.domain.model import Job, JobState


def children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


def environ(launcher: int) -> dict[str, str]:
    """The environment of the rank a launcher runs (its child: the launcher's own is fixed)."""
    started = children(launcher)
    pid = int(started[0]) if started else launcher
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.slow
def test_xid13_restarts_the_real_workers_in_place(tmp_path: Path) -> None:
    app = embedded(tmp_path / "state", compute_options=demo_compute_options())
    try:
        with app.transaction() as uow:
            job_commands.create_cluster(CLUSTER_SPEC, uow, app.deps)

        def job() -> Job:
            with app.uow() as uow:
                found = uow.jobs.get("inplace-1")
            assert found is not None
            return found

        def ready() -> bool:
            with app.uow() as uow:
                cluster = uow.clusters.get("demo")
            return cluster is not None and cluster.state.value == "READY"

        assert app.run(ready, timeout_s=20)
        with app.transaction() as uow:
            job_commands.submit_job("demo", job_spec(100_000), uow, app.deps, "inplace-1")
        assert app.run(lambda: len(app.compute.workers("inplace-1")) == 2, timeout_s=30)
        app.run(lambda: False, timeout_s=1.0)  # (its SIGTERM handler is installed)
        first = job()
        now = app.deps.clock.now()
        app.inject(JobCheckpointSaved(job_id="inplace-1", attempt=1, step=1, path="memory",
                                      saved_at=now, save_s=0.01, tier="memory"), "//test")
        app.compute.inject_fault(first.node_ids[0], [Condition(
            ConditionType.XID_ERROR.value, ConditionStatus.TRUE, "NVRM: Xid 13", now,
            {"xids": [13]})])
        assert app.run(lambda: job().attempt >= 2, timeout_s=30)
        again = job()
        assert again.state is JobState.RUNNING and tuple(again.node_ids) == tuple(first.node_ids)
        assert again.recovery.decisions[-1]["mode"] == "in_place"
        assert app.deps.event_log is not None
        log = [d["type"] for d in app.deps.event_log.read()
               if d["data"].get("job_id") == "inplace-1"]
        assert JobRequeued.TYPE not in log  # never PENDING
        workers = [w for w in app.compute.workers("inplace-1") if w.attempt == 2]
        assert sorted(w.node_id for w in workers) == sorted(first.node_ids)
        # a launcher of attempt 2 starts its rank a moment after it is recorded (longer on a
        # loaded machine): read environments once each has one
        assert app.run(lambda: all(children(w.pid) for w in workers), timeout_s=30)
        # told through their environment: a new process's, or the restart order that hands a
        # held process (mtc_program.inprocess) the new attempt's environment
        orders = [json.loads(p.read_text()) for p in
                  (tmp_path / "state").rglob("inplace-1/*.ctl/restart.json")]
        told = [o["env"].get("MTC_RECOVERY_MODE") for o in orders if o["action"] == "restart"]
        # a process started for attempt 2 (not a held rank, nor a warm standby started with
        # attempt 1's environment, which both learn the mode from their restart order)
        fresh = [env.get("MTC_RECOVERY_MODE") for env in map(environ, (w.pid for w in workers))
                 if env.get("MTC_JOB_ATTEMPT") == "2"]
        assert told + fresh and set(told + fresh) == {"in_place"}, (told, fresh)
        assert len(told) + len(fresh) == len(workers), (told, fresh)
    finally:
        app.compute.kill_all()
        app.close()
