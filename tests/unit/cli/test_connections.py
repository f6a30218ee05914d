"""The connection rules of `mtc serve` (services.cli.connections) on a real waitress server
in process, with deadlines short enough to watch: a request that drips past its deadline is
answered 408 and closed, one client's waiting connections give way to its next, a full server
admits a new client, and nothing being answered is ever closed by them. The whole server
against 210 dripping clients: tests/integration/test_serve_connections.py."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from waitress import wasyncore
from waitress.server import create_server

from services.cli.connections import ConnectionGuard, Limits
from services.cli.main import build_parser

pytestmark = pytest.mark.slow

Address = tuple[str, int]
SHORT = Limits(header_s=0.5, request_s=1.5, per_client=100)


def _app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    if environ["PATH_INFO"] == "/slow":
        time.sleep(1.2)  # longer than SHORT's header deadline
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]


@contextmanager
def served(limits: Limits, connection_limit: int = 100) -> Iterator[tuple[Address, ConnectionGuard]]:
    """A waitress server with the guard installed, its socket loop on a thread, run as
    `mtc serve` runs it (a poll, then a sweep)."""
    sockets: dict[int, Any] = {}
    server = create_server(_app, map=sockets, host="127.0.0.1", port=0, threads=4,
                           channel_timeout=30, connection_limit=connection_limit,
                           asyncore_use_poll=True)
    guard = ConnectionGuard(sockets, connection_limit, limits)
    guard.install()
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            wasyncore.loop(timeout=0.05, map=sockets, use_poll=True, count=1)
            guard.sweep()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield ("127.0.0.1", int(server.effective_port)), guard
    finally:
        stop.set()
        thread.join(timeout=5)
        server.task_dispatcher.shutdown()
        wasyncore.close_all(sockets)


def connect(address: Address) -> socket.socket:
    return socket.create_connection(address, timeout=5)


def get(sock: socket.socket, path: str = "/") -> bytes:
    """One request on ``sock``; the status line of its answer."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    return read_answer(sock)


def read_answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += sock.recv(4096)
    return head.split(b"\r\n")[0]


def closed_within(sock: socket.socket, timeout_s: float) -> tuple[bool, bytes]:
    """Whether the server closed ``sock`` within ``timeout_s``, and what it sent first."""
    sock.settimeout(timeout_s)
    got = b""
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except TimeoutError:
        return False, got
    except ConnectionResetError:
        pass
    return True, got


def is_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.settimeout(5)


def drip(sock: socket.socket, lines: int, every_s: float) -> bool:
    """Send a header line every ``every_s``; False once the server has closed the socket."""
    for i in range(lines):
        try:
            sock.sendall(f"X-Drip-{i}: x\r\n".encode())
        except OSError:
            return False
        time.sleep(every_s)
    return is_open(sock)


def test_a_request_head_that_drips_is_answered_408_at_its_deadline() -> None:
    with served(SHORT) as (address, guard):
        with connect(address) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n")
            started = time.monotonic()
            assert not drip(sock, lines=30, every_s=0.1)  # never idle, and still closed
            closed, got = closed_within(sock, 2.0)
            assert closed and got.startswith(b"HTTP/1.1 408 Request Timeout")
            assert time.monotonic() - started < 3.0  # well before the dripping would end
        assert guard.timed_out == 1


def test_a_silent_connection_is_closed_at_the_header_deadline() -> None:
    with served(SHORT) as (address, _), connect(address) as sock:
        closed, got = closed_within(sock, SHORT.header_s + 2.0)
        assert closed and got.startswith(b"HTTP/1.1 408")


def test_a_body_that_trickles_is_closed_at_the_request_deadline() -> None:
    with served(SHORT) as (address, _), connect(address) as sock:
        sock.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n")
        started = time.monotonic()
        for _ in range(40):  # a byte every 0.1 s: 4 s for the body, past its deadline
            try:
                sock.sendall(b"x")
            except OSError:
                break
            time.sleep(0.1)
        closed, got = closed_within(sock, 2.0)
        took = time.monotonic() - started
        assert closed and got.startswith(b"HTTP/1.1 408")
        assert SHORT.header_s < took < SHORT.request_s + 2.0  # the head was in time


def test_keep_alives_and_slow_answers_are_not_timed_out() -> None:
    """The deadline is the request's: an answer that takes longer than it, and a keep-alive
    that waits between requests, are left alone (``channel_timeout`` closes idle ones)."""
    with served(SHORT) as (address, guard), connect(address) as sock:
        assert get(sock, "/slow") == b"HTTP/1.1 200 OK"
        assert get(sock) == b"HTTP/1.1 200 OK"  # its clock started at its own first byte
        time.sleep(SHORT.header_s + 1.0)
        assert get(sock) == b"HTTP/1.1 200 OK"
        assert guard.timed_out == 0


def test_a_clients_next_connection_takes_the_place_of_its_longest_waiting() -> None:
    with served(Limits(header_s=30, request_s=30, per_client=3)) as (address, guard):
        socks = [connect(address) for _ in range(3)]
        socks[1].sendall(b"GET / HTTP/1.1\r\n")  # waiting too, but since after the first
        try:
            time.sleep(0.2)
            fresh = connect(address)
            socks.append(fresh)
            assert closed_within(socks[0], 2.0)[0]  # the first, waiting longest
            assert get(fresh) == b"HTTP/1.1 200 OK"
            assert [is_open(s) for s in socks[1:]] == [True, True, True]
            assert guard.displaced == 1
        finally:
            for s in socks:
                s.close()


def test_a_full_server_admits_a_new_client_in_place_of_a_waiting_one() -> None:
    # the map holds the listening socket and waitress's trigger beside the connections
    with served(Limits(header_s=30, request_s=30, per_client=100), connection_limit=8) as (
            address, guard):
        socks = [connect(address) for _ in range(12)]  # more than the server holds
        try:
            fresh = connect(address)
            socks.append(fresh)
            started = time.monotonic()
            assert get(fresh) == b"HTTP/1.1 200 OK"
            assert time.monotonic() - started < 1.0
            assert guard.displaced >= 6
        finally:
            for s in socks:
                s.close()


def test_connections_being_answered_are_never_displaced() -> None:
    with served(Limits(header_s=30, request_s=30, per_client=1)) as (address, guard):
        busy: list[socket.socket] = []
        try:
            for _ in range(3):
                busy.append(connect(address))
                busy[-1].sendall(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
                time.sleep(0.1)  # whole and in hand before the next connects
            assert [read_answer(s) for s in busy] == [b"HTTP/1.1 200 OK"] * 3
            assert guard.displaced == 0
        finally:
            for s in busy:
                s.close()


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="header_s"):
        Limits(header_s=20, request_s=10)
    with pytest.raises(ValueError, match="per_client"):
        Limits(per_client=0)
    parser = build_parser()
    assert parser.parse_args(["serve"]).connections_per_client is None  # serve's default
    assert parser.parse_args(["serve", "--connections-per-client", "64"]
                             ).connections_per_client == 64
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--connections-per-client", "0"])
