"""The event-log accounting on a hand-written log, second by second."""

from __future__ import annotations

from typing import Any

import pytest

from simulator.goodput import Badput, JobParams, account
from simulator.stats import mean_ci, t_quantile

P = JobParams(step_time_s=1.0, checkpoint_save_s=10.0, checkpoint_restore_s=50.0,
              startup_s=100.0, mfu=0.5, checkpoint_interval_s=100.0, nodes=2)


def row(type_: str, t: float, **data: Any) -> dict[str, Any]:
    return {"type": f"mtc.{type_}.v1", "time": t, "data": data}


LOG = [
    row("job.submitted", 0, job_id="j", cluster_id="c"),
    row("job.started", 10, job_id="j", attempt=1, node_ids=["a", "b"], resume_step=-1),
    row("node.health_reported", 405, node_id="a", observed_at=405, source="agent",
        conditions=[{"type": "XidError", "status": "true", "reason": "Xid 79", "since": 400,
                     "details": {"xids": [79], "cause": "faulty_gpu"}}]),
    row("node.health_reported", 406, node_id="b", observed_at=406, source="agent",
        conditions=[{"type": "XidError", "status": "false", "reason": "", "since": 406}]),
    row("node.diagnosed", 406, node_id="a", observed_at=405, failure_mode="gpu_fell_off_bus",
        severity="critical", action="reboot"),
    row("job.checkpoint_saved", 420, job_id="j", attempt=1, step=200, path="p",
        saved_at=330),
    row("job.workers_exited", 420, job_id="j", attempt=1, exit_code=1, detail="crashed"),
    row("job.requeued", 421, job_id="j", cluster_id="c", restart_count=1, reason="x"),
    row("job.started", 500, job_id="j", attempt=2, node_ids=["c", "b"], resume_step=200),
]


def test_every_second_lands_in_one_category_with_its_cause() -> None:
    acc = account(LOG, params={"j": P}, start=0, end=1000, fleet_gpus=32, gpus_per_node=8)
    jg = acc.jobs["j"]
    expect = {
        (Badput.WAITING_FOR_CAPACITY, "initial_start"): 10,
        (Badput.PROGRAM_STARTUP, "initial_start"): 100,
        (Badput.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME, "checkpointing"): 20 + 30,
        (Badput.WASTED_PROGRESS_FROM_DISRUPTION, "faulty_gpu"): 70,
        (Badput.INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION, "faulty_gpu"): 21,
        (Badput.WAITING_FOR_CAPACITY, "faulty_gpu"): 79,
        (Badput.PROGRAM_STARTUP, "faulty_gpu"): 100,
        (Badput.UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME, "faulty_gpu"): 50,
    }
    got = {k: v for k, v in jg.badput.items() if v}
    assert got == pytest.approx(expect)
    assert jg.productive_s == pytest.approx(200 + 320)
    assert jg.nominal_s == pytest.approx(200 + 320)
    assert jg.ettr == pytest.approx(0.52)
    assert jg.scheduling_goodput == pytest.approx((1000 - 89) / 1000)
    assert jg.runtime_goodput == pytest.approx(520 / 911)
    assert jg.program_goodput == pytest.approx(0.5)
    assert jg.goodput == pytest.approx(0.5 * 520 / 1000)
    assert jg.interruptions() == {"faulty_gpu": 1}
    assert jg.disruptions[0].failure_mode == "gpu_fell_off_bus"
    fleet = acc.fleet
    assert fleet.capacity_gpu_s == 32 * 1000 and fleet.job_gpu_s == 16 * 1000
    assert fleet.goodput == pytest.approx(0.5 * 520 * 16 / 32000)


def test_without_a_cause_detail_the_diagnosed_failure_mode_is_the_cause() -> None:
    log = [dict(r) for r in LOG]
    log[2] = row("node.health_reported", 405, node_id="a", observed_at=405, source="agent",
                 conditions=[{"type": "XidError", "status": "true", "reason": "Xid 79",
                              "since": 400, "details": {"xids": [79]}}])
    jg = account(log, params={"j": P}, start=0, end=1000).jobs["j"]
    assert jg.interruptions() == {"gpu_fell_off_bus": 1}


def test_a_graceful_stop_keeps_its_progress() -> None:
    log = [
        *LOG[:2],
        row("job.interrupt_requested", 300, job_id="j", attempt=1, node_id="a",
            reason="planned_maintenance: scheduled restart"),
        row("job.checkpoint_saved", 310, job_id="j", attempt=1, step=180, path="p",
            saved_at=310),
        row("job.workers_exited", 310, job_id="j", attempt=1, exit_code=75, detail="saved"),
        row("job.requeued", 311, job_id="j", cluster_id="c", restart_count=1, reason="x"),
        row("job.started", 312, job_id="j", attempt=2, node_ids=["a", "b"], resume_step=180),
    ]
    jg = account(log, params={"j": P}, start=0, end=600).jobs["j"]
    assert jg.lost(Badput.WASTED_PROGRESS_FROM_DISRUPTION) == 0
    assert jg.disruptions[0].graceful and jg.disruptions[0].cause == "planned_maintenance"
    # 110..300: one periodic save (10 s), the rest kept; the SIGTERM save 300..310
    assert jg.lost(Badput.UNPRODUCTIVE_CHECKPOINT_SAVE_TIME, "planned_maintenance") == 10
    assert abs(jg.lost(Badput.OTHER)) < 1e-9


def test_confidence_intervals() -> None:
    assert t_quantile(0.975, 19) == pytest.approx(2.093, abs=2e-3)
    assert t_quantile(0.975, 4) == pytest.approx(2.776, abs=5e-3)
    mean, half, sd = mean_ci([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and sd == pytest.approx(1.29099, rel=1e-4)
    assert half == pytest.approx(3.182 * sd / 2, rel=2e-3)


def test_other_nodes_reports_change_nothing_however_many_report() -> None:
    """A job of a large fleet looks for its attempts' faults among its own nodes' reports
    (``_Reports.of``): faults of nodes it never held, in and around its attempts' windows,
    and as many of them as a 131,072-GPU fleet sends, leave its accounting as it was."""
    alone = account(LOG, params={"j": P}, start=0, end=1000, fleet_gpus=32, gpus_per_node=8)
    others = [row("node.health_reported", t, node_id=f"x{i}", observed_at=t, source="agent",
                  conditions=[{"type": "XidError", "status": "true", "reason": "Xid 79",
                               "since": t - 1, "details": {"cause": "faulty_gpu"}}])
              for i in range(40) for t in (15.0 + i, 450.0 + i, 600.0 + i)]
    others += [row("node.diagnosed", t, node_id=f"x{i}", observed_at=t - 1,
                   failure_mode="gpu_fell_off_bus", severity="critical", action="reboot")
               for i in range(40) for t in (16.0 + i, 451.0 + i, 601.0 + i)]
    crowded = account(sorted(LOG + others, key=lambda r: r["time"]), params={"j": P}, start=0,
                      end=1000, fleet_gpus=32, gpus_per_node=8)
    assert crowded.jobs["j"].badput == alone.jobs["j"].badput
    assert crowded.jobs["j"].productive_s == alone.jobs["j"].productive_s
    assert crowded.jobs["j"].disruptions == alone.jobs["j"].disruptions


def test_an_attempt_is_stopped_by_the_first_drain_in_its_window() -> None:
    """Drains are looked up by time (``fault_index.Drains``): one before the attempt began or
    after it stopped is not its signal; the first inside is, and an interrupt request at the
    same instant comes first."""
    def graceful(*signals: dict[str, Any]) -> Any:
        log = [*LOG[:2], *signals,
               row("job.checkpoint_saved", 310, job_id="j", attempt=1, step=180, path="p",
                   saved_at=310),
               row("job.workers_exited", 310, job_id="j", attempt=1, exit_code=75,
                   detail="saved")]
        return account(sorted(log, key=lambda r: r["time"]), params={"j": P}, start=0,
                       end=600).jobs["j"].disruptions[0]

    def drain(t: float, reason: str) -> dict[str, Any]:
        return row("node.draining", t, node_id="a", job_id="j", reason=reason)

    early, late = drain(5, "reimage: too early"), drain(400, "reboot: too late")
    first = graceful(early, drain(250, "reset_gpu: the first"), drain(280, "reboot: second"),
                     late)
    assert first.cause == "reset_gpu" and first.at == 250
    asked = row("job.interrupt_requested", 250, job_id="j", attempt=1, node_id="a",
                reason="planned_maintenance: at the same instant")
    assert graceful(drain(250, "reset_gpu: the first"), asked).cause == "planned_maintenance"
