"""checkpoint_resume's advice: the checkpoint interval a job's own failure rate and measured
save cost call for, in the job view and in the environment file its program reads."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from services.api.custom_jobs import render
from services.api.names import Parent
from services.job_submission import commands as job_commands
from shared.adapters.advice_file import ADVICE_FILE, FileAdviceSink, advice_path
from shared.adapters.compute.ledger import MemoryLedger, report_checkpoints
from shared.config import ControlPlaneConfig
from shared.domain.events import JobCheckpointSaved
from shared.policies.checkpointing import CheckpointPolicy, advise, daly_interval
from tests.harness import Plane, job_body


def test_advice_is_daly_from_the_observed_mtbf_and_the_median_save() -> None:
    policy = CheckpointPolicy()
    a = advise([30.0, 10.0, 20.0, 0.0], interruptions=4, running_s=8 * 3600.0, now=5.0,
               policy=policy)
    assert a is not None and a.basis == "observed" and a.save_s == 20.0
    assert a.mtbf_s == 2 * 3600.0
    assert a.interval_s == pytest.approx(daly_interval(20.0, 7200.0))
    assert a.interval_s == pytest.approx(math.sqrt(2 * 20 * 7200) * (1 + math.sqrt(20 / 14400) / 3
                                                                     + 20 / 14400 / 9) - 20)
    fresh = advise([20.0], interruptions=0, running_s=600.0, now=5.0, policy=policy)
    assert fresh is not None and fresh.basis == "default"
    assert fresh.mtbf_s == policy.default_mtbf_s
    assert advise([0.0], interruptions=3, running_s=100.0, now=5.0, policy=policy) is None
    env = a.env()
    assert env["MTC_CHECKPOINT_INTERVAL_S"] == f"{a.interval_s:.1f}"


def test_the_job_view_and_the_env_file_carry_the_advice(tmp_path: Path) -> None:
    plane = Plane(ControlPlaneConfig(heartbeat_timeout_s=1e9))
    plane.deps = dataclasses.replace(plane.deps, advice=FileAdviceSink(tmp_path))
    plane.up()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    ckpt_dir = tmp_path / "j1" / "checkpoints"
    ckpt_dir.mkdir(parents=True)
    plane.clock.advance(3600)
    plane.inject(JobCheckpointSaved("j1", 1, 100, str(ckpt_dir / "ckpt-100"), plane.clock.now()))
    plane.deliver()
    assert plane.job("j1").checkpoint_advice is None  # no measured save: no advice
    plane.inject(JobCheckpointSaved("j1", 1, 200, str(ckpt_dir / "ckpt-200"), plane.clock.now(),
                                    save_s=45.0))
    plane.deliver()
    job = plane.job("j1")
    advice = job.checkpoint_advice
    assert advice is not None and advice["save_s"] == 45.0 and advice["basis"] == "default"
    env = dict(line.split("=", 1) for line in
               (tmp_path / "j1" / ADVICE_FILE).read_text().splitlines() if "=" in line)
    assert float(env["MTC_CHECKPOINT_INTERVAL_S"]) == pytest.approx(advice["interval_s"], abs=0.1)
    assert advice_path(ckpt_dir) == tmp_path / "j1" / ADVICE_FILE  # what MTC_ADVICE_FILE names
    view = render(job, Parent("p", "l"), "j1", {"resource": {"displayName": "train"}})
    wire = view["mtcProgress"]["checkpointAdvice"]
    assert wire["intervalSeconds"] == pytest.approx(advice["interval_s"])
    assert wire["basis"] == "default" and wire["saveSeconds"] == 45.0


def test_a_path_outside_the_output_root_is_not_written(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "checkpoints"
    outside.mkdir(parents=True)
    FileAdviceSink(tmp_path / "root").publish(str(outside / "ckpt-1"), "j", {"A": "1"})
    assert not (tmp_path / "elsewhere" / ADVICE_FILE).exists()
    with pytest.raises(ValueError):
        FileAdviceSink(tmp_path).publish(str(outside / "ckpt-1"), "j", {"A": "1; rm -rf /"})


def test_the_ledger_reports_the_save_time_a_program_wrote_beside_its_checkpoint(
        tmp_path: Path) -> None:
    (tmp_path / "ckpt-00000010").mkdir()
    (tmp_path / "ckpt-00000010.save_s").write_text("12.5\n")
    (tmp_path / "ckpt-00000020").mkdir()
    (tmp_path / "ckpt-00000020.save_s").write_text("not a number")
    (tmp_path / "ckpt-00000030").mkdir()  # no save time written: not measured
    events = report_checkpoints(MemoryLedger(), "j", 1, str(tmp_path), 5.0)
    assert [(e.step, e.save_s) for e in events] == [(10, 12.5), (20, 0.0), (30, 0.0)]


def test_a_memory_or_peer_save_is_progress_not_a_durable_checkpoint(tmp_path: Path) -> None:
    """A tier-1/2 save (seconds of blocking measured in milliseconds) must not enter the
    durable checkpoint list nor the advice, nor hide the durable save of the same step."""
    plane = Plane(ControlPlaneConfig(heartbeat_timeout_s=1e9))
    plane.up()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    plane.clock.advance(3600)
    for tier in ("memory", "peer"):
        plane.inject(JobCheckpointSaved("j1", 1, 100, f"/shm/{tier}/step-100", plane.clock.now(),
                                        save_s=0.001, tier=tier))
    plane.deliver()
    assert plane.job("j1").checkpoints == [] and plane.job("j1").checkpoint_advice is None
    plane.inject(JobCheckpointSaved("j1", 1, 100, str(tmp_path / "ckpt-100"), plane.clock.now(),
                                    save_s=45.0))
    plane.deliver()
    (saved,) = plane.job("j1").checkpoints
    assert saved.path == str(tmp_path / "ckpt-100") and saved.save_s == 45.0
