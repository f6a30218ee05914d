#!/usr/bin/env python3
"""Load test of the emulator stack: agents, XID faults and API clients at the same time.

    .venv/bin/python bench/stack_load.py [--nodes 32] [--rates 10,25] [--clients 4] [--seconds 75]

The stack and its cluster are ``bench/stack_bench.py``'s (``bench_cluster``: emulators,
every function as its own functions-framework server, the open repair policy, a
modelDevelopmentCluster of ``--nodes`` workers created through the API). Then, for each
offered report rate, one phase of ``--seconds`` with no API clients (the reference; skip it
with ``--no-reference``) and one with ``--clients`` of them, each phase running at once:

- agents: healthy reports of the fleet's nodes, round robin, at the offered rate, published
  to ``mtc-node``; handled = health_triage's idempotency record exists (read after the
  phase, so the reads do not load the phase), latency = publish to the handler's start;
- faults: an XID 79 report every ``--xid-every`` seconds on the next node; latency = publish
  to the drain decision (``node.draining`` or ``node.repair_started``) on the tap;
- API clients: each a thread with its own HTTP session and the stack's bearer token, doing
  a read-heavy user's mix through the Vertex AI REST API (``MIX``): list custom jobs with a
  pageSize, get one, list the clusters, list and get operations, list the cluster's nodes,
  and now and then create a small job (``sleep``) and cancel it; ``--think`` seconds
  between calls. Every call is timed; an answer >= 400 (or no answer) is an error, counted
  by its status, and not retried.

Each phase also records the load average and the CPU each process used (functions,
emulators, this process, the whole machine), to tell what saturates first. Progress goes
to stderr every ``--progress`` seconds; a table to stdout; everything as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from load_stats import CpuMeter, failed, quantiles  # noqa: E402
from stack_bench import (  # noqa: E402
    CLUSTER_ID,
    H100,
    BenchCluster,
    Tap,
    bench_cluster,
    drain_figures,
    handled_figures,
    healthy,
    publish_report,
    report_xid79,
    wait_handled,
)

# (kind, weight): what a user of the API does, mostly reading
MIX: tuple[tuple[str, int], ...] = (
    ("list_jobs", 4), ("get_job", 4), ("list_clusters", 2), ("list_operations", 1),
    ("get_operation", 1), ("list_nodes", 1), ("create_cancel_job", 1))
RETRIES = 2
KINDS = ("list_jobs", "get_job", "list_clusters", "list_operations", "get_operation",
         "list_nodes", "create_job", "cancel_job")


def small_job(partition: str) -> dict[str, Any]:
    """A one-node CustomJob that sleeps: cheap for the machine if it starts at all."""
    return {
        "displayName": "load probe",
        "labels": {"mtc-load": "probe"},
        "jobSpec": {
            "persistentResourceId": CLUSTER_ID,
            "workerPoolSpecs": [{
                "machineSpec": H100, "replicaCount": "1",
                "containerSpec": {"imageUri": "local/sleep:latest", "command": ["sleep", "30"]}}],
            "scheduling": {"mtcPartition": partition},
        },
    }


@dataclass
class ApiClient:
    """One user of the API: a thread calling ``MIX`` until ``stop`` is set."""

    url: str
    token: str
    parent: str
    operation: str  # an Operation's name to get (the cluster's create)
    partition: str
    seed: int
    think_s: float
    jobs: list[str]  # job names seen, shared by the clients
    # kind, status, seconds, retries
    calls: list[tuple[str, str, float, int]] = field(default_factory=list)
    created: int = 0
    said: dict[tuple[str, str], str] = field(default_factory=dict)  # first error answer

    def call(self, session: requests.Session, kind: str, method: str, path: str,
             body: Any = None) -> Any:
        """One call as a client library makes it: a 503 UNAVAILABLE (the store busy) is
        tried again after its Retry-After, up to ``RETRIES`` times (every call in the mix is
        idempotent: creates name their job); timed from the first try to the answer."""
        t = time.perf_counter()
        for attempt in range(RETRIES + 1):
            try:
                resp = session.request(method, f"{self.url}/{path}", json=body, timeout=30)
                status, answer = str(resp.status_code), resp
            except requests.Timeout:
                status, answer = "timeout", None
            except requests.RequestException:
                status, answer = "no answer", None
            if status != "503" or attempt == RETRIES or answer is None:
                break
            time.sleep(min(5.0, float(answer.headers.get("Retry-After", "1"))))
        self.calls.append((kind, status, time.perf_counter() - t, attempt))
        if answer is None or answer.status_code >= 400:
            self.said.setdefault((kind, status), answer.text[:300] if answer is not None else status)
            return None
        return answer.json()

    def run(self, stop: threading.Event) -> None:
        rng = random.Random(self.seed)
        kinds, weights = zip(*MIX, strict=True)
        v1, beta = f"v1/{self.parent}", f"v1beta1/{self.parent}"
        with requests.Session() as s:
            s.headers["Authorization"] = f"Bearer {self.token}"
            # a user looks at what is there first; then the mix (on a loaded machine a
            # phase may see only a few calls a client, and every figure wants the listings)
            opening = ["list_jobs", "list_clusters"]
            while not stop.is_set():
                kind = opening.pop(0) if opening else rng.choices(kinds, weights)[0]
                if kind == "get_job" and not self.jobs:
                    kind = "create_cancel_job"  # nothing to get yet: make something
                if kind == "list_jobs":
                    page = self.call(s, kind, "GET", f"{v1}/customJobs?pageSize=20")
                    for job in (page or {}).get("customJobs", []):
                        if job["name"] not in self.jobs:
                            self.jobs.append(job["name"])
                elif kind == "get_job":
                    self.call(s, kind, "GET", f"v1/{rng.choice(self.jobs)}")
                elif kind == "list_clusters":
                    self.call(s, kind, "GET", f"{beta}/modelDevelopmentClusters?pageSize=20")
                elif kind == "list_operations":
                    self.call(s, kind, "GET", f"{v1}/operations?pageSize=20")
                elif kind == "get_operation":
                    self.call(s, kind, "GET", f"v1beta1/{self.operation}")
                elif kind == "list_nodes":
                    self.call(s, kind, "GET", f"{beta}/modelDevelopmentClusters/{CLUSTER_ID}"
                              "/nodes?pageSize=100")
                else:
                    self.created += 1
                    job = self.call(s, "create_job", "POST", f"{v1}/customJobs?customJobId="
                                    f"load-{self.seed}-{self.created}", small_job(self.partition))
                    if job is not None:
                        self.jobs.append(job["name"])
                        self.call(s, "cancel_job", "POST", f"v1/{job['name']}:cancel",
                                  {"reason": "load test"})
                stop.wait(self.think_s)


def api_figures(clients: list[ApiClient], seconds: float) -> dict[str, Any]:
    """Per call kind: count, errors by status, p50/p99 latency; and all calls together."""
    calls = [c for client in clients for c in client.calls]
    by_kind: dict[str, Any] = {}
    for kind in KINDS:
        mine = [c for c in calls if c[0] == kind]
        errors: dict[str, int] = {}
        for _, status, _, _ in mine:
            if failed(status):
                errors[status] = errors.get(status, 0) + 1
        said = {status: text for client in clients for (k, status), text in client.said.items()
                if k == kind}
        by_kind[kind] = {"count": len(mine), "errors": errors,
                         "retried": sum(1 for c in mine if c[3]), **quantiles(mine),
                         "first_error": said}
    return {"calls": len(calls), "calls_per_s": round(len(calls) / seconds, 1),
            "errors": sum(1 for c in calls if failed(c[1])),
            "retried": sum(1 for c in calls if c[3]), **quantiles(calls), "by_kind": by_kind}


def stack_pids(bench: BenchCluster, state_dir: Path) -> dict[str, int]:
    """The processes to watch: every function, both emulators, this benchmark."""
    pids = {name: proc.pid for name, proc in bench.stack.procs.items()}
    for name in ("pubsub", "firestore"):
        pidfile = state_dir / "emulators" / f"{name}.pid"
        if pidfile.exists():
            pids[name] = int(pidfile.read_text())
    pids["bench"] = os.getpid()
    return pids


@dataclass
class Phase:
    """One load point: ``rate`` reports/s, ``clients`` API clients, for ``seconds``."""

    rate: float
    clients: int
    seconds: float
    xid_every_s: float
    think_s: float
    sent: dict[str, float] = field(default_factory=dict)  # report key -> publish time
    xids: list[tuple[str, float]] = field(default_factory=list)  # node, publish time
    api: list[ApiClient] = field(default_factory=list)

    def agents(self, bench: BenchCluster, stop: threading.Event) -> None:
        futures = []
        start, nodes = time.time(), bench.nodes
        for i in range(int(self.rate * self.seconds)):
            if stop.wait(max(0.0, start + i / self.rate - time.time())):
                break
            key, t, future = publish_report(bench.stack, nodes[i % len(nodes)],
                                            healthy(time.time()), "//bench/agent")
            futures.append(future)
            self.sent[key] = t
        for f in futures:
            f.result(timeout=60)

    def faults(self, bench: BenchCluster, stop: threading.Event, cursor: list[int]) -> None:
        """Round robin over the nodes, carried across phases (``cursor``), so that a node is
        hit again only after every other one: its repair has long finished by then."""
        while not stop.wait(self.xid_every_s):
            node = bench.nodes[cursor[0] % len(bench.nodes)]
            cursor[0] += 1
            self.xids.append((node, report_xid79(bench.stack, node)))


def run_phase(bench: BenchCluster, tap: Tap, phase: Phase, pids: dict[str, int],
              cursor: list[int], jobs: list[str], seed: int, partitions: int,
              progress_s: float, label: str) -> dict[str, Any]:
    stack = bench.stack
    phase.api = [ApiClient(stack.urls["api"], stack.api_token, stack.parent,
                           bench.operation["name"], f"p{i % partitions}", seed + i,
                           phase.think_s, jobs) for i in range(phase.clients)]
    stop = threading.Event()
    meter = CpuMeter(pids)
    start = time.time()
    threads = [threading.Thread(target=phase.agents, args=(bench, stop), name="agents"),
               threading.Thread(target=phase.faults, args=(bench, stop, cursor), name="faults"),
               *(threading.Thread(target=c.run, args=(stop,), name=f"client{i}")
                 for i, c in enumerate(phase.api))]
    for t in threads:
        t.start()
    while (left := start + phase.seconds - time.time()) > 0:
        time.sleep(min(progress_s, left))
        report_progress(label, phase, tap, time.time() - start)
    stop.set()
    cpu = meter.percent()
    load = [round(x, 2) for x in os.getloadavg()]
    for t in threads:
        t.join(timeout=90)
    print(f"{label}: waiting for the reports and drains still on their way", file=sys.stderr)
    handled = wait_handled(stack, phase.sent)
    return {"offered_per_s": phase.rate, "clients": phase.clients, "seconds": phase.seconds,
            "reports": {"published": len(phase.sent), **handled_figures(phase.sent, handled,
                                                                          start)},
            "report_to_drain": {"xid_every_s": phase.xid_every_s, "samples": len(phase.xids),
                                **drain_figures(tap, phase.xids)},
            "api": api_figures(phase.api, phase.seconds) if phase.api else None,
            "load_avg": load, "cpu_pct": cpu}


def report_progress(label: str, phase: Phase, tap: Tap, elapsed: float) -> None:
    drains = sum(tap.first_after(node, t) is not None for node, t in phase.xids)
    calls = [c for client in phase.api for c in client.calls]
    errors = sum(1 for c in calls if failed(c[1]))
    print(f"{label}: {elapsed:5.0f}/{phase.seconds:g} s  reports {len(phase.sent)}  "
          f"xid {len(phase.xids)} (drained {drains})  api calls {len(calls)} "
          f"({errors} errors)  load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)


def table(results: dict[str, Any]) -> str:
    """The phases, then each phase's API calls by kind."""
    def ms(d: dict[str, Any]) -> str:
        return f"{d['p50_ms']}/{d['p99_ms']}"

    lines = ["offered/s clients  handled/s  report->handler p50/p99 ms  drains  "
             "report->drain p50/p99 ms  api calls/s  api p50/p99 ms  errors  load1"]
    for p in results["phases"]:
        r, d, a = p["reports"], p["report_to_drain"], p["api"]
        lines.append(
            f"{p['offered_per_s']:9g} {p['clients']:7d} {r['handled_per_s']:10g}  {ms(r):>26}  "
            f"{d['measured']:3d}/{d['samples']:<3d} {ms(d):>24}  "
            f"{a['calls_per_s'] if a else '-':>11}  {ms(a) if a else '-':>14}  "
            f"{a['errors'] if a else '-':>6}  {p['load_avg'][0]:5.2f}")
    for p in results["phases"]:
        if not p["api"]:
            continue
        lines.append(f"\nAPI at {p['offered_per_s']:g} reports/s, {p['clients']} clients:")
        lines.append(f"{'call':18} {'count':>6} {'p50 ms':>8} {'p99 ms':>8} {'retried':>7}  "
                     "errors")
        for kind, k in p["api"]["by_kind"].items():
            lines.append(f"{kind:18} {k['count']:6d} {k['p50_ms'] or '-':>8} "
                         f"{k['p99_ms'] or '-':>8} {k['retried']:7d}  "
                         f"{k['errors'] or '-'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=32)
    parser.add_argument("--per-partition", type=int, default=4)
    parser.add_argument("--rates", default="10,25", help="offered reports/s, comma-separated")
    parser.add_argument("--clients", type=int, default=4, help="concurrent API clients")
    parser.add_argument("--seconds", type=float, default=75.0, help="per phase")
    parser.add_argument("--xid-every", type=float, default=2.0,
                        help="seconds between XID 79 reports")
    parser.add_argument("--think", type=float, default=0.25,
                        help="seconds each API client waits between calls")
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the phase without API clients before each rate")
    parser.add_argument("--agent-interval", type=float, default=10.0,
                        help="background heartbeat period of every node (the stack's agents)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds between phases")
    parser.add_argument("--progress", type=float, default=5.0, help="seconds between lines")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--state-dir", type=Path, default=ROOT / "var" / "bench-load")
    parser.add_argument("--out", type=Path, default=ROOT / "var" / "bench" / "stack_load.json")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.clients < 0 or args.seconds <= 0 or args.xid_every <= 0:
        parser.error("--nodes and --seconds and --xid-every must be positive, --clients >= 0")
    rates = [float(r) for r in args.rates.split(",") if r]
    if not rates or min(rates) <= 0:
        parser.error("--rates: positive reports/s, comma-separated")
    points = [(rate, k) for rate in rates
              for k in ([] if args.no_reference or not args.clients else [0]) + [args.clients]]

    tap = Tap()
    results: dict[str, Any] = {
        "nodes": args.nodes, "per_partition": args.per_partition,
        "background_reports_per_s": round(args.nodes / args.agent_interval, 1),
        "think_s": args.think, "cpus": os.cpu_count(), "phases": []}
    cursor: list[int] = [0]
    jobs: list[str] = []
    with bench_cluster(args.state_dir, args.nodes, args.per_partition, args.agent_interval,
                       tap) as bench:
        results["cluster_ready_s"] = bench.ready_s
        pids = stack_pids(bench, args.state_dir.resolve())
        for i, (rate, k) in enumerate(points):
            label = f"phase {i + 1}/{len(points)} ({rate:g} reports/s, {k} clients)"
            phase = Phase(rate, k, args.seconds, args.xid_every, args.think)
            result = run_phase(bench, tap, phase, pids, cursor, jobs, args.seed + 100 * i,
                               -(-args.nodes // args.per_partition), args.progress, label)
            print(f"{label}: {json.dumps(result)}", file=sys.stderr)
            results["phases"].append(result)
            time.sleep(args.settle)
        results["events_seen"] = tap.count
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(table(results))
    print(f"(JSON: {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
