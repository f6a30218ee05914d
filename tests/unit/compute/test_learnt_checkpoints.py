"""Checkpoints whatever their names: a program that does not name its checkpoints
``ckpt-<step>`` is learnt from what it writes under ``AIP_CHECKPOINT_DIR`` (a complete new file
or directory whose name has a number), and mtc says so where it learns nothing."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from mtc_program.protocol import SETTLE_S, learnt_step
from shared.adapters.compute.ledger import MemoryLedger, report_checkpoints
from shared.adapters.compute.protocol import checkpoint_steps


@pytest.mark.parametrize(("name", "step"), [
    ("step-000120.pt", 120),
    ("epoch=2-step=300.ckpt", 300),  # Lightning: the step, not the epoch
    ("checkpoint-500", 500),  # Hugging Face's Trainer (a directory)
    ("global_step120", 120),  # DeepSpeed
    ("model_iter_4000.pt", 4000),
    ("attempt-2-step-100.pt", 100),  # "temp" inside a word is no temporary name
    ("model.pt", None),  # no number: mtc cannot tell its step
    ("model.pt2", None),  # a number in the extension is no step
    ("latest", None),
    ("step-100.pt.tmp", None),
    ("step-100.pt.part", None),
    ("tmpk3j9_1", None),  # tempfile's names
    ("temp-100.pt", None),
    (".step-100.pt", None),
    ("step-100.pt~", None),
    ("metrics-120.json", None),  # text beside the checkpoints
    ("events.out.tfevents.1700000000.host.1", None),
])
def test_the_step_a_name_gives(name: str, step: int | None) -> None:
    assert learnt_step(name) == step


def settled(path: Path, ago: float = SETTLE_S + 60.0) -> Path:
    """``path`` and what it holds last modified ``ago`` seconds ago."""
    then = time.time() - ago
    for p in [*path.rglob("*"), path] if path.is_dir() else [path]:
        os.utime(p, (then, then), follow_symlinks=False)
    return path


def test_complete_files_and_directories_are_learnt(tmp_path: Path) -> None:
    (tmp_path / "step-000120.pt").write_bytes(b"x")
    (tmp_path / "checkpoint-500").mkdir()
    (tmp_path / "checkpoint-500" / "model.safetensors").write_bytes(b"w")
    (tmp_path / "model.pt").write_bytes(b"no step in the name")
    (tmp_path / "step-000130.pt.tmp").write_bytes(b"being written")
    assert checkpoint_steps(tmp_path) == {}  # just written: maybe not whole yet
    settled(tmp_path / "step-000120.pt")
    settled(tmp_path / "checkpoint-500")
    assert checkpoint_steps(tmp_path) == {120: tmp_path / "step-000120.pt",
                                          500: tmp_path / "checkpoint-500"}
    (tmp_path / "checkpoint-500" / "optimizer.pt").write_bytes(b"still saving")
    assert sorted(checkpoint_steps(tmp_path)) == [120]  # a file inside it changed: not yet
    assert sorted(checkpoint_steps(tmp_path, complete_before=math.inf)) == [120, 500]
    assert sorted(checkpoint_steps(tmp_path, seen={120}, complete_before=math.inf)) == [500]


def test_a_symlink_is_not_a_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "step-1.pt"
    target.write_bytes(b"x")
    settled(target)
    (tmp_path / "last-2.pt").symlink_to(target)
    assert sorted(checkpoint_steps(tmp_path, complete_before=math.inf)) == [1]


def test_the_protocols_names_win(tmp_path: Path) -> None:
    """A directory with a ``ckpt-<step>`` entry follows the protocol: its other numbered
    entries (a program's own files, a half-written save's) are not checkpoints."""
    (tmp_path / "ckpt-00000010.pt").write_bytes(b"x")
    (tmp_path / "step-20.pt").write_bytes(b"x")
    settled(tmp_path / "step-20.pt")
    assert sorted(checkpoint_steps(tmp_path, complete_before=math.inf)) == [10]
    (tmp_path / "ckpt-00000010.pt").unlink()
    (tmp_path / "ckpt-00000030.pt.tmp").write_bytes(b"")  # its first save, under way
    assert checkpoint_steps(tmp_path, complete_before=math.inf) == {}
    (tmp_path / "ckpt-00000030.pt.tmp").unlink()
    (tmp_path / "ckpt-latest.pt").write_bytes(b"")  # a name of its own after all
    assert sorted(checkpoint_steps(tmp_path, complete_before=math.inf)) == [20]


def test_each_learnt_step_is_reported_once(tmp_path: Path) -> None:
    store = MemoryLedger()
    (tmp_path / "step-000120.pt").write_bytes(b"x")
    assert report_checkpoints(store, "j", 1, str(tmp_path), 0.0) == []  # not settled
    saved = report_checkpoints(store, "j", 1, str(tmp_path), 1.0, writers_done=True)
    assert [(e.step, e.path) for e in saved] == [(120, str(tmp_path / "step-000120.pt"))]
    assert report_checkpoints(store, "j", 2, str(tmp_path), 2.0, writers_done=True) == []
