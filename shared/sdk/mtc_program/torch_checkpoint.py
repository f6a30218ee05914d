"""Checkpoints the PyTorch way, for programs mtc runs (the ``torch`` extra).

``Checkpointer`` saves and restores, with ``torch.distributed.checkpoint`` (``dcp.save`` /
``dcp.load``; the model and optimizer through ``get_state_dict`` / ``set_state_dict``, so a
DDP wrapper's prefix and the optimizer's lazily built state are handled the PyTorch way):

* the model, the optimizer, the LR scheduler and the data loader's position (any
  ``Stateful``: ``state_dict()`` / ``load_state_dict()``);
* each rank's random states (torch CPU, CUDA when there is one, numpy, python ``random``),
  under a key of its own (``rng.rank<r>``), so a resumed rank draws what it would have drawn.

Where: ``AIP_CHECKPOINT_DIR/ckpt-<step:08d>/``, the name the control plane's checkpoint scan
knows (``mtc_program.protocol``). Atomically: every rank writes into
``.ckpt-<step>.tmp`` (a name the scan ignores), ``dcp.save`` returns on every rank only once
the coordinator has written ``.metadata``, then rank 0 renames the directory and writes the
save's blocking seconds beside it (``ckpt-<step>.save_s``, which feeds mtc's checkpoint
advice). A ``ckpt-*`` directory without ``.metadata`` is not complete and never loaded.

When: every ``every`` steps, and when any rank got SIGTERM (``Preemption``) or an order to
hold (``held``: ``torch_inprocess``); the ranks agree on the step with one small all-reduce
per step (a signal reaches ranks at different steps), save together (the near tiers too,
when there are some), and the program exits 75 (``EXIT_PREEMPTED``: the worker protocol's
"checkpoint saved, run me again"), or, held, is restarted in its process.

Determinism (what the bit-exact resume test relies on): ``deterministic()`` sets
``torch.use_deterministic_algorithms(True)`` and one intra-op thread. On CPU with gloo every
op the recipes use is then deterministic (gloo's all-reduce of two ranks adds two numbers in
the same order each time), so a resumed run's weights equal an uninterrupted run's
(``torch.equal``). On GPUs NCCL's all-reduce and a few CUDA kernels (scatter_add/index_add
with atomics) are not bit-reproducible; there the difference is bounded by float32 rounding
per step (relative ~1e-6 per reduction), not by the checkpoint, which restores exactly.
"""

from __future__ import annotations

import os
import pickle
import random
import shutil
import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from mtc_program.protocol import CHECKPOINT_PREFIX, SAVE_S_SUFFIX, ExitCode, checkpoint_name
from mtc_program.signals import Preemption
from mtc_program.torch_tiers import STATE_KEY, TorchTiers, load_into

__all__ = ["EXIT_OK", "EXIT_PREEMPTED", "Checkpointer", "Preemption", "RngState", "TrainingState",
           "checkpoint_name", "complete_checkpoints", "deterministic", "load_model_weights"]

# one process saves alone (no process group): dcp's warning about it says nothing new
warnings.filterwarnings("ignore", message="torch.distributed is disabled")
EXIT_OK, EXIT_PREEMPTED = int(ExitCode.OK), int(ExitCode.PREEMPTED)
METADATA = ".metadata"


def deterministic(seed: int) -> None:
    """Settings under which a resumed CPU run is bit-equal to an uninterrupted one."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def complete_checkpoints(directory: Path) -> dict[int, Path]:
    """``ckpt-<step>`` directories holding ``.metadata`` (complete), by step."""
    found: dict[int, Path] = {}
    try:
        entries = list(directory.iterdir())
    except OSError:
        return found
    for entry in entries:
        name = entry.name
        digits = name.removeprefix(CHECKPOINT_PREFIX)
        if digits != name and digits.isdigit() and (entry / METADATA).is_file():
            found[int(digits)] = entry
    return found


class RngState:
    """This rank's random generators as a ``Stateful`` (numpy and python states pickled)."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"torch": torch.get_rng_state(),
                                 "host": pickle.dumps((np.random.get_state(), random.getstate()))}
        if torch.cuda.is_available():
            state["cuda"] = pickle.dumps(torch.cuda.get_rng_state_all())
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        np_state, py_state = pickle.loads(state["host"])
        np.random.set_state(np_state)
        random.setstate(py_state)
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(pickle.loads(state["cuda"]))


class TrainingState:
    """Model and optimizer through the ``state_dict`` helpers (DDP-aware), as a Stateful."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])


class Checkpointer:
    """Save every ``every`` steps and on preemption; restore the newest complete checkpoint.

    ``extra``: further ``Stateful`` objects by name (the LR scheduler, the loader position).
    Works in one process too (no process group: ``dcp`` runs with ``no_dist``)."""

    def __init__(self, directory: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 *, every: int = 0, extra: Mapping[str, Any] | None = None,
                 preemption: Preemption | None = None, log: Any = print,
                 tiers: TorchTiers | None = None, held: Callable[[], bool] | None = None
                 ) -> None:
        self.directory, self.every, self.log = Path(directory), every, log
        self.tiers = tiers
        self.held = held
        self.training = TrainingState(model, optimizer)
        self.extra = dict(extra or {})
        self.preemption = preemption
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.saved_step = -1
        self.last_save_s = 0.0

    def _state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"train": self.training, f"rng.rank{self.rank}": RngState()}
        state.update({f"extra.{k}": v for k, v in self.extra.items()})
        return state

    def _barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    def restore(self) -> int:
        """Load the newest complete checkpoint; its step (0: none, start fresh)."""
        found = complete_checkpoints(self.directory)
        if self.distributed:  # every rank loads the same one (rank 0's view decides)
            box = [max(found, default=0)]
            dist.broadcast_object_list(box, src=0)
            step = int(box[0])
        else:
            step = max(found, default=0)
        if self.tiers is not None:  # every rank takes part: the agreement waits for all
            near = self.tiers.restore()
            # the same step nearer is the same state, read faster (every rank decides alike:
            # the near step is agreed, the durable one broadcast)
            if near is not None and near.step >= step:
                started = time.perf_counter()
                load_into(self._state(), bytes(near.state[STATE_KEY]))
                self.saved_step = near.step
                self.log(f"restoring step {near.step} from the {near.tier} tier ({near.path}) "
                         f"in {time.perf_counter() - started:.3f}s")
                return near.step
        if step == 0:
            return 0
        path = self.directory / checkpoint_name(step)
        started = time.perf_counter()
        state = self._state()
        rng = f"rng.rank{self.rank}"
        saved = FileSystemReader(str(path)).read_metadata().state_dict_metadata
        if not any(k.startswith(f"{rng}.") for k in saved):
            # a rank the saving world did not have (the job grew): its generators stay seeded
            del state[rng]
            self.log(f"{path.name} holds no random state for rank {self.rank}: kept as seeded")
        dcp_load(state, checkpoint_id=str(path), no_dist=not self.distributed)
        self.saved_step = step
        self.log(f"resumed from {path.name} in {time.perf_counter() - started:.3f}s")
        return step

    def save(self, step: int) -> Path:
        """Save ``step`` on every rank (collective); rank 0 publishes it atomically."""
        final = self.directory / checkpoint_name(step)
        tmp = self.directory / f".{final.name}.tmp"
        started = time.perf_counter()
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # a killed attempt's leftovers
        self._barrier()
        dcp_save(self._state(), checkpoint_id=str(tmp), no_dist=not self.distributed)
        if self.rank == 0:
            if final.exists():  # the same step saved by an earlier attempt: keep one
                shutil.rmtree(final)
            _fsync_tree(tmp)
            os.replace(tmp, final)
            _fsync_dir(self.directory)
            self.last_save_s = time.perf_counter() - started
            side = final.with_name(final.name + SAVE_S_SUFFIX)
            side.write_text(f"{self.last_save_s:.6f}\n")
        self._barrier()
        self.saved_step = step
        return final

    def preempted(self) -> bool:
        """Whether any rank was signalled (collective: call it on every rank each step)."""
        signalled = self.preemption is not None and self.preemption.signum is not None
        flag = 1 if signalled or (self.held is not None and self.held()) else 0
        if not self.distributed:
            return bool(flag)
        # NCCL reduces device tensors only
        cuda = dist.get_backend() == "nccl"
        t = torch.tensor([flag], dtype=torch.int32,
                         device=torch.device("cuda", torch.cuda.current_device()) if cuda else None)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(int(t.item()))

    def after_step(self, step: int, total: int, before_save: Any = None,
                   before_near_save: Any = None) -> int | None:
        """Call after each step: saves when due (the durable tier, and the memory and peer
        tiers when there are some); ``EXIT_PREEMPTED`` when the program must stop now
        (checkpoint saved), else None. ``before_save`` / ``before_near_save`` run before a
        durable / a near save (the TensorBoard writer reaches the saved step: no gap)."""
        if self.tiers is not None:
            if before_near_save is not None and self.tiers.tiers.due(step):
                before_near_save()
            self.tiers.after_step(step, self._state())
        stop = self.preempted()
        due = bool(self.every) and step % self.every == 0
        if stop and step < total and self.tiers is not None:  # the nearest copy of the stop
            self.tiers.save_now(step, self._state())
        if (due or stop or step == total) and self.saved_step != step:
            if before_save is not None:
                before_save()
            path = self.save(step)
            self.log(f"checkpoint saved: {path.name} ({self.last_save_s:.3f}s)")
        if stop and step < total:
            self.log(f"preempted at step {step}: exiting {EXIT_PREEMPTED}")
            return EXIT_PREEMPTED
        return None

    def close(self) -> None:
        """The near tiers' writer drained (call before the program exits)."""
        if self.tiers is not None:
            self.tiers.close()


def load_model_weights(model: torch.nn.Module, checkpoint: Path) -> None:
    """Only the model's weights out of a checkpoint this module wrote (one process): what
    continued pretraining starts from; the optimizer and the rest stay behind."""
    state = {"train": {"model": get_model_state_dict(model)}}
    dcp_load(state, checkpoint_id=str(checkpoint), no_dist=True)
    set_model_state_dict(model, state["train"]["model"])


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for entry in path.iterdir():
        if entry.is_file():
            with open(entry, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(path)
