"""mtc's one goodput accounting against Google's public calculator (ml-goodput-measurement).

Each trace is played twice (``traces.play``): as mtc's event log, and as the log entries the
calculator's ``GoodputRecorder`` and Orbax's checkpoint logger would have written to Cloud
Logging. The calculator reads them through its ``cloud_logger`` argument (its own extension
point, here an in-memory log instead of Cloud Logging); mtc reads its log twice, as the twin
does (the scenario's nominal figures: ``account``) and as the live system does (nothing but the
log: ``job_accounting``). All three must give the same goodput, to the millisecond; the
categories differ by the mapping in docs/validation.md, checked here too.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
from ml_goodput_measurement.src import goodput as public

from shared.goodput import Badput, JobParams, account, job_accounting
from tests.unit.goodput.traces import JOB, T0, Fault, Played, Trace, play

MS = 1e-3


class MemoryLog:
    """The calculator's log reader, answering from a list (Cloud Logging cannot run here)."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.job_name = JOB
        self.job_start_time: datetime.datetime | None = None
        self.entries = [{"job_name": JOB, **e} for e in entries]

    def write_cloud_logging_entry(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)

    def flush(self) -> None:
        pass

    def read_cloud_logging_entries(self, start_time: Any = None, end_time: Any = None,
                                   last_entry_info: Any = None) -> tuple[list[Any], Any]:
        last = datetime.datetime.fromtimestamp(T0 + 1e7, tz=datetime.UTC)
        return list(self.entries), (last, str(len(self.entries)))


def calculator(played: Played, tmp: Path) -> tuple[float, dict[str, float]]:
    """(goodput fraction, badput seconds by the calculator's category)."""
    calc = public.GoodputCalculator(JOB, "goodput-log", cloud_logger=MemoryLog(played.entries),
                                    cache_dir=str(tmp))  # type: ignore[arg-type]
    percent, breakdown, _ = calc.get_job_goodput(include_badput_breakdown=True)
    total = played.end - T0
    seconds = {k.name: (sum(v.values()) if isinstance(v, dict) else v) * total / 100.0
               for k, v in breakdown.items()}
    return percent / 100.0, seconds


def twin_params(trace: Trace, *, measure: bool = False) -> JobParams:
    return JobParams(step_time_s=trace.step_s, checkpoint_save_s=trace.save_s,
                     checkpoint_restore_s=trace.restore_s, startup_s=trace.startup_s[0],
                     checkpoint_interval_s=trace.every * trace.step_s, all_checkpoints=True,
                     measure_startup=measure)


ONE_FAILURE = Trace(steps=120, every=20, faults=(Fault(after_s=120 + 2 * 220 + 150),))
SLOW_RESTART = Trace(steps=200, startup_s=(120.0, 900.0),
                     faults=(Fault(after_s=1000, detect_s=40, exit_s=600, wait_s=1800),))
IN_CHECKPOINT = Trace(steps=200, faults=(Fault(after_s=120 + 3 * 120 + 100 + 7),))
TWO_IN_ONE = Trace(steps=200, faults=(Fault(after_s=120 + 2 * 120 + 55),
                                      Fault(after_s=120 + 60 + 70, cause="network")))
# the case: a checkpoint every 10 min of steps, a fault 500 s after one (live used to
# report 95% runtime goodput and no lost steps on such a trace)
LATE_FAULT = Trace(steps=180, every=60, faults=(Fault(after_s=120 + 620 + 500, wait_s=215),))
TRACES = {"one_failure": ONE_FAILURE, "late_fault": LATE_FAULT, "slow_restart": SLOW_RESTART,
          "failure_during_checkpoint": IN_CHECKPOINT, "two_failures_in_one_interval": TWO_IN_ONE}


@pytest.mark.parametrize("name", sorted(TRACES))
def test_live_and_twin_goodput_equal_the_public_calculator(name: str, tmp_path: Path) -> None:
    trace = TRACES[name]
    played = play(trace)
    expected, _ = calculator(played, tmp_path)
    # the twin's path: the nominal figures (a slow restart: startup measured per attempt)
    params = twin_params(trace, measure=name == "slow_restart")
    twin = account(played.rows, params={JOB: params}, start=T0, end=played.end).jobs[JOB]
    live = job_accounting(played.rows, JOB)
    assert live.goodput is not None
    assert twin.ettr == pytest.approx(expected, abs=MS / twin.total_s)
    assert live.goodput.ettr == pytest.approx(expected, abs=MS / twin.total_s)
    assert twin.productive_s == pytest.approx(live.goodput.productive_s, abs=MS)
    assert live.restarts == len(trace.faults)
    # the truth, independently: every step once, nothing else
    assert twin.productive_s == pytest.approx(trace.steps * trace.step_s, abs=MS)


def test_categories_map_onto_the_calculators(tmp_path: Path) -> None:
    """docs/validation.md's mapping, on the one-failure trace: the same seconds per bucket."""
    played = play(ONE_FAILURE)
    _, public_s = calculator(played, tmp_path)
    jg = account(played.rows, params={JOB: twin_params(ONE_FAILURE)}, start=T0,
                 end=played.end).jobs[JOB]
    ours = jg.by_category()
    assert ours["PROGRAM_STARTUP"] == pytest.approx(public_s["TRAINING_PREP"], abs=MS)
    assert ours["UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"] == pytest.approx(
        public_s["UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"], abs=MS)
    assert ours["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"] == pytest.approx(
        public_s["UNPRODUCTIVE_CHECKPOINT_RESTORE_TIME"], abs=MS)
    # the calculator counts a disruption from the start of the last step it saw, mtc from the
    # fault (the condition's since): the partial step moves between the two buckets, and mtc
    # splits the recovery at the requeue (waiting for a node is scheduling badput)
    ours_disruption = (ours["WASTED_PROGRESS_FROM_DISRUPTION"]
                       + ours["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"]
                       + ours["WAITING_FOR_CAPACITY"])
    theirs = (public_s["WASTED_PROGRESS_FROM_DISRUPTION"]
              + public_s["INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION"])
    assert ours_disruption == pytest.approx(theirs, abs=MS)
    assert ours["WASTED_PROGRESS_FROM_DISRUPTION"] == pytest.approx(150, abs=MS)
    assert jg.by_cause()["faulty_gpu"] > 0


def test_live_counts_500_s_lost_since_the_last_checkpoint_as_50_steps(tmp_path: Path) -> None:
    played = play(LATE_FAULT)
    live = job_accounting(played.rows, JOB)
    assert live.goodput is not None
    assert live.goodput.lost(Badput.WASTED_PROGRESS_FROM_DISRUPTION) == pytest.approx(500, abs=MS)
    assert live.lost_steps == 50
    expected, _ = calculator(played, tmp_path)
    assert live.goodput.ettr == pytest.approx(expected, abs=MS / live.goodput.total_s)


def test_live_counts_the_progress_lost_since_the_last_checkpoint() -> None:
    played = play(ONE_FAILURE)
    live = job_accounting(played.rows, JOB)
    assert live.goodput is not None
    wasted = live.goodput.lost(Badput.WASTED_PROGRESS_FROM_DISRUPTION)
    # the fault came 150 s after the checkpoint at step 40 (startup, two 220 s stretches)
    assert wasted == pytest.approx(150, abs=MS)
    assert live.lost_steps == round(wasted / ONE_FAILURE.step_s)
    assert live.lost_steps > 0 and live.runtime_goodput < 0.95
