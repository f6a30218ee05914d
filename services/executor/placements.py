"""Which start of an attempt the store committed: the executor applies that one only.

A handler publishes ``start_workers`` before its transaction commits (a failed publish then
aborts it). Under contention the commit can fail after the publish, and the retried handler
may place the same attempt on other nodes: two starts of one attempt, of which only the
second is the store's. Each start's request id names its placement
(``codec.placement_tag``), and before applying one the executor asks the store:

* the store shows the attempt on these nodes -> apply;
* the store shows that attempt elsewhere, or a later attempt -> drop it (superseded);
* the store does not show the attempt yet -> wait: the request is nacked and comes back
  (the transaction may still be committing), holding its job's later requests behind it;
  after ``COMMIT_WAIT_S`` with no commit it is dropped (the handler that made it failed,
  and its retry publishes its own start).

Nothing dropped is recorded as done: if the same start is published again once its attempt
is committed, it is applied then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from shared.adapters.docstore import DocUnitsOfWork
from shared.ports import DocStore

COMMIT_WAIT_S = 60.0  # a start whose attempt the store has not shown by then is dropped
APPLY, WAIT = "apply", "wait"


class Placed(NamedTuple):
    attempt: int
    node_ids: frozenset[str]


class Placements(Protocol):
    def placed(self, job_id: str) -> Placed | None:
        """The job's newest attempt and its nodes as the store shows them; None: no job."""
        ...


def verdict(attempt: int, node_ids: Sequence[str], placed: Placed | None, waited_s: float,
            wait_s: float = COMMIT_WAIT_S) -> str:
    """APPLY, WAIT, or why the start is dropped (see the module docstring)."""
    if placed is not None and placed.attempt > attempt:
        return f"attempt {attempt} is superseded: the store shows attempt {placed.attempt}"
    if placed is not None and placed.attempt == attempt:
        if placed.node_ids == frozenset(node_ids):
            return APPLY
        return (f"attempt {attempt} was committed on other nodes "
                f"({', '.join(sorted(placed.node_ids))}): this placement never was")
    if waited_s < wait_s:
        return WAIT
    return (f"attempt {attempt} is not in the store {waited_s:.0f} s after the start was "
            "issued: its transaction did not commit")


class StorePlacements:
    """``Placements`` over the control plane's document store (a read-only transaction)."""

    def __init__(self, store: DocStore) -> None:
        self._uow = DocUnitsOfWork(store)

    def placed(self, job_id: str) -> Placed | None:
        with self._uow(read_only=True) as uow:
            job = uow.jobs.get(job_id)
        if job is None:
            return None
        return Placed(job.attempt, frozenset(n for n in job.node_ids if n))
