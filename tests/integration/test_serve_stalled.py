"""A client that stalls `mtc serve` delays neither another request nor a drain.

A real `mtc serve` on loopback; silent connections, half-sent requests and idle keep-alives
held open while a node fault is injected through the API: the node is drained and every
other request (API, probes, /metrics, console) answers while they hold on. On the old
single-threaded development server the first silent connection blocked everything: the
fault's own request failed here, unanswered. No timing thresholds: a request that waits
``REQUEST_S`` has been blocked, not slowed; the figures are bench/serve_stall_bench.py's
(docs/server.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests

from services.cli.connections import HEADER_S
from tests.serving import PARENT, create_cluster, mtc_serve, wait_until
from tests.stalled_clients import drains_seen, inject_xid, nodes, stalled_clients

pytestmark = pytest.mark.slow

TOKEN = "stall-test-token"
SILENT, PARTIAL, IDLE = 12, 12, 4
SHARE = 2 * (SILENT + PARTIAL + IDLE)
REQUEST_S = 20.0
T = TypeVar("T")


def answered(what: str, call: Callable[[], T]) -> T:
    """``call()``'s answer; a request that got none is this test's failure, not an error."""
    try:
        return call()
    except (requests.Timeout, requests.ConnectionError, TimeoutError) as exc:
        raise AssertionError(f"{what}: no answer within {REQUEST_S:g} s while stalled "
                             f"clients held on ({exc})") from exc


def test_stalled_clients_delay_neither_requests_nor_a_drain(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    headers = {"Authorization": f"Bearer {TOKEN}"}

    def get(path: str) -> Any:
        return answered(path, lambda: requests.get(f"{url}{path}", headers=headers,
                                                   timeout=REQUEST_S))

    # the stalled clients come from one address: a share that holds them all, so what is
    # measured is the threads' independence (the share rule: test_serve_connections.py)
    with mtc_serve(state, TOKEN, extra_args=["--connections-per-client", str(SHARE)]) as url:
        create_cluster(url, TOKEN, "c1", workers=2)
        target = next(n["nodeId"] for n in nodes(url, TOKEN, "c1") if n["role"] == "worker")
        before, _ = drains_seen(url, TOKEN)
        with stalled_clients(url, silent=SILENT, partial=PARTIAL, idle=IDLE,
                             timeout_s=REQUEST_S) as stalls:
            answered("the fault", lambda: inject_xid(url, TOKEN, "c1", target, REQUEST_S))
            # healing goes on: the fault is diagnosed and the node taken out of service
            wait_until("the node drained",
                       lambda: answered("/metrics",
                                        lambda: drains_seen(url, TOKEN, REQUEST_S))[0] > before,
                       timeout_s=60.0)
            # and every other request answers
            for path in (f"/v1beta1/{PARENT}/modelDevelopmentClusters",
                         f"/v1beta1/{PARENT}/customJobs", "/console"):
                resp = get(path)
                assert resp.status_code == 200, (path, resp.text[:200])
            assert get("/healthz").json() == {"status": "ok"}
            ready = get("/readyz")
            assert ready.status_code == 200, ready.text
            assert ready.json()["checks"] == {"store": "ok", "controller": "ok"}
            assert answered("keep-alives", stalls.reuse_idle) == [200] * IDLE
            # the stalled clients still hold on (the server closes them at the deadline of
            # the request they owe)
            if time.monotonic() - stalls.opened_at < HEADER_S:
                assert stalls.open_sockets() == SILENT + PARTIAL
