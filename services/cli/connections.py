"""How long a connection to `mtc serve` may take to ask, and how many one client may hold
while it has nothing asked (docs/server.md, "Connections").

waitress reads every request on its socket loop before a thread sees it, so a stalled
client costs no thread, but it does hold one of ``connection_limit`` slots, and waitress
closes a connection only after ``channel_timeout`` of silence: a client that sends one
header line every few seconds is never silent, and a couple of hundred of them took every
slot. Two rules keep the slots for clients that ask:

- **A deadline on each request**: its head must be whole ``header_s`` after it began (the
  connection's opening, for the first request; its first byte, for a later one on a
  keep-alive), and its body ``request_s`` after it began. A request past its deadline is
  answered ``408`` and its connection closed, however steadily it drips.
- **A share per client**: one address holds at most ``per_client`` connections that wait
  (a request still being read, or a keep-alive between requests); a new one from the same
  address takes the place of its connection that has waited longest. When the server is
  full, a new connection takes the place of the longest-waiting one of any client. A
  connection whose request is being answered is never displaced; with every slot busy
  answering, new connections wait in the listen backlog as before.

``ConnectionGuard.install`` puts the guarded channel into the servers in a socket map;
the serving loop calls ``sweep`` between its polls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer

log = logging.getLogger(__name__)

HEADER_S = 10.0  # a request's head (request line and headers) must be whole by then
REQUEST_S = 60.0  # and its body too; the API's bodies are small JSON documents
PER_CLIENT = 32  # waiting connections one address may hold
SWEEP_S = 0.5  # how often deadlines are looked at

TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n"
             b"Content-Type: text/plain\r\nContent-Length: 29\r\n\r\n"
             b"request not received in time\n")


@dataclass(frozen=True)
class Limits:
    header_s: float = HEADER_S
    request_s: float = REQUEST_S
    per_client: int = PER_CLIENT

    def __post_init__(self) -> None:
        if not 0 < self.header_s <= self.request_s:
            raise ValueError(f"need 0 < header_s <= request_s, got {self.header_s} and "
                             f"{self.request_s}")
        if self.per_client < 1:
            raise ValueError(f"per_client must be at least 1, got {self.per_client}")


class GuardedChannel(HTTPChannel):  # type: ignore[misc]  # waitress ships no types
    """waitress's connection, knowing when the request it reads began and when it was last
    answered. Its state is read and changed on the socket loop's thread, except
    ``answered_at``, which a request thread sets when it has answered."""

    def __init__(self, server: Any, sock: Any, addr: Any, adj: Any,
                 map: dict[int, Any] | None = None) -> None:
        self.opened_at = time.monotonic()
        self.began_at = self.opened_at  # the first request's clock starts at the connection
        self.asked = False  # a byte of some request has come in
        self.answered_at: float | None = None
        super().__init__(server, sock, addr, adj, map=map)

    @property
    def client(self) -> str:
        return str(self.addr[0]) if isinstance(self.addr, tuple) else str(self.addr)

    def received(self, data: bytes) -> bool:
        if self.request is None and data:  # a new request's first bytes
            if self.asked:
                self.began_at = time.monotonic()
            self.asked = True
        return bool(super().received(data))

    def service(self) -> None:
        super().service()
        self.answered_at = time.monotonic()

    def closing(self) -> bool:
        return bool(self.will_close or self.close_when_flushed or not self.connected)

    def in_hand(self) -> bool:
        """A request queued or being answered, or an answer still being sent."""
        return bool(self.requests or self.total_outbufs_len)

    def waiting(self) -> bool:
        return not (self.in_hand() or self.closing())

    def waiting_since(self) -> float:
        if self.request is not None or not self.asked:
            return self.began_at
        return self.answered_at if self.answered_at is not None else self.began_at

    def overdue(self, now: float, limits: Limits) -> bool:
        """Past its request's deadline (never while a request is answered or between
        requests: waitress's ``channel_timeout`` closes an idle keep-alive)."""
        if not self.waiting():
            return False
        if self.request is None:
            return not self.asked and now - self.began_at > limits.header_s
        limit = limits.request_s if self.request.headers_finished else limits.header_s
        return now - self.began_at > limit

    def time_out(self) -> None:
        """Answer 408 and close: the client learns why, and its slot is freed."""
        self.write_soon(TIMED_OUT)
        self.will_close = True


class ConnectionGuard:
    """The two rules over one socket map (``waitress.server.create_server``'s ``map``)."""

    def __init__(self, sockets: dict[int, Any], connection_limit: int,
                 limits: Limits = Limits()) -> None:
        self.sockets = sockets
        self.connection_limit = connection_limit
        self.limits = limits
        self.timed_out = 0
        self.displaced = 0
        self._next_sweep = 0.0

    def install(self) -> None:
        """Every server in the map makes guarded channels (one per address it listens on)."""
        servers = [d for d in self.sockets.values() if isinstance(d, BaseWSGIServer)]
        if not servers:
            raise ValueError("no waitress server in this socket map")
        for server in servers:
            server.channel_class = self.channel

    def channel(self, server: Any, sock: Any, addr: Any, adj: Any,
                map: dict[int, Any] | None = None) -> GuardedChannel:
        """waitress's ``channel_class``: a new connection, admitted by the share rule."""
        new = GuardedChannel(server, sock, addr, adj, map=map)
        waiting = [c for c in self.channels() if c is not new and c.waiting()]
        mine = [c for c in waiting if c.client == new.client]
        if len(mine) >= self.limits.per_client:
            self._displace(mine, f"{new.client} holds {len(mine)} waiting connections")
        elif len(self.sockets) >= self.connection_limit:
            self._displace(waiting, f"{len(self.sockets)} sockets open")
        return new

    def sweep(self, now: float | None = None) -> int:
        """Close the connections past their request's deadline; how many. Cheap enough to
        call after every poll: it looks at the map at most every ``SWEEP_S``."""
        now = time.monotonic() if now is None else now
        if now < self._next_sweep:
            return 0
        self._next_sweep = now + SWEEP_S
        late = [c for c in self.channels() if c.overdue(now, self.limits)]
        for c in late:
            c.time_out()
        if late:
            self.timed_out += len(late)
            log.info("closed %d connections whose request did not arrive in time", len(late))
        return len(late)

    def channels(self) -> Iterator[GuardedChannel]:
        return (d for d in list(self.sockets.values()) if isinstance(d, GuardedChannel))

    def _displace(self, candidates: list[GuardedChannel], why: str) -> None:
        if not candidates:  # every connection is being answered: the backlog waits
            return
        oldest = min(candidates, key=lambda c: c.waiting_since())
        oldest.will_close = True  # the loop closes it on its next pass
        self.displaced += 1
        log.debug("closed a waiting connection of %s to admit a new one: %s",
                  oldest.client, why)
