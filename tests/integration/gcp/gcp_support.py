"""Helpers for the emulator tests: WSGI servers on 127.0.0.1, a Firestore-backed plane,
thread-safe fake compute, waiting."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import requests
from werkzeug.serving import BaseWSGIServer, make_server

from services.wiring.builder import build_deps
from services.wiring.routes import control_plane_routes
from shared.adapters.firestore_store import FirestoreDocStore
from shared.adapters.outbox_bus import OutboxBus
from shared.domain.health import RepairAction
from shared.domain.model import Node
from tests.harness import FakeCompute, ManualClock, Plane
from tests.serving import wait_until

ROOT = Path(__file__).resolve().parents[3]
PROJECT = "mtc-test"


class Server:
    """A threaded WSGI server on a free 127.0.0.1 port, in this process."""

    def __init__(self, app: Any) -> None:
        self._server: BaseWSGIServer = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def function_app(target: str, kind: str = "cloudevent") -> Any:
    """The entry point ``target`` of the root main.py, as Cloud Functions loads it."""
    from functions_framework import create_app

    return create_app(target, str(ROOT / "main.py"), kind)  # type: ignore[no-untyped-call]


def reset_firestore(project: str = PROJECT) -> None:
    host = os.environ["FIRESTORE_EMULATOR_HOST"]
    url = f"http://{host}/emulator/v1/projects/{project}/databases/(default)/documents"
    requests.delete(url, timeout=10).raise_for_status()


def wait_for(
    predicate: Callable[[], Any], timeout_s: float = 20.0, poll_s: float = 0.1, what: str = "condition"
) -> Any:
    """``tests.serving.wait_until`` in this module's argument order."""
    return wait_until(what, predicate, timeout_s, interval_s=poll_s)


class SafeCompute(FakeCompute):
    """FakeCompute that several server threads may call; ``fail`` makes calls raise."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.fail: dict[str, Callable[[str], bool]] = {}
        self.calls: list[tuple[str, str]] = []

    def _maybe_fail(self, method: str, key: str) -> None:
        self.calls.append((method, key))
        check = self.fail.get(method)
        if check is not None and check(key):
            raise RuntimeError(f"injected failure: {method}({key})")

    def provision_node(self, node: Node) -> None:
        with self.lock:
            self._maybe_fail("provision_node", node.node_id)
            super().provision_node(node)

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        with self.lock:
            self._maybe_fail("start_repair", node_id)
            super().start_repair(node_id, action, attempt)

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        with self.lock:
            self._maybe_fail("signal_workers", job_id)
            super().signal_workers(job_id, attempt, grace_s)


class StorePlane(Plane):
    """The harness plane (real handlers, embedded bus) over any document store."""

    def __init__(
        self,
        store: Any,
        clock: ManualClock | None = None,
        compute: FakeCompute | None = None,
        skip: Mapping[str, set[str]] | None = None,
    ) -> None:
        super().__init__()
        self.store = store
        self.clock = clock or ManualClock(time.time())
        self.compute = compute or SafeCompute()
        self.bus = OutboxBus(store, control_plane_routes())
        self.deps = build_deps(
            store, clock=self.clock, compute=self.compute, publisher=self.bus, config=self.deps.config
        )
        self.bus.listeners.append(lambda env, _: self.delivered.append(env))
        self.lock = threading.RLock()

    def deliver(self) -> int:
        with self.lock:
            return self.bus.pump(self.deps)


def firestore_store() -> FirestoreDocStore:
    return FirestoreDocStore.connect(PROJECT)
