"""A local stand-in for the Compute Engine REST API (no emulator exists).

It answers the calls ``shared.adapters.compute.gce.api`` makes, in the shapes the Compute v1
REST reference documents, so the adapter is tested through the real ``google-cloud-compute``
client (``transport="rest"``, ``api_endpoint`` pointed here, anonymous credentials):

* ``POST   /compute/v1/projects/{p}/zones/{z}/instances``  (``instances.insert``; the
  ``requestId`` query parameter makes a retry return the first call's operation)
* ``GET    .../instances/{name}`` (``instances.get``: an ``Instance``, with
  ``resourceStatus.upcomingMaintenance`` once a test schedules maintenance)
* ``DELETE .../instances/{name}``, ``POST .../instances/{name}/reset|stop|start``,
  ``POST .../instances/{name}/reportHostAsFaulty`` (body ``{disruptionSchedule,
  faultReasons: [{behavior, description}]}``)
* ``GET .../operations/{op}`` (``zoneOperations.get``) and ``POST .../operations/{op}/wait``
  (``zoneOperations.wait``)

Operations are ``compute#operation`` resources: ``status`` PENDING, then RUNNING, then DONE,
one step per ``get`` (``wait`` finishes it); an operation that failed is DONE with
``error.errors[{code, message}]`` and ``httpErrorStatusCode``. A call the API refuses outright
answers the JSON error body (``{"error": {code, message, errors: [{reason, message}]}}``).
What it checks of an insert is what the API documents: a name, a machine type, a boot disk
from an image, ``onHostMaintenance: TERMINATE`` for instances with GPUs, ``automaticRestart:
false`` for SPOT and FLEX_START. It is a test double for what cannot run here, not Compute
Engine: tests inject stock-outs, quota errors, outages and maintenance through its methods.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

BASE = "https://www.googleapis.com/compute/v1"
_PATH = re.compile(r"^/compute/v1/projects/(?P<p>[^/]+)/zones/(?P<z>[^/]+)/"
                   r"(?P<kind>instances|operations)(?:/(?P<name>[^/]+))?(?:/(?P<verb>[A-Za-z]+))?$")
_ids = itertools.count(4_000_000_000_000)


def _stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class Inject:
    """What the next matching call does instead: an HTTP error, or an operation that ends
    DONE with an error (``op_code``)."""

    http_status: int = 0
    reason: str = ""
    op_code: str = ""
    message: str = "injected by the stand-in"


@dataclass
class StandinState:
    instances: dict[str, dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    effects: dict[str, tuple[str, str, dict[str, Any]]] = field(default_factory=dict)
    by_request_id: dict[str, str] = field(default_factory=dict)
    failures: dict[str, list[Inject]] = field(default_factory=dict)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (verb, instance)
    faults_reported: list[dict[str, Any]] = field(default_factory=list)
    down: bool = False  # every call answers 503
    frozen: bool = False  # operations stay RUNNING (a zone operation that never ends)


class ComputeStandin:
    """The server (a thread on 127.0.0.1) and the knobs tests turn."""

    def __init__(self) -> None:
        self.state = StandinState()
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        # a short poll interval: shutdown() waits up to one, at every test's teardown
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> ComputeStandin:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- knobs
    def fail_next(self, verb: str, failure: Inject, times: int = 1) -> None:
        with self.lock:
            self.state.failures.setdefault(verb, []).extend([failure] * times)

    def schedule_maintenance(self, name: str, start: str, *, kind: str = "SCHEDULED",
                             can_reschedule: bool = True) -> None:
        with self.lock:
            inst = self.state.instances[name]
            inst.setdefault("resourceStatus", {})["upcomingMaintenance"] = {
                "type": kind, "canReschedule": can_reschedule, "windowStartTime": start,
                "maintenanceStatus": "PENDING"}

    def preempt(self, name: str) -> None:
        """What Compute Engine does to a SPOT or FLEX_START VM it reclaims: it stops it."""
        with self.lock:
            self.state.instances[name].update(status="TERMINATED", lastStopTimestamp=_stamp())

    def lose(self, name: str) -> None:
        """An instance deleted behind mtc's back (a person, another tool)."""
        with self.lock:
            self.state.instances.pop(name, None)

    def instance(self, name: str) -> dict[str, Any] | None:
        with self.lock:
            inst = self.state.instances.get(name)
            return json.loads(json.dumps(inst)) if inst else None

    def calls(self, verb: str | None = None) -> list[tuple[str, str]]:
        with self.lock:
            return [c for c in self.state.calls if verb is None or c[0] == verb]

    # -- the API
    def _error(self, status: int, reason: str, message: str) -> tuple[int, dict[str, Any]]:
        return status, {"error": {"code": status, "message": message,
                                  "errors": [{"message": message, "domain": "global",
                                              "reason": reason}]}}

    def _not_found(self, project: str, zone: str, kind: str, name: str
                   ) -> tuple[int, dict[str, Any]]:
        return self._error(404, "notFound",
                           f"The resource 'projects/{project}/zones/{zone}/{kind}/{name}' "
                           "was not found")

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: Any
               ) -> tuple[int, dict[str, Any]]:
        m = _PATH.match(path)
        if not m:
            return self._error(404, "notFound", f"no such path: {path}")
        project, zone, kind, name, verb = m["p"], m["z"], m["kind"], m["name"], m["verb"]
        with self.lock:
            st = self.state
            if st.down:
                return self._error(503, "backendError", "The service is currently unavailable.")
            if kind == "operations":
                op = st.operations.get(name or "")
                if op is None:
                    return self._not_found(project, zone, kind, name or "")
                if verb == "wait" and method == "POST":  # returns when DONE or at its limit
                    for _ in range(2):
                        self._advance(op)
                elif verb is None and method == "GET":
                    self._advance(op)
                else:
                    return self._error(405, "badRequest", f"{method} {path}")
                return 200, dict(op)
            if method == "GET" and name and verb is None:
                inst = st.instances.get(name)
                return (200, inst) if inst else self._not_found(project, zone, kind, name)
            action = {"POST": verb or "insert", "DELETE": "delete"}.get(method, "")
            if (verb is not None and method != "POST") or action not in _ACTIONS:
                return self._error(400, "badRequest", f"unsupported: {method} {path}")
            target = str((body or {}).get("name", "")) if action == "insert" else name or ""
            st.calls.append((action, target))
            request_id = (query.get("requestId") or [""])[0]
            if request_id and request_id in st.by_request_id:
                return 200, dict(st.operations[st.by_request_id[request_id]])
            queued = st.failures.get(action) or []
            failure = queued.pop(0) if queued else None
            if failure and failure.http_status:
                return self._error(failure.http_status, failure.reason or "backendError",
                                   failure.message)
            refused = self._check(action, project, zone, target, body)
            if refused:
                return refused
            op = self._operation(project, zone, action, target)
            if failure and failure.op_code:
                op["_fail"] = {"code": failure.op_code, "message": failure.message}
            st.effects[op["name"]] = (action, target, body or {})
            if request_id:
                st.by_request_id[request_id] = op["name"]
            return 200, dict(op)

    def _check(self, action: str, project: str, zone: str, name: str, body: Any
               ) -> tuple[int, dict[str, Any]] | None:
        st = self.state
        if action != "insert":
            if name not in st.instances:
                return self._not_found(project, zone, "instances", name)
            return None
        if not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name):
            return self._error(400, "invalid", f"Invalid value for field 'resource.name': '{name}'")
        if name in st.instances:
            return self._error(409, "alreadyExists",
                               f"The resource 'projects/{project}/zones/{zone}/instances/{name}' "
                               "already exists")
        if not body.get("machineType"):
            return self._error(400, "required", "Invalid value for field 'resource.machineType'")
        disks = body.get("disks") or []
        if not any(d.get("boot") and (d.get("initializeParams") or {}).get("sourceImage")
                   for d in disks):
            return self._error(400, "required", "Invalid value for field 'resource.disks': "
                               "a boot disk from a source image is required")
        sched = body.get("scheduling") or {}
        if body.get("guestAccelerators") and sched.get("onHostMaintenance") != "TERMINATE":
            return self._error(400, "invalid", "Instances with guest accelerators do not "
                               "support live migration: set scheduling.onHostMaintenance "
                               "to TERMINATE")
        if sched.get("provisioningModel") in ("SPOT", "FLEX_START") and \
                sched.get("automaticRestart", True):
            return self._error(400, "invalid", "scheduling.automaticRestart must be false for "
                               f"provisioningModel {sched['provisioningModel']}")
        return None

    def _operation(self, project: str, zone: str, action: str, target: str) -> dict[str, Any]:
        op_id = str(next(_ids))
        name = f"operation-{op_id}-{action}"
        zone_url = f"{BASE}/projects/{project}/zones/{zone}"
        op = {"kind": "compute#operation", "id": op_id, "name": name, "zone": zone_url,
              "operationType": action, "targetLink": f"{zone_url}/instances/{target}",
              "targetId": op_id, "status": "PENDING", "user": "standin@example.com",
              "progress": 0, "insertTime": _stamp(), "selfLink": f"{zone_url}/operations/{name}"}
        self.state.operations[name] = op
        return op

    def _advance(self, op: dict[str, Any]) -> None:
        if op["status"] == "PENDING":
            op.update(status="RUNNING", startTime=_stamp(), progress=50)
            return
        if op["status"] != "RUNNING" or self.state.frozen:
            return
        op.update(status="DONE", endTime=_stamp(), progress=100)
        failed = op.pop("_fail", None)
        if failed:
            status = 403 if failed["code"] == "QUOTA_EXCEEDED" else 503
            op.update(error={"errors": [failed]}, httpErrorStatusCode=status,
                      httpErrorMessage="FORBIDDEN" if status == 403 else "SERVICE UNAVAILABLE")
            return
        action, name, body = self.state.effects.pop(op["name"])
        _ACTIONS[action](self, op, name, body)

    # -- what a DONE operation did
    def _insert(self, op: dict[str, Any], name: str, body: dict[str, Any]) -> None:
        zone = op["zone"]
        self.state.instances[name] = {
            **body, "kind": "compute#instance", "id": str(next(_ids)), "name": name,
            "zone": zone, "status": "RUNNING", "creationTimestamp": _stamp(),
            "lastStartTimestamp": _stamp(), "selfLink": f"{zone}/instances/{name}",
            "resourceStatus": {"physicalHost": f"/host-{next(_ids)}"}}

    def _delete(self, op: dict[str, Any], name: str, body: dict[str, Any]) -> None:
        self.state.instances.pop(name, None)

    def _restart(self, op: dict[str, Any], name: str, body: dict[str, Any]) -> None:
        inst = self.state.instances[name]
        inst.update(status="RUNNING", lastStartTimestamp=_stamp())

    def _stop(self, op: dict[str, Any], name: str, body: dict[str, Any]) -> None:
        self.state.instances[name].update(status="TERMINATED", lastStopTimestamp=_stamp())

    def _start(self, op: dict[str, Any], name: str, body: dict[str, Any]) -> None:
        inst = self.state.instances[name]
        # a start places the VM anew: on another host, past the old host's maintenance
        inst.update(status="RUNNING", lastStartTimestamp=_stamp(),
                    resourceStatus={"physicalHost": f"/host-{next(_ids)}"})

    def _faulty(self, op: dict[str, Any], name: str, body: dict[str, Any]) -> None:
        self.state.faults_reported.append({"instance": name, **body})
        self._start(op, name, body)


_ACTIONS = {"insert": ComputeStandin._insert, "delete": ComputeStandin._delete,
            "reset": ComputeStandin._restart, "stop": ComputeStandin._stop,
            "start": ComputeStandin._start, "reportHostAsFaulty": ComputeStandin._faulty}


def _handler(standin: ComputeStandin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _serve(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                status, answer = standin._error(400, "parseError", "body is not JSON")
            else:
                status, answer = standin.handle(self.command, url.path, parse_qs(url.query), body)
            data = json.dumps({k: v for k, v in answer.items() if not k.startswith("_")}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _serve

    return Handler


@contextmanager
def running() -> Iterator[ComputeStandin]:
    standin = ComputeStandin().start()
    try:
        yield standin
    finally:
        standin.close()
