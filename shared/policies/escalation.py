"""Restarts that cannot loop: a job whose restarts make no progress climbs a ladder. Pure.

A restart from a near tier is cheap and, when the entry it reads is bad in a way no check
sees (a state that loads and then crashes the program), it fails again at once, and again:
one field report counts 44 restarts after a bad local restore. So the restarts of a job
whose attempts end without progress (no checkpoint saved: ``shared.policies.restarts``'
streak) are counted per rung, and past a rung's limit the next restart climbs one rung:

=====  =========  ======================================  =====================  =========
rung   name       the recovery policy may choose          the restore skips      limit
=====  =========  ======================================  =====================  =========
0      near       any mode                                nothing                in_place
1      peer       hot swap (where allowed) or requeue     memory                 hot_swap
2      durable    requeue                                 memory and peer        requeue
-      exhausted  nothing: the job fails with the evidence
=====  =========  ======================================  =====================  =========

Each rung bars the modes before it and the tiers nearer than its own, so the restore moves
memory -> peer -> durable as the modes move in place -> hot swap -> requeue. A rung's limit
is how many restarts from it may end without progress (0 skips it). Any progress starts the
ladder again. The ladder ends in failure only for a job that keeps near-tier entries
(``near``): a job restored from durable alone has only the restart backoff and its
``maxRestarts``, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shared.domain.errors import ValidationError
from shared.policies.recovery import Mode, Tier


@dataclass(frozen=True)
class Rung:
    name: str
    barred: frozenset[Mode]  # modes the recovery policy may not choose on this rung
    skip: tuple[Tier, ...]  # tiers the restore must not read
    limit_field: str  # the ``LadderConfig`` field that bounds it


RUNGS = (
    Rung("near", frozenset(), (), "in_place"),
    Rung("peer", frozenset({Mode.IN_PLACE, Mode.SCALE_DOWN}), (Tier.MEMORY,), "hot_swap"),
    Rung("durable", frozenset({Mode.IN_PLACE, Mode.SCALE_DOWN, Mode.HOT_SWAP}),
         (Tier.MEMORY, Tier.PEER), "requeue"),
)


@dataclass(frozen=True)
class LadderConfig:
    """Restarts per rung that may end without progress before the next restart climbs."""

    in_place: int = 1
    hot_swap: int = 1
    requeue: int = 2

    def __post_init__(self) -> None:
        for name in ("in_place", "hot_swap", "requeue"):
            if getattr(self, name) < 0:
                raise ValidationError(f"ladder.{name}", "must be a whole number >= 0")

    def limit(self, rung: int) -> int:
        return int(getattr(self, RUNGS[rung].limit_field))


@dataclass(frozen=True)
class Step:
    """Where the next restart stands: its rung (None: the ladder is exhausted, fail)."""

    rung: int | None
    why: str

    @property
    def barred(self) -> frozenset[Mode]:
        return RUNGS[self.rung].barred if self.rung is not None else frozenset(Mode)

    @property
    def skip(self) -> tuple[Tier, ...]:
        return RUNGS[self.rung].skip if self.rung is not None else ()


def rung_of(stalled: Sequence[int], config: LadderConfig) -> int | None:
    """The rung of the next restart, from the rungs of the restarts that ended without
    progress since the last progress (None: every rung spent)."""
    rung = 0
    while rung < len(RUNGS) and sum(1 for s in stalled if s == rung) >= config.limit(rung):
        rung += 1
    return rung if rung < len(RUNGS) else None


def next_step(stalled: Sequence[int], config: LadderConfig, near: bool) -> Step:
    """The next restart's rung and why. ``near``: the job keeps memory or peer entries; a
    job that does not stays on the last rung (requeue from durable) instead of failing."""
    rung = rung_of(stalled, config)
    if not stalled:
        return Step(0, "")
    count = len(stalled)
    if rung is None and not near:
        rung = len(RUNGS) - 1
    if rung is None:
        return Step(None, f"{count} restart(s) in a row without progress, every rung of the "
                          f"ladder spent (in place, hot swap, requeue from durable)")
    if rung == 0:
        return Step(0, "")
    skip = " and ".join(t.value for t in RUNGS[rung].skip)
    return Step(rung, f"{count} restart(s) in a row without progress: escalated to "
                      f"{RUNGS[rung].name} (no {', '.join(sorted(m.value for m in RUNGS[rung].barred))}; "
                      f"the restore skips {skip})")
