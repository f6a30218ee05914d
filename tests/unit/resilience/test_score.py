"""Scoring incidents on a synthetic event log: detect, recover, steps lost, mode, goodput."""

from __future__ import annotations

from typing import Any

import pytest

from shared.resilience.score import Injected, recover_ratio, score_incidents, score_run

JOB = "j"


def row(t: float, kind: str, **data: Any) -> dict[str, Any]:
    return {"type": f"mtc.{kind}.v1", "time": t, "data": data}


def ckpt(t: float, attempt: int, step: int) -> dict[str, Any]:
    return row(t, "job.checkpoint_saved", job_id=JOB, attempt=attempt, step=step, path="p",
               saved_at=t)


def log(*, recovery: str | None = None) -> list[dict[str, Any]]:
    """Attempt 1 at 0.1 s a step from t=100; an XID 79 on n1 at 103.05 (step 25); attempt 2
    resumes from step 20 at 105 and checkpoints step 30 at 106."""
    rows = [row(99.0, "job.submitted", job_id=JOB, cluster_id="c"),
            row(100.0, "job.started", job_id=JOB, attempt=1, node_ids=["n0", "n1"],
                resume_step=-1),
            ckpt(101.0, 1, 10), ckpt(102.0, 1, 20),
            # a routine diagnosis of another node, and an ok one of n1: not a reaction
            row(103.1, "node.diagnosed", node_id="n9", observed_at=103.1, failure_mode="x",
                severity="critical", action="reboot"),
            row(103.2, "node.diagnosed", node_id="n1", observed_at=103.2, failure_mode="ok",
                severity="ok", action="none"),
            row(103.3, "node.diagnosed", node_id="n1", observed_at=103.3,
                failure_mode="gpu_fell_off_bus", severity="critical", action="reboot"),
            row(103.4, "node.draining", node_id="n1", job_id=JOB, reason="xid"),
            row(104.0, "job.workers_exited", job_id=JOB, attempt=1, exit_code=75),
            row(104.1, "job.requeued", job_id=JOB, cluster_id="c", restart_count=1),
            row(105.0, "job.started", job_id=JOB, attempt=2, node_ids=["n0", "n2"],
                resume_step=20),
            ckpt(106.0, 2, 30), ckpt(107.0, 2, 40)]
    if recovery:
        rows.append(row(103.9, "job.recovery_chosen", job_id=JOB, attempt=1, mode=recovery,
                        incident="node_repair", reason="cheapest", expected_lost_s=[]))
    return rows


def test_a_requeue_is_scored_from_the_log() -> None:
    [s] = score_incidents(log(), JOB, [Injected(0, "xid_79", 103.05, "n1", 1, 25)])
    assert s.detected_s == pytest.approx(0.25) and s.detected_by == "diagnosis"
    assert s.recovered_s == pytest.approx(106.0 - 103.05)  # attempt 2's first checkpoint
    assert s.stopped and s.resume_step == 20 and s.steps_lost == 5
    assert s.mode == "requeue" and not s.step_estimated


def test_the_mode_comes_from_the_recovery_decision() -> None:
    [s] = score_incidents(log(recovery="hot_swap"), JOB, [Injected(0, "xid_79", 103.05, "n1")])
    assert s.mode == "hot_swap"
    decisions = [{"at": 103.5, "mode": "in_place", "expected_lost_s": 1.0}]
    [s] = score_incidents(log(), JOB, [Injected(0, "xid_79", 103.05, "n1")],
                          decisions=decisions)
    assert s.mode == "in_place" and s.expected_lost_s == 1.0


def test_the_step_at_the_fault_is_estimated_from_the_pace() -> None:
    [s] = score_incidents(log(), JOB, [Injected(0, "xid_79", 103.05, "n1")])
    # newest checkpoint step 20 at 102.0, pace 0.1 s a step: step 30 at 103.05
    assert s.step_estimated and s.step_at_fault == 30 and s.steps_lost == 10


def test_a_first_step_beats_the_first_checkpoint_and_samples_count() -> None:
    rows = [*log(), row(105.5, "job.first_step", job_id=JOB, attempt=2, step=21)]
    [s] = score_incidents(rows, JOB, [Injected(0, "xid_79", 103.05, "n1", 1, 25)])
    assert s.recovered_s == pytest.approx(105.5 - 103.05)
    [s] = score_incidents(log(), JOB, [Injected(0, "xid_79", 103.05, "n1", 1, 25)],
                          samples=[(105.2, 2, 21)])
    assert s.recovered_s == pytest.approx(105.2 - 103.05)


def test_training_that_never_stopped_loses_nothing() -> None:
    rows = [row(100.0, "job.started", job_id=JOB, attempt=1, node_ids=["n0"], resume_step=-1),
            ckpt(101.0, 1, 10), ckpt(102.0, 1, 20), ckpt(103.0, 1, 30)]
    [s] = score_incidents(rows, JOB, [Injected(0, "no_spare_elastic", 102.5, "n0", 0, 25)])
    assert not s.stopped and s.steps_lost == 0 and s.mode == "none"
    assert s.recovered_s == pytest.approx(0.5)


def test_each_incident_ends_where_the_next_begins() -> None:
    rows = log()
    two = [Injected(1, "app_crash", 106.5, "n0", 0, 35), Injected(0, "xid_79", 103.05, "n1")]
    first, second = score_incidents(rows, JOB, two)
    assert (first.index, second.index) == (0, 1)
    assert first.recovered_s == pytest.approx(106.0 - 103.05)
    # no reaction to the second; its attempt kept checkpointing (step 40 at 107)
    assert second.detected_s is None and not second.stopped
    assert second.recovered_s == pytest.approx(0.5) and second.step_at_fault == 40


def test_the_run_has_goodput_and_a_ratio_against_requeue() -> None:
    run = score_run(log(), JOB, [Injected(0, "xid_79", 103.05, "n1", 1, 25)], label="chosen",
                    target="embedded")
    assert 0 < run.goodput["runtime_goodput"] < 1 and run.goodput["restarts"] == 1
    assert run.goodput["step_time_s"] == pytest.approx(0.1)
    slow = score_run([*log()[:-2], ckpt(109.0, 2, 30)], JOB,
                     [Injected(0, "xid_79", 103.05, "n1", 1, 25)], label="requeue",
                     target="embedded")
    [r] = recover_ratio(run, slow)
    assert r["ratio"] == pytest.approx((109.0 - 103.05) / (106.0 - 103.05))


def test_a_restore_the_runner_read_beats_the_durable_resume_step() -> None:
    # attempt 2 restored step 24 from memory, newer than the durable step 20 it names
    [s] = score_incidents(log(), JOB, [Injected(0, "app_crash", 103.05, "n1", 1, 25)],
                          resumes={2: 24})
    assert s.resume_step == 24 and s.steps_lost == 1


def test_tier_saves_of_other_ranks_are_no_progress_when_the_chief_is_read() -> None:
    # a fast rank's memory save right after the restart, the chief's first step later
    rows = [*log(), row(105.2, "job.checkpoint_saved", job_id=JOB, attempt=2, step=60,
                        path="m", saved_at=105.2, tier="memory")]
    inc = [Injected(0, "xid_79", 103.05, "n1", 1, 25)]
    [s] = score_incidents(rows, JOB, inc)
    assert s.recovered_s == pytest.approx(105.2 - 103.05)
    [s] = score_incidents(rows, JOB, inc, samples=[(105.6, 2, 21)], tier_events=False)
    assert s.recovered_s == pytest.approx(105.6 - 103.05)
