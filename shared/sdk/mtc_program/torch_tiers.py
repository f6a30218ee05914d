"""The memory and peer checkpoint tiers for a PyTorch program (the durable tier stays dcp's).

``torch_checkpoint.Checkpointer`` writes the durable tier with ``torch.distributed.checkpoint``
(``AIP_CHECKPOINT_DIR/ckpt-<step>/``). When the managed environment names the tiers
(``MTC_TIER1_DIR``; ``mtc_program.protocol``), ``TorchTiers`` adds the two near ones through
the same ``TieredCheckpointer`` the numpy programs use:

* every ``MTC_TIER1_EVERY`` steps (the recipe's ``checkpoint.memory_every`` by default) each
  rank serializes its whole state (model, optimizer, scheduler, loader position, its own RNG
  states: what dcp saves, as ``state_dict()`` values) with ``torch.save`` into bytes; that
  copy is all the step blocks for; the background writer puts it in the rank's memory tier and
  on its buddy's node (peer tier);
* entries are per rank (``replicated=False``): data-parallel ranks share weights but not their
  RNG states or loader positions, and bit-exact resume needs both;
* ``restore`` agrees with the other ranks on the newest step every rank holds in a near tier
  (``cut``); the caller compares it with the newest complete durable checkpoint and loads
  whichever is newer, so every rank makes the same choice;
* every step is a heartbeat at a bounded rate (``MTC_PROGRESS_FILE``), which is how the
  control plane measures a torch job's first step and what each rank would lose.

Without ``MTC_TIER1_DIR`` there is no ``TorchTiers``: durable only.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from mtc_program import protocol as p
from mtc_program.tiers import Restored, TieredCheckpointer, TierSettings

STATE_KEY = "state"  # the one member of a torch tier entry: the torch.save bytes


def serialize(state: Mapping[str, Any]) -> bytes:
    """``state_dict()`` of every stateful object, as bytes (tensors copied out of the model)."""
    buffer = io.BytesIO()
    torch.save({name: obj.state_dict() for name, obj in state.items()}, buffer)
    return buffer.getvalue()


def load_into(state: Mapping[str, Any], payload: bytes) -> None:
    """The inverse of ``serialize``: every object takes back its ``state_dict``. The payload
    is this job's own entry, checked against its manifest's sha256 before it gets here
    (numpy and python RNG states are not plain tensors, so ``weights_only`` cannot be used)."""
    saved = torch.load(io.BytesIO(payload), weights_only=False)
    missing = sorted(set(state) - set(saved))
    if missing:
        raise ValueError(f"tier entry lacks {', '.join(missing)}: not this program's state")
    for name, obj in state.items():
        obj.load_state_dict(saved[name])


class TorchTiers:
    """Memory and peer saves of a torch program's state, and their consistent restore."""

    def __init__(self, settings: TierSettings, log: Callable[[str], None] = print) -> None:
        self.tiers = TieredCheckpointer(settings, log)
        self.log = log

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, durable_dir: Path, rank: int, world_size: int,
                 memory_every: int, log: Callable[[str], None] = print) -> TorchTiers | None:
        """None when the managed environment names no tiers (durable only)."""
        if not env.get(p.TIER1_DIR, "").strip():
            return None
        settings = TierSettings.from_env(env, durable_dir=durable_dir, rank=rank,
                                         world_size=world_size, tier1_every=memory_every,
                                         replicated=False)
        # the durable tier is dcp's (Checkpointer.save), never the numpy format
        return cls(dataclasses.replace(settings, tier3_every=0), log)

    @property
    def every(self) -> int:
        return self.tiers.settings.tier1_every

    def after_step(self, step: int, state: Mapping[str, Any]) -> tuple[str, ...]:
        """Save to the near tiers due at ``step`` (a heartbeat otherwise); the tiers saved."""
        due = self.tiers.due(step)
        if not due:
            self.tiers.step_done(step)
            return ()
        report = self.tiers.save(step, {STATE_KEY: serialize(state)}, due)
        return report.tiers

    def restore(self) -> Restored | None:
        """The newest step every rank holds in a near tier (agreed through files), or None."""
        return self.tiers.restore()

    def close(self) -> None:
        self.tiers.close()

