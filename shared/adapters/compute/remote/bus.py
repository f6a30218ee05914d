"""How compute requests reach the executor: the delivery interface and an in-process bus.

The executor pulls ``Delivery``s from a ``RequestSource`` and acknowledges each once it is
applied (or refused); one not acknowledged comes back, as on Pub/Sub. ``MemoryRequestBus``
is both ends in one process (the Compute contract suite, unit tests), with Pub/Sub's
delivery semantics where they matter: at least once (it can deliver every message twice),
in order per ordering key (a key's next message waits until the one before it is
acknowledged; a nacked one comes back first), and whatever a dead executor held is delivered
again (``crash``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from shared.adapters.compute.remote.codec import ComputeRequest, encode


class Delivery(Protocol):
    data: bytes
    attributes: Mapping[str, str]
    ordering_key: str
    delivery_attempt: int

    def ack(self) -> None: ...
    def nack(self) -> None: ...


class RequestSource(Protocol):
    def receive(self, max_messages: int, timeout_s: float) -> list[Delivery]:
        """What is there now (waiting up to ``timeout_s`` for a first message)."""
        ...


@dataclass
class _Entry:
    seq: int
    data: bytes
    attributes: dict[str, str]
    ordering_key: str
    attempts: int = 0
    out: bool = False


@dataclass
class Received:
    """A ``Delivery``: the message and how to answer it (each transport's ack and nack)."""

    data: bytes
    attributes: Mapping[str, str]
    ordering_key: str
    delivery_attempt: int
    on_ack: Callable[[], None]
    on_nack: Callable[[], None]

    def ack(self) -> None:
        self.on_ack()

    def nack(self) -> None:
        self.on_nack()


@dataclass
class MemoryRequestBus:
    """A ``RequestSink`` and a ``RequestSource`` in one process (see the module docstring)."""

    duplicate: bool = False  # deliver every message a second time after it is acknowledged
    _queue: list[_Entry] = field(default_factory=list)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    sent: int = 0
    acked: int = 0

    def send(self, request: ComputeRequest) -> None:
        data, attributes = encode(request)
        self.put(data, attributes, request.ordering_key)

    def put(self, data: bytes, attributes: Mapping[str, str], ordering_key: str = "",
            *, copies: int = 1) -> None:
        """Publish raw bytes (tests send malformed messages this way)."""
        with self._cond:
            for _ in range(copies * (2 if self.duplicate else 1)):
                self._queue.append(_Entry(next(self._seq), data, dict(attributes),
                                          ordering_key))
            self.sent += 1
            self._cond.notify_all()

    def receive(self, max_messages: int, timeout_s: float) -> list[Delivery]:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                out = self._take(max_messages)
                left = deadline - time.monotonic()
                if out or left <= 0:
                    return list(out)
                self._cond.wait(left)

    def delivery_of(self, entry: _Entry) -> Received:
        return Received(entry.data, entry.attributes, entry.ordering_key, entry.attempts,
                        lambda: self._ack(entry), lambda: self._nack(entry))

    def entries(self) -> list[_Entry]:
        """What is queued now (tests hand them over themselves)."""
        with self._cond:
            return list(self._queue)

    def _take(self, max_messages: int) -> list[Received]:
        blocked = {e.ordering_key for e in self._queue if e.out and e.ordering_key}
        out: list[Received] = []
        for entry in self._queue:
            if len(out) >= max_messages:
                break
            if entry.out or (entry.ordering_key and entry.ordering_key in blocked):
                continue
            entry.out = True
            entry.attempts += 1
            if entry.ordering_key:
                blocked.add(entry.ordering_key)
            out.append(self.delivery_of(entry))
        return out

    def _ack(self, entry: _Entry) -> None:
        with self._cond:
            if entry in self._queue:
                self._queue.remove(entry)
                self.acked += 1
            self._cond.notify_all()

    def _nack(self, entry: _Entry) -> None:
        with self._cond:
            entry.out = False
            self._cond.notify_all()

    def crash(self) -> None:
        """The executor died: everything it held unacknowledged is delivered again."""
        with self._cond:
            for entry in self._queue:
                entry.out = False
            self._cond.notify_all()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue)
