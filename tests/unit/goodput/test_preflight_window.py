"""A preflight window in the accounting: logged before the attempt's start (the embedded
default, where the preflight blocks the start) or under way at its logged start (the twin,
which prices it), its time is scheduling badput with cause ``preflight`` and the attempt's
startup starts after it."""

from __future__ import annotations

import pytest

from shared.goodput import Badput, JobParams, account
from tests.unit.goodput.traces import JOB, T0, Played, Trace, play

TRACE = Trace(steps=60, every=20)
PARAMS = JobParams(step_time_s=TRACE.step_s, checkpoint_save_s=TRACE.save_s,
                   checkpoint_restore_s=TRACE.restore_s, startup_s=TRACE.startup_s[0],
                   checkpoint_interval_s=TRACE.every * TRACE.step_s, all_checkpoints=True,
                   measure_startup=True)
WAIT = (Badput.WAITING_FOR_CAPACITY, "preflight")
STARTUP = (Badput.PROGRAM_STARTUP, "initial_start")


def with_preflight(played: Played, started: float, finished: float) -> list[dict[str, object]]:
    row = {"type": "mtc.job.preflight_checked.v1", "time": started,
           "data": {"job_id": JOB, "node_ids": ["n1"], "started_at": started,
                    "finished_at": finished, "mode": "quick", "failed_node_ids": []}}
    return sorted([*played.rows, row], key=lambda r: float(r["time"]))


def test_a_preflight_under_way_at_the_logged_start_moves_the_start_after_it() -> None:
    played = play(TRACE)
    start = next(float(r["time"]) for r in played.rows if r["type"] == "mtc.job.started.v1")
    plain = account(played.rows, params={JOB: PARAMS}, start=T0, end=played.end).jobs[JOB]
    priced = account(with_preflight(played, start, start + 40.0), params={JOB: PARAMS},
                     start=T0, end=played.end).jobs[JOB]
    assert priced.badput[WAIT] == pytest.approx(40.0)
    assert priced.badput[STARTUP] == pytest.approx(plain.badput[STARTUP] - 40.0)


def test_a_preflight_before_the_logged_start_is_waiting_as_it_was() -> None:
    played = play(TRACE)
    start = next(float(r["time"]) for r in played.rows if r["type"] == "mtc.job.started.v1")
    # (the trace starts at submission: a preflight before the start needs waiting before it)
    shifted = [{**r, "time": float(r["time"]) + (50.0 if r["type"] != "mtc.job.submitted.v1"
                                                 else 0.0)} for r in played.rows]
    plain = account(shifted, params={JOB: PARAMS}, start=T0, end=played.end + 50).jobs[JOB]
    checked = Played(rows=shifted)
    priced = account(with_preflight(checked, start + 10.0, start + 50.0), params={JOB: PARAMS},
                     start=T0, end=played.end + 50).jobs[JOB]
    assert priced.badput[WAIT] == pytest.approx(40.0)
    assert priced.badput[STARTUP] == pytest.approx(plain.badput[STARTUP])
