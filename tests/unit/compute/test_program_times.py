"""Startup and saves are timed when the program did them, not when a scan read its
heartbeat (every ``TIER_SCAN_S``): the program's heartbeat says when (``first_step_at``,
``newest_at``), the adapters' facts carry it, and the measured startup, the decisions'
measured seconds and the goodput accounting use it."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from mtc_program.progress import RankProgress
from mtc_program.tiers import TieredCheckpointer, TierSettings
from services.job_submission import commands as job_commands
from shared.adapters.compute.ledger import MemoryLedger, report_first_step, report_tier_saves
from shared.adapters.compute.protocol import progress_path
from shared.config import ControlPlaneConfig
from shared.domain.events import JobCheckpointSaved, JobFirstStep
from shared.domain.model import JobState
from shared.goodput import job_accounting
from shared.resilience.score import progress_samples
from tests.harness import Plane, job_body, xid

QUIET = replace(ControlPlaneConfig(), heartbeat_timeout_s=1e12)


def write_beat(ckpt: Path, rank: int, **body: Any) -> None:
    path = progress_path(ckpt, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body))


def test_the_first_step_is_stamped_with_the_programs_time(tmp_path: Path) -> None:
    store = MemoryLedger()
    ckpt = tmp_path / "checkpoints"
    write_beat(ckpt, 0, attempt=2, step=40, time=103.0, first_step_at=None)
    assert report_first_step(store, "j", 2, str(ckpt), 104.0) is None  # restored, no step yet
    write_beat(ckpt, 0, attempt=2, step=41, time=103.5, first_step_at=101.25)
    assert report_first_step(store, "j", 2, str(ckpt), 105.0) == JobFirstStep("j", 2, 41, 101.25)


def test_a_heartbeat_that_does_not_say_gives_its_time_never_a_later_one(tmp_path: Path
                                                                        ) -> None:
    store = MemoryLedger()
    ckpt = tmp_path / "checkpoints"
    write_beat(ckpt, 0, attempt=2, step=41, time=103.5)
    assert report_first_step(store, "j", 2, str(ckpt), 105.0) == JobFirstStep("j", 2, 41, 103.5)
    write_beat(ckpt, 0, attempt=3, step=50, time=999.0, first_step_at=998.0)  # a clock ahead
    assert report_first_step(store, "j", 3, str(ckpt), 110.0) == JobFirstStep("j", 3, 50, 110.0)


def test_a_tier_save_is_stamped_when_its_last_rank_wrote_it(tmp_path: Path) -> None:
    store = MemoryLedger()
    ckpt = tmp_path / "checkpoints"
    dirs = {"memory": "/m", "peer": "/p"}
    write_beat(ckpt, 0, attempt=2, time=60.0, dirs=dirs, newest={"memory": 20, "peer": 15},
               newest_at={"memory": 52.0, "peer": 50.0})
    write_beat(ckpt, 1, attempt=2, time=61.0, dirs=dirs, newest={"memory": 20, "peer": 20},
               newest_at={"memory": 51.0, "peer": 53.0})
    got = {e.tier: e.saved_at for e in report_tier_saves(store, "j", 2, str(ckpt), 2, 64.0)}
    # peer: step 15, whole once rank 0 wrote it (rank 1, ahead, wrote it before its 20)
    assert got == {"memory": 52.0, "peer": 50.0}


def test_the_library_records_its_first_step_and_its_writes(tmp_path: Path) -> None:
    beat = tmp_path / "progress" / "rank-0.json"
    s = TierSettings(rank=0, world_size=1, durable_dir=tmp_path / "durable",
                     tier1_dir=tmp_path / "n0" / "rank-0", tier2_dir=tmp_path / "n1" / "peer",
                     tier1_every=5, tier2_every=5, tier3_every=0, replicated=False,
                     attempt=None, restore_timeout_s=10.0, progress_file=beat,
                     progress_interval_s=3600.0)
    cp = TieredCheckpointer(s, log=lambda _: None)
    before = time.time()
    for step in range(1, 6):
        cp.maybe_save(step, {"w": np.full(3, step, dtype=np.float32)})
    cp.flush()
    cp.close()
    body = json.loads(beat.read_text())
    assert before <= body["first_step_at"] <= body["newest_at"]["memory"] <= time.time()
    again = TieredCheckpointer(s, log=lambda _: None)
    restored = again.restore()
    assert restored is not None and restored.step == 5
    body = json.loads(beat.read_text())
    assert body["step"] == 5 and body["first_step_at"] is None  # a restore is no step
    assert body["newest_at"] == {}
    stepped = time.time()
    again.step_done(6)
    assert json.loads(beat.read_text())["first_step_at"] >= stepped
    progress = RankProgress(tmp_path / "plain.json", 0, 1, interval_s=3600.0)
    assert progress.fields()["first_step_at"] is None
    progress.step_done(1)
    first = progress.fields()["first_step_at"]
    progress.step_done(2)
    assert first is not None and progress.fields()["first_step_at"] == first
    progress.close()


def test_startup_and_measured_seconds_are_read_from_the_programs_time() -> None:
    plane = Plane(QUIET).up()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    for step, tier in ((100, "durable"), (190, "peer"), (195, "memory")):
        plane.inject(JobCheckpointSaved(job_id="j1", attempt=1, step=step, path=f"f://{step}",
                                        saved_at=plane.clock.now(), save_s=0.1, tier=tier))
        plane.deliver()
    plane.clock.advance(5)
    plane.report(plane.job("j1").node_ids[0], xid(13, plane.clock.now()))
    plane.deliver()
    plane.exit_workers("j1", 1, 75)  # in place: attempt 2 at once
    job = plane.job("j1")
    assert job.state is JobState.RUNNING and job.attempt == 2
    started = job.recovery.attempt_started_at
    fault = job.recovery.decisions[-1]["at"]
    assert started is not None
    plane.clock.advance(2.0)  # the scan's reading, 2 s after the step it reports
    plane.inject(JobFirstStep(job_id="j1", attempt=2, step=196, at=started + 0.25))
    plane.deliver()
    job = plane.job("j1")
    warm_restore = 0.1  # its measured memory save stands in for the restore
    assert job.recovery.startup["warm"] == round(0.25 - warm_restore, 3)
    assert job.recovery.decisions[-1]["measured_s"] == round(started + 0.25 - fault, 3)
    rows = [{"type": e.type, "time": e.time, "data": e.event.to_dict()} for e in plane.delivered]
    assert (started + 0.25, 2, 196) in progress_samples(rows, "j1")
    # goodput: attempt 2's startup ends at the program's time, 1.75 s before the report
    # (less the nominal step time the accounting takes off either)
    said = job_accounting(rows, "j1", now=plane.clock.now()).goodput
    unsaid = [{**r, "data": {k: v for k, v in r["data"].items() if k != "at"}} for r in rows]
    read = job_accounting(unsaid, "j1", now=plane.clock.now()).goodput
    assert said is not None and read is not None
    assert said.productive_s > read.productive_s + 0.5
