"""Clients that stall a server, and the fault whose drain they must not delay: shared by
tests/integration/test_serve_stalled.py and bench/serve_stall_bench.py."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests

from tests.serving import PARENT

PARTIAL_REQUESTS = (
    # a request line and headers, never the blank line that ends them
    b"GET /v1beta1/" + PARENT.encode() + b"/customJobs HTTP/1.1\r\nHost: mtc\r\n",
    # a whole head that promises a body it never sends in full
    b"POST /v1beta1/" + PARENT.encode() + b"/customJobs HTTP/1.1\r\nHost: mtc\r\n"
    b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"display",
)


@dataclass
class Stalls:
    """Connections held open: ``silent`` (connected, nothing sent), ``partial`` (part of a
    request sent), ``idle`` (keep-alive connections that made one request, then wait)."""

    silent: list[socket.socket] = field(default_factory=list)
    partial: list[socket.socket] = field(default_factory=list)
    idle: list[http.client.HTTPConnection] = field(default_factory=list)
    opened_at: float = field(default_factory=time.monotonic)

    def open_sockets(self) -> int:
        """How many of the silent and partial sockets the server has not closed."""
        return sum(_open(s) for s in (*self.silent, *self.partial))

    def reuse_idle(self, path: str = "/healthz") -> list[int]:
        """One more request on each idle keep-alive connection: their statuses."""
        statuses = []
        for conn in self.idle:
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            statuses.append(resp.status)
        return statuses

    def close(self) -> None:
        for s in (*self.silent, *self.partial):
            s.close()
        for c in self.idle:
            c.close()


def _open(sock: socket.socket) -> bool:
    timeout = sock.gettimeout()
    sock.setblocking(False)  # a peek that never waits (a timeout would make recv wait)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:  # nothing to read, and not closed
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(timeout)


@contextmanager
def stalled_clients(url: str, *, silent: int = 8, partial: int = 8, idle: int = 4,
                    timeout_s: float = 20.0) -> Iterator[Stalls]:
    """Open the stalling connections (the keep-alives first: each makes one request while
    the server is still free) and hold them until the block ends."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    stalls = Stalls()
    try:
        for _ in range(idle):
            conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            stalls.idle.append(conn)
        for _ in range(silent):
            stalls.silent.append(socket.create_connection((host, port), timeout=timeout_s))
        for i in range(partial):
            sock = socket.create_connection((host, port), timeout=timeout_s)
            sock.sendall(PARTIAL_REQUESTS[i % len(PARTIAL_REQUESTS)])
            stalls.partial.append(sock)
        stalls.opened_at = time.monotonic()
        yield stalls
    finally:
        stalls.close()


def drains_seen(url: str, token: str, timeout_s: float = 20.0) -> tuple[int, float]:
    """The server's fault-to-drain histogram (/metrics, with a token for every project):
    count and sum."""
    resp = requests.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"},
                        timeout=timeout_s)
    resp.raise_for_status()
    text = resp.text
    values: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("mtc_fault_to_drain_seconds_count", "mtc_fault_to_drain_seconds_sum"):
            values[name] = float(value)
    return (int(values.get("mtc_fault_to_drain_seconds_count", 0)),
            values.get("mtc_fault_to_drain_seconds_sum", 0.0))


def inject_xid(url: str, token: str, cluster_id: str, node_id: str,
               timeout_s: float = 20.0) -> Any:
    """An XID 79 on ``node_id``, through the API (as `mtc node fault` reports it)."""
    resp = requests.post(
        f"{url}/v1beta1/{PARENT}/modelDevelopmentClusters/{cluster_id}/nodes/{node_id}"
        ":reportHealth", json={"xids": [79]}, headers={"Authorization": f"Bearer {token}"},
        timeout=timeout_s)
    resp.raise_for_status()
    return resp.json()


def nodes(url: str, token: str, cluster_id: str, timeout_s: float = 20.0
          ) -> list[dict[str, Any]]:
    resp = requests.get(f"{url}/v1beta1/{PARENT}/modelDevelopmentClusters/{cluster_id}/nodes",
                        headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s)
    resp.raise_for_status()
    return list(resp.json().get("nodes", []))
