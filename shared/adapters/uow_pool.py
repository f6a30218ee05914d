"""A pool of units of work: the twin's choice (``services.wiring.builder``), where building a
unit of work, its four repositories and their weak reference was a measurable share of a
delivery. Production builds a plain one per call (``docstore.DocUnitsOfWork``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from shared.adapters.doc_reads import reads_for
from shared.adapters.docstore import DocUnitOfWork
from shared.ports import DocStore


class PooledUnitsOfWork:
    """``Deps.uow``: a unit of work over ``store`` per call, one that ended handed out again.

    A unit of work is entered once per hand-out; nested and concurrent ones each get their
    own. At most ``keep`` wait to be reused. A holder that enters its unit of work again
    after it ended (and was given back) takes it out of the free list first, so it is not
    handed to anyone else while in use; one entered twice at once raises."""

    def __init__(self, store: DocStore, *, source: str = "//mtc/control-plane",
                 clock: Callable[[], float] | None = None, keep: int = 8) -> None:
        self._store = store
        self._source = source
        self._clock = clock
        self._keep = keep
        self._reads = reads_for(store)
        # (a list's pop, append and remove are each atomic: threads share it without a lock;
        # a race can only keep one more or one fewer)
        self._free: list[DocUnitOfWork] = []

    def __call__(self, *, read_only: bool = False) -> DocUnitOfWork:
        try:
            uow = self._free.pop()
        except IndexError:
            uow = DocUnitOfWork(self._store, source=self._source, clock=self._clock,
                                reads=self._reads, pool=self)
        uow._pooled = False
        uow.read_only = read_only
        return uow

    @property
    def free(self) -> int:
        """How many wait to be handed out again."""
        return len(self._free)

    def give_back(self, uow: DocUnitOfWork) -> None:
        if not uow._pooled and len(self._free) < self._keep:
            uow._pooled = True
            self._free.append(uow)

    def take(self, uow: DocUnitOfWork) -> None:
        """Take ``uow`` out of the free list: its holder entered it again."""
        if uow._pooled:
            uow._pooled = False
            with contextlib.suppress(ValueError):  # handed out meanwhile: not there any more
                self._free.remove(uow)
