"""`make demo-torch`'s story, small: the pretrain recipe on 2 nodes x 2
ranks through an XID 79 (drain, checkpoint on SIGTERM, resume on another node) and a SIGKILL
of one rank (the gang ends, its exit names the killed rank, it resumes from its checkpoint).
Real processes: torchrun per node, torch.distributed over gloo, torch.distributed.checkpoint.
Fewest steps that still cross a checkpoint before each fault: 9 steps, one every 3."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from services.cli.demo import demo_compute_options, demo_config
from services.cli.demo_torch import JOB_ID, TorchStory, run_torch_demo
from services.wiring.embedded import embedded
from shared.domain.model import JobState

pytestmark = pytest.mark.slow
pytest.importorskip("torch")
pytest.importorskip("transformers.models.llama.modeling_llama")


def test_pretrain_heals_through_xid79_and_a_killed_rank(tmp_path: Path) -> None:
    app = embedded(tmp_path / "state", config=demo_config(torch=True),
                   compute_options=demo_compute_options())
    try:
        outcome = run_torch_demo(app, TorchStory(steps=9, every=3, sleep_s=0.3))
        with app.uow() as uow:
            job = uow.jobs.get(JOB_ID)
        assert job is not None
        assert app.deps.event_log is not None
        exits = [d["data"] for d in app.deps.event_log.read()
                 if d["type"] == "mtc.job.workers_exited.v1"]
    finally:
        app.close()
    assert outcome.state is JobState.SUCCEEDED and outcome.restarts == 2
    # the SIGKILLed rank's exit is named in its attempt's exit, whichever node's exit the
    # poll read first (the other ranks fail on the broken collective at the same moment)
    assert any(f": {128 + signal.SIGKILL}" in e["detail"] for e in exits), exits
    assert job.attempt == 3
    assert outcome.steps_logged == list(range(1, 10))  # one continuous curve, each step once
    assert outcome.equal, outcome.unequal  # torch.equal with the uninterrupted run's weights
    assert Path(outcome.tensorboard_dir).is_dir()
