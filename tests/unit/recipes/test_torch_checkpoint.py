"""The checkpoint helper in one process: a save is a complete ``ckpt-<step>`` directory the
control plane's scan accepts (and a half-written one is neither loaded nor scanned), restore
brings back weights, optimizer, scheduler, loader position and every RNG exactly, SIGTERM
turns into a save and exit 75; the hypertune reporter writes the tuning service's file."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path
from typing import Any

import pytest

from shared.adapters.compute.protocol import checkpoint_steps

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")


class Position:
    def __init__(self) -> None:
        self.index = 0

    def state_dict(self) -> dict[str, Any]:
        return {"index": self.index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.index = int(state["index"])


def parts(seed: int) -> tuple[Any, Any, Any, Position]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    return model, opt, sched, Position()


def step(model: Any, opt: Any, sched: Any, pos: Position) -> None:
    x = torch.randn(3, 4) + float(np.random.rand()) + random.random()
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    sched.step()
    pos.index += 3


def test_restore_is_exact_and_only_complete_checkpoints_count(tmp_path: Path) -> None:
    from mtc_program.torch_checkpoint import Checkpointer, complete_checkpoints, deterministic

    deterministic(0)
    a = parts(0)
    ck = Checkpointer(tmp_path, a[0], a[1], extra={"sched": a[2], "pos": a[3]}, log=lambda _: None)
    for _ in range(3):
        step(*a)
    path = ck.save(3)
    assert path.name == "ckpt-00000003" and (path / ".metadata").is_file()
    assert float((tmp_path / "ckpt-00000003.save_s").read_text()) > 0
    for _ in range(2):
        step(*a)
    # a torn save: its temp dir, and a final-named dir without .metadata, are both ignored
    (tmp_path / ".ckpt-00000009.tmp").mkdir()
    (tmp_path / "ckpt-00000007").mkdir()
    assert sorted(complete_checkpoints(tmp_path)) == [3]
    assert 9 not in checkpoint_steps(tmp_path)

    b = parts(1)  # other weights, other RNG: all replaced by the restore
    random.seed(5)
    np.random.seed(5)
    restored = Checkpointer(tmp_path, b[0], b[1], extra={"sched": b[2], "pos": b[3]},
                            log=lambda _: None)
    assert restored.restore() == 3
    assert b[3].index == 9 and b[2].last_epoch == 3
    for _ in range(2):
        step(*b)
    for pa, pb in zip(a[0].parameters(), b[0].parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_sigterm_saves_and_asks_for_exit_75(tmp_path: Path) -> None:
    from mtc_program.torch_checkpoint import EXIT_PREEMPTED, Checkpointer, Preemption

    model, opt, _, _ = parts(0)
    pre = Preemption()
    ck = Checkpointer(tmp_path, model, opt, every=100, preemption=pre, log=lambda _: None)
    assert ck.after_step(1, 10) is None and not list(tmp_path.iterdir())
    pre._handle(signal.SIGTERM, None)
    closed: list[bool] = []
    assert ck.after_step(2, 10, before_save=lambda: closed.append(True)) == EXIT_PREEMPTED
    assert closed == [True] and sorted(checkpoint_steps(tmp_path)) == [2]


def test_a_trial_reports_its_metric_through_hypertune(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("hypertune")
    from mtc_program.torch_runtime import Hypertune

    metric = tmp_path / "output.metrics"
    monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(metric))
    Hypertune(None, "loss").report(1.0, 1)  # not a trial: nothing
    assert not metric.exists()
    Hypertune("7", "loss").report(1.25, 40)
    line = json.loads(metric.read_text().splitlines()[-1])
    assert line["loss"] == "1.25" or float(line["loss"]) == 1.25
    assert int(line["global_step"]) == 40


def test_a_rank_the_saving_world_lacked_restores_the_rest(tmp_path: Path) -> None:
    """A job that grew: its checkpoint was saved by fewer ranks, so the new rank's random
    state is not in it; the new rank loads the weights and keeps its seeded generators."""
    from mtc_program.torch_checkpoint import Checkpointer

    a = parts(0)
    Checkpointer(tmp_path, a[0], a[1], log=lambda _: None).save(4)  # rank 0 alone saved
    b = parts(1)
    said: list[str] = []
    joining = Checkpointer(tmp_path, b[0], b[1], log=said.append)
    joining.rank = 1  # as rank 1 of the grown world would
    torch.manual_seed(7)
    expected = torch.get_rng_state()
    assert joining.restore() == 4
    assert all(torch.equal(x, y) for x, y in zip(a[0].state_dict().values(),
                                                 b[0].state_dict().values(), strict=True))
    assert torch.equal(torch.get_rng_state(), expected)
    assert any("no random state for rank 1" in line for line in said), said
