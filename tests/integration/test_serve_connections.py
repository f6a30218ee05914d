"""Slow clients cannot take `mtc serve` off the air: 210 connections that each send a request
line and then one header line every second (never idle, so ``channel_timeout`` never closes
them) held more than the 200 connections waitress admits, and every other request, the
probes' included, waited in the listen backlog for as long as they dripped. With the
connection rules (services.cli.connections) one address keeps at most ``PER_CLIENT`` of them,
none lives past the header deadline, and ``/healthz`` answers within a second throughout."""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from services.cli.connections import HEADER_S, PER_CLIENT, SWEEP_S
from tests.serving import PARENT, mtc_serve

pytestmark = pytest.mark.slow

TOKEN = "drip-test-token"
DRIPPERS = 210
DRIP_S = 1.0
ANSWER_S = 1.0


def _open(sock: socket.socket) -> bool:
    """Whether the server still holds ``sock`` (what it sent, a 408, is read and dropped)."""
    sock.setblocking(False)  # reads that never wait
    try:
        return all(sock.recv(4096) != b"" for _ in range(64))
    except BlockingIOError:  # nothing more to read, and not closed
        return True
    except OSError:
        return False


def _healthz(url: str) -> float:
    """Seconds ``/healthz`` took to answer 200; no answer in time is this test's failure."""
    started = time.monotonic()
    try:
        resp = requests.get(f"{url}/healthz", timeout=10)
    except (requests.Timeout, requests.ConnectionError) as exc:
        raise AssertionError(f"/healthz: no answer while {DRIPPERS} clients dripped ({exc})"
                             ) from exc
    assert resp.status_code == 200, resp.text
    return time.monotonic() - started


def test_defect_6_dripping_connections_do_not_take_the_api_off_the_air(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    with mtc_serve(state, TOKEN) as url:
        parts = urlsplit(url)
        address = (parts.hostname or "127.0.0.1", parts.port or 80)
        drippers: list[socket.socket] = []
        try:
            for _ in range(DRIPPERS):
                sock = socket.create_connection(address, timeout=5)
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: mtc\r\n")  # never the blank line
                drippers.append(sock)
            took = [_healthz(url)]
            ends = time.monotonic() + HEADER_S + 2 * SWEEP_S + 2.0  # past the header deadline
            line = 0
            while time.monotonic() < ends:
                line += 1
                for sock in drippers:
                    with contextlib.suppress(OSError):  # the server closed it
                        sock.sendall(f"X-Drip-{line}: x\r\n".encode())
                took.append(_healthz(url))
                if line == 2:  # one address's share: the rest gave way to the newer ones
                    assert sum(_open(s) for s in drippers) <= PER_CLIENT
                time.sleep(DRIP_S)
            assert max(took) < ANSWER_S, [round(t, 3) for t in took]
            assert sum(_open(s) for s in drippers) == 0  # none outlived the header deadline
            resp = requests.get(f"{url}/v1beta1/{PARENT}/customJobs",
                                headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
            assert resp.status_code == 200, resp.text
        finally:
            for sock in drippers:
                sock.close()
