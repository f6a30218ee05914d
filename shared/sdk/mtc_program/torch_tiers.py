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
  whichever is newer (the near one at the same step: the same state, read faster), so every
  rank makes the same choice;
* every step is a heartbeat at a bounded rate (``MTC_PROGRESS_FILE``), which is how the
  control plane measures a torch job's first step and what each rank would lose.
* ``OwnCopy``: the bytes of the rank's last memory saves (two by default), kept in the
  process across an in-process restart (``torch_inprocess``); when the ranks agree on one of
  those steps, ``restore`` loads those bytes and reads no tier. Two: the cut can be a save
  behind this rank's newest when a crashed peer's writer had not written that one yet.

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


@dataclasses.dataclass
class OwnCopy:
    """The bytes of this rank's last ``keep`` memory saves by step, held by the process (it
    outlives the ``TorchTiers`` of one attempt when the next attempt takes the same process).
    Each costs host memory the size of the rank's state. ``owner``: the rank and world size
    they were saved as; a process given another rank (a scale-down renumbers) cannot use them."""

    keep: int = 2
    copies: dict[int, bytes] = dataclasses.field(default_factory=dict)
    owner: tuple[int, int] | None = None

    def add(self, step: int, payload: bytes, owner: tuple[int, int]) -> None:
        if owner != self.owner:
            self.copies, self.owner = {}, owner
        self.copies[step] = payload
        for old in sorted(self.copies)[:-self.keep]:
            del self.copies[old]

    def of(self, owner: tuple[int, int]) -> dict[int, bytes]:
        return self.copies if owner == self.owner else {}


class TorchTiers:
    """Memory and peer saves of a torch program's state, and their consistent restore."""

    def __init__(self, settings: TierSettings, log: Callable[[str], None] = print,
                 own: OwnCopy | None = None) -> None:
        self.tiers = TieredCheckpointer(settings, log)
        self.log = log
        self.own = own
        self.saved_step = -1  # the newest step saved to the near tiers by this attempt

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, durable_dir: Path, rank: int, world_size: int,
                 memory_every: int, log: Callable[[str], None] = print,
                 own: OwnCopy | None = None) -> TorchTiers | None:
        """None when the managed environment names no tiers (durable only)."""
        if not env.get(p.TIER1_DIR, "").strip():
            return None
        settings = TierSettings.from_env(env, durable_dir=durable_dir, rank=rank,
                                         world_size=world_size, tier1_every=memory_every,
                                         replicated=False)
        # the durable tier is dcp's (Checkpointer.save), never the numpy format
        return cls(dataclasses.replace(settings, tier3_every=0), log, own)

    @property
    def every(self) -> int:
        return self.tiers.settings.tier1_every

    def after_step(self, step: int, state: Mapping[str, Any]) -> tuple[str, ...]:
        """Save to the near tiers due at ``step`` (a heartbeat otherwise); the tiers saved."""
        due = self.tiers.due(step)
        if not due:
            self.tiers.step_done(step)
            return ()
        return self._save(step, state, due)

    def save_now(self, step: int, state: Mapping[str, Any]) -> tuple[str, ...]:
        """Both near tiers at ``step`` unless this attempt saved it already (the save before
        a stop: a hold's, a preemption's)."""
        if self.saved_step == step:
            return ()
        return self._save(step, state, (p.MEMORY, p.PEER))

    def _save(self, step: int, state: Mapping[str, Any], which: tuple[str, ...]
              ) -> tuple[str, ...]:
        payload = serialize(state)
        report = self.tiers.save(step, {STATE_KEY: payload}, which)
        self.saved_step = step
        if self.own is not None and p.MEMORY in report.tiers:
            self.own.add(step, payload, self._owner)
        return report.tiers

    @property
    def _owner(self) -> tuple[int, int]:
        return self.tiers.settings.rank, self.tiers.settings.world_size

    def restore(self) -> Restored | None:
        """The newest step every rank holds in a near tier (agreed through files), or None.
        This process's own copy of that step, if it holds one, is used without a read."""
        mine = self.own.of(self._owner) if self.own is not None else {}
        if not mine:
            return self.tiers.restore()
        restored = self.tiers.restore({step: {STATE_KEY: payload}
                                       for step, payload in mine.items()})
        if restored is not None and restored.step in mine:
            self.log(f"restore: step {restored.step} from this process's memory (no tier read)")
        return restored

    def close(self) -> None:
        self.tiers.close()

