#!/usr/bin/env python3
"""`make stack`: the self-healing story through the Google Cloud stack, run locally for real.

    .venv/bin/python scripts/stack.py [--state-dir var/stack] [--steps 120] [--keep]

Starts the Pub/Sub and Firestore emulators (scripts/emulators.sh), every function under
functions-framework as its own HTTP server (five CloudEvent services, the Vertex AI REST
API, the provisioning steps), creates the topics and one push subscription per
(service, family) with a dead-letter policy, and runs the same scenario as `make demo`:
a cluster comes up, the example training job runs on two nodes, an XID 79 hits one of them,
and the node is drained, the job checkpoints on SIGTERM, is requeued on the spare, resumes,
the node is rebooted, passes its checks and returns to service, and the job succeeds.
Every event is read off Pub/Sub (a tap subscription per topic) and printed as it flows.

The story is driven through the API as a client would: a modelDevelopmentCluster is created
and its Operation waited on (``:wait``), the customJob is submitted with a ``customJobId``,
and the job's ``state``/``mtcProgress`` and the cluster's ``nodes`` are read back over HTTP.
The api function gets a random admin token in ``MTC_API_TOKEN``; every call sends it.

The machines are LocalCompute (simulated nodes, real subprocess workers): the functions
call it, and a "machines" loop here polls it and publishes what happened to Pub/Sub. A
tick (POST /tick on the steps function, as Cloud Scheduler would) runs every few seconds.

Everything started here is stopped by PID on exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import requests  # noqa: E402

from services.wiring.routes import SERVICES, control_plane_routes  # noqa: E402
from shared.adapters import pubsub as ps  # noqa: E402
from shared.adapters.docstore import DocUnitOfWork  # noqa: E402
from shared.adapters.firestore_store import FirestoreDocStore  # noqa: E402
from shared.adapters.outbox import envelope_to_doc  # noqa: E402
from shared.codec import from_pubsub_message  # noqa: E402
from shared.domain.events import Envelope  # noqa: E402

if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))
from stack_story import CLUSTER_ID, JOB_ID, node_table, story  # noqa: E402

ROUTES = control_plane_routes()

PROJECT = "mtc-local"
LOCATION = "us-central1"
EMULATORS = ROOT / "scripts" / "emulators.sh"


@dataclass(frozen=True)
class Function:
    name: str
    source: str
    target: str
    signature: str


# every function from the root main.py, by its entry point: what Cloud Functions deploys
FUNCTIONS = [
    *(Function(s, "main.py", s, "cloudevent") for s in SERVICES),
    Function("api", "main.py", "api", "http"),
    Function("steps", "main.py", "steps", "http"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], name: str, timeout_s: float = 90
              ) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"function {name} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(f"function {name} did not listen on {port} within {timeout_s} s")


@dataclass
class Stack:
    """Emulators, functions, topology, tap and machines; ``stop`` undoes all of it."""

    state_dir: Path
    project: str = PROJECT
    location: str = LOCATION
    # the api function's admin bearer token (MTC_API_TOKEN): new for every stack
    api_token: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    agent_interval_s: float = 1.0
    grace_period_s: float = 10.0
    heartbeat_timeout_s: float = 30.0
    tick_s: float = 5.0
    # Simulated machines take this long: a result must not come back before the transaction
    # that asked for it commits (the emulator can hold a contended commit about 2 s).
    provision_duration_s: float = 3.0
    repair_duration_s: float = 3.0
    # transient failures (the emulator's lock storms under load) are retried for about
    # 2.5 min of backoff before a message is dead-lettered (ps.DeliverySettings)
    delivery: ps.DeliverySettings = field(default_factory=lambda: ps.DeliverySettings(
        ack_deadline_s=60, max_delivery_attempts=20, min_backoff_s=0.5, max_backoff_s=10))
    log: Callable[[str], None] = print
    extra_env: dict[str, str] = field(default_factory=dict)  # for every function
    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    started_emulators: bool = False
    store: FirestoreDocStore | None = None
    publisher: ps.PubSubPublisher | None = None
    compute: Any = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _pulls: list[Any] = field(default_factory=list)

    # ------------------------------------------------------------ start
    def start(self, on_event: Callable[[Envelope], None] | None = None) -> None:
        if self.state_dir.exists():
            shutil.rmtree(self.state_dir)
        (self.state_dir / "logs").mkdir(parents=True)
        self._start_emulators()
        self._start_functions()
        self.store = FirestoreDocStore.connect(self.project)
        self.publisher = ps.PubSubPublisher(self.project)
        endpoints = {f.name: self.urls[f.name] + "/" for f in FUNCTIONS if f.name in SERVICES}
        plans = ps.ensure_topology(self.project, endpoints, ROUTES, settings=self.delivery)
        self.log(f"pubsub: {len(ps.topics(ROUTES))} topics + {ps.dead_letter_topic_id()}, "
                 f"{len(plans)} push subscriptions (ack {self.delivery.ack_deadline_s} s, "
                 f"dead letter after {self.delivery.max_delivery_attempts} attempts)")
        if on_event is not None:
            self._start_tap(on_event)
        self._start_machines()

    def _start_emulators(self) -> None:
        env = {**os.environ, "MTC_EMULATORS_DIR": str(self.state_dir / "emulators"),
               "GOOGLE_CLOUD_PROJECT": self.project}
        proc = subprocess.run([str(EMULATORS), "start"], env=env, capture_output=True,
                              text=True, timeout=180)
        if proc.returncode != 0:
            raise SystemExit(f"stack: emulators did not start:\n{proc.stderr.strip()}")
        self.started_emulators = True
        self.log(proc.stdout.strip().splitlines()[0])
        for line in (self.state_dir / "emulators" / "emulators.env").read_text().splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            self.env[key] = value
        os.environ.update(self.env)

    def _function_env(self, fn: Function) -> dict[str, str]:
        return {
            **os.environ, **self.env,
            "MTC_BACKEND": "gcp",
            "MTC_COMPUTE": "local",
            "MTC_STATE_DIR": str(self.state_dir),
            "MTC_AGENT_INTERVAL_S": str(self.agent_interval_s),
            "MTC_GRACE_PERIOD_S": str(self.grace_period_s),
            "MTC_HEARTBEAT_TIMEOUT_S": str(self.heartbeat_timeout_s),
            "MTC_LOCAL_COMPUTE": json.dumps({
                "provision_duration_s": self.provision_duration_s,
                "repair_durations_s": {a: self.repair_duration_s
                                       for a in ("reset_gpu", "reboot", "reimage", "replace")}}),
            "K_SERVICE": ps.function_name(fn.name),
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "WORKERS": "1",
            "THREADS": "8",
            **self.extra_env,
            **({"MTC_API_TOKEN": self.api_token} if fn.name == "api" else {}),
        }

    def _start_functions(self) -> None:
        ports = {}
        for fn in FUNCTIONS:
            port = free_port()
            log = open(self.state_dir / "logs" / f"{fn.name}.log", "wb")  # noqa: SIM115
            cmd = [sys.executable, "-m", "functions_framework", "--target", fn.target,
                   "--source", str(ROOT / fn.source), "--signature-type", fn.signature,
                   "--host", "127.0.0.1", "--port", str(port)]
            self.procs[fn.name] = subprocess.Popen(
                cmd, cwd=ROOT, env=self._function_env(fn), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
            ports[fn.name] = port
            self.urls[fn.name] = f"http://127.0.0.1:{port}"
        for fn in FUNCTIONS:
            wait_port(ports[fn.name], self.procs[fn.name], fn.name)
        self.log("functions: " + ", ".join(
            f"{fn.name}={self.urls[fn.name]} (pid {self.procs[fn.name].pid})" for fn in FUNCTIONS))

    def _start_tap(self, on_event: Callable[[Envelope], None]) -> None:
        sub = ps.subscriber_client()
        for path in ps.tap(self.project, "stack", ROUTES, subscriber=sub):
            def callback(message: Any) -> None:
                message.ack()
                try:
                    env = from_pubsub_message({"attributes": dict(message.attributes),
                                               "data": message.data})
                except Exception:
                    return
                on_event(env)
            self._pulls.append(sub.subscribe(path, callback=callback))

    def _start_machines(self) -> None:
        """LocalCompute polled here (``make stack``); ``stack_slurm`` starts an executor
        over a Slurm cluster instead."""
        from services.wiring.builder import make_compute
        from shared.adapters.clock import SystemClock

        assert self.publisher is not None
        # repairs complete by the durations of the LocalCompute that started them (the
        # repair function's); this one polls, injects faults and heartbeats
        self.compute = make_compute("local", self.state_dir, self.publisher.publish,
                                    SystemClock(),
                                    options={"agent_interval_s": self.agent_interval_s})
        self._threads.append(threading.Thread(target=self._machines, name="machines",
                                              daemon=True))
        self._threads[-1].start()
        self._start_ticks()

    def _start_ticks(self) -> None:
        """POST /tick on the steps function every ``tick_s``, as Cloud Scheduler would."""
        self._threads.append(threading.Thread(target=self._ticks, name="ticks", daemon=True))
        self._threads[-1].start()

    def _machines(self) -> None:
        while not self._stop.wait(0.2):
            try:
                self.compute.poll()
            except Exception as exc:
                self.log(f"machines: poll failed: {exc}")

    def _ticks(self) -> None:
        while not self._stop.wait(self.tick_s):
            with contextlib.suppress(requests.RequestException):
                requests.post(self.urls["steps"] + "/tick", json={}, timeout=30)

    # ------------------------------------------------------------ use
    def uow(self) -> DocUnitOfWork:
        assert self.store is not None
        return DocUnitOfWork(self.store)

    @property
    def parent(self) -> str:
        return f"projects/{self.project}/locations/{self.location}"

    def api(self, method: str, path: str, body: Any = None, timeout_s: float = 60) -> Any:
        """One API call with the stack's bearer token; ``path`` starts at the version
        (``/v1/...``). A GET answered 503 UNAVAILABLE (the store busy) is tried again after
        its ``Retry-After``, as the SDK's retry would; any other 4xx or 5xx raises, with the
        google.rpc.Status it answered."""
        for _ in range(5):
            resp = requests.request(method, self.urls["api"] + path, json=body,
                                    timeout=timeout_s,
                                    headers={"Authorization": f"Bearer {self.api_token}"})
            if resp.status_code != 503 or method != "GET":
                break
            time.sleep(float(resp.headers.get("Retry-After", "1")))
        if resp.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {resp.status_code} {resp.text}")
        return resp.json()

    def create_cluster(self, cluster_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a modelDevelopmentCluster: its create Operation."""
        return self.api(  # type: ignore[no-any-return]
            "POST", f"/v1beta1/{self.parent}/modelDevelopmentClusters"
            f"?modelDevelopmentClusterId={cluster_id}", body)

    def wait_operation(self, operation: dict[str, Any], timeout_s: float = 180,
                       step_s: float = 30) -> dict[str, Any]:
        """``:wait`` on the Operation (each call returns at ``step_s`` at the latest) until it
        is done; an Operation that ends in ``error`` raises."""
        deadline = time.monotonic() + timeout_s
        op = operation
        while not op.get("done"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise SystemExit(f"stack: {operation['name']} not done within {timeout_s} s")
            wait_s = min(step_s, left)
            op = self.api("POST", f"/v1beta1/{operation['name']}:wait",
                          {"timeout": f"{wait_s:.1f}s"}, timeout_s=wait_s + 30)
        if "error" in op:
            raise SystemExit(f"stack: {op['name']} failed: {op['error']}")
        return op

    def submit_job(self, job_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.api(  # type: ignore[no-any-return]
            "POST", f"/v1/{self.parent}/customJobs?customJobId={job_id}", body)

    def job(self, job_id: str) -> dict[str, Any]:
        return self.api("GET", f"/v1/{self.parent}/customJobs/{job_id}")  # type: ignore[no-any-return]

    def nodes(self, cluster_id: str) -> list[dict[str, Any]]:
        """The cluster's nodes (mtc's ``.../nodes`` extension), every page."""
        out: list[dict[str, Any]] = []
        token = ""
        while True:
            page = self.api("GET", f"/v1beta1/{self.parent}/modelDevelopmentClusters/"
                            f"{cluster_id}/nodes?pageSize=1000"
                            + (f"&pageToken={token}" if token else ""))
            out.extend(page.get("nodes", []))
            token = page.get("nextPageToken", "")
            if not token:
                return out

    # ------------------------------------------------------------ stop
    def stop(self) -> None:
        self._stop.set()
        for pull in self._pulls:
            with contextlib.suppress(Exception):
                pull.cancel()
        for t in self._threads:
            t.join(timeout=10)
        if self.compute is not None:
            with contextlib.suppress(Exception):
                self.compute.kill_all()
            with contextlib.suppress(Exception):
                self.compute.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.log(f"stack: {name} (pid {proc.pid}) ignored SIGTERM; killing it")
                proc.kill()
                proc.wait(timeout=5)
        if self.procs:
            self.log("stack: stopped functions " + ", ".join(
                f"{n} (pid {p.pid})" for n, p in self.procs.items()))
        self.procs.clear()
        if self.started_emulators:
            env = {**os.environ, "MTC_EMULATORS_DIR": str(self.state_dir / "emulators")}
            stopped = subprocess.run([str(EMULATORS), "stop"], env=env, capture_output=True,
                                     text=True, timeout=60)
            for line in stopped.stdout.strip().splitlines():
                self.log(f"stack: {line}")
            self.started_emulators = False


@contextlib.contextmanager
def running(stack: Stack, on_event: Callable[[Envelope], None] | None = None
            ) -> Iterator[Stack]:
    """Start the stack; stop it on exit, on Ctrl-C and on SIGTERM."""
    previous = signal.getsignal(signal.SIGTERM)

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, terminate)
    try:
        stack.start(on_event)
        yield stack
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()
        signal.signal(signal.SIGTERM, previous)


class Timeline:
    """The events read off the tap, printed as they flow (routine heartbeats and ticks are
    kept but not printed) and recorded in the Firestore event log for ``mtc events``."""

    def __init__(self, console: Any, t0: float, stack: Stack,
                 after: Callable[[Envelope], None] | None = None) -> None:
        self.console = console
        self.t0 = t0
        self.stack = stack
        self.after = after
        self.seen: list[Envelope] = []
        self.lock = threading.Lock()

    def __call__(self, env: Envelope) -> None:
        from rich.markup import escape

        from services.presentation.timeline import describe, is_routine
        from services.presentation.timeline import style as _style

        doc = envelope_to_doc(env)
        with self.lock:
            self.seen.append(env)
        if is_routine(doc):
            return
        lag = max(0.0, time.time() - env.time)
        style = _style(env.type)
        self.console.print(f"[dim]{env.time - self.t0:7.2f}s[/dim]  [{style}]"
                           f"{escape(describe(doc))}[/{style}] [dim](+{lag * 1000:.0f} ms via "
                           "pubsub)[/dim]")
        if self.after is not None:
            self.after(env)

    def docs(self) -> list[dict[str, Any]]:
        with self.lock:
            return [envelope_to_doc(e) for e in self.seen]


def print_result(console: Any, stack: Stack, timeline: Timeline, job: dict[str, Any],
                 t0: float) -> bool:
    """The job, its goodput, the events and the node list; whether the job succeeded."""
    from services.presentation.timeline import is_routine
    from shared.goodput import job_accounting

    ok = job["state"] == "JOB_STATE_SUCCEEDED"
    time.sleep(1.0)  # let the last events reach the tap
    console.rule("[bold]result")
    docs = timeline.docs()
    acct = job_accounting(docs, JOB_ID)
    colour = "green" if ok else "red"
    progress = job["mtcProgress"]
    checkpoint = progress.get("latestCheckpoint", {}).get("step", "-")
    console.print(f"job {JOB_ID}: [bold {colour}]{job['state']}[/]  restarts: "
                  f"{progress['restartCount']}  attempts: {progress['attempt']}  "
                  f"last checkpoint: step {checkpoint}")
    console.print(f"lost work: {acct.lost_steps} step(s) recomputed; goodput: "
                  f"runtime {acct.runtime_goodput:.1%} (recovery {acct.recovery_s:.1f} s "
                  f"of {acct.wall_s:.1f} s)")
    console.print(f"events through Pub/Sub: {len(docs)} "
                  f"({sum(1 for d in docs if is_routine(d))} routine heartbeats/ticks)")
    console.print(node_table(stack.nodes(CLUSTER_ID)))
    console.print(f"stack wall time: {time.time() - t0:.1f} s")
    return ok


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.markup import escape

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, default=ROOT / "var" / "stack")
    parser.add_argument("--steps", type=int, default=120, help="training steps of the job")
    parser.add_argument("--keep", action="store_true",
                        help="keep everything running after the story until Ctrl-C")
    args = parser.parse_args(argv)

    console = Console(highlight=False)
    t0 = time.time()
    stack = Stack(args.state_dir.resolve(), log=lambda m: console.print(f"[dim]{escape(m)}"))
    timeline = Timeline(console, t0, stack)
    console.rule("[bold]mtc self-healing on the emulator stack (Firestore, Pub/Sub push, "
                 "functions-framework)")
    ok = False
    try:
        with running(stack, timeline):
            job = story(stack, args.steps, console, t0)
            ok = print_result(console, stack, timeline, job, t0)
            if args.keep:
                console.print("[bold]running; Ctrl-C stops everything")
                while True:
                    time.sleep(3600)
    except KeyboardInterrupt:
        console.print("[bold]interrupted: stopping everything")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
