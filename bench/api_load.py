#!/usr/bin/env python3
"""Mixed API load on `mtc serve` with many jobs stored: req/s, p50/p99 and fault-to-drain per
number of concurrent clients (docs/server.md records a run).

    PYTHONPATH=. .venv/bin/python bench/api_load.py [--jobs 1000] [--levels 1,4,16,32]
        [--seconds 20] [--faults 2] [--json var/bench/api_load.json]

The state directory is made in process first (``bench/api_seed.py``): cluster ``c1`` with
``--jobs`` finished jobs, and one small cluster (two idle workers) per fault to inject, so that
no fault meets the blast-radius guard of another. Then ``mtc serve`` runs on it (loopback, a
free port) and a job that sleeps takes ``c1``'s one worker: the jobs the load creates queue
behind it and are cancelled while queued (no process starts under load).

A reference phase with no clients, then one phase of ``--seconds`` per client level. Each
client is a thread with its own keep-alive connection calling back to back (``--think``
seconds between calls), drawing from ``MIX``: a page of 20 jobs, a page filtered by state, a
job by id (of the stored ones), and a create followed by a cancel of the job it made. Every
call is timed; an answer >= 400 (or none) is an error. During each phase ``--faults`` XID 79
reports go to idle workers (``:reportHealth``, evenly spaced in the phase); fault-to-drain is
from sending the report until the node list shows the node out of service (polled every
``POLL_S`` on a connection of its own, as a client sees it); "(server)" is the mean of the
server's own measure (``/metrics``' ``mtc_fault_to_drain_seconds``: the report's observation
to the drain decision), which no client's queueing is in.

Prints a table; ``--json`` writes every figure, with each call kind's.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))

from api_seed import PARENT, TOKEN, in_process, job_body, seed
from load_stats import CpuMeter, failed, quantiles

from tests.serving import mtc_serve

# (kind, weight): a user of the API, mostly reading
MIX: tuple[tuple[str, int], ...] = (("list_jobs", 3), ("list_filtered", 1), ("get_job", 4),
                                    ("create_cancel", 1))
KINDS = ("list_jobs", "list_filtered", "get_job", "create_job", "cancel_job")
OUT_OF_SERVICE = frozenset({"draining", "drained", "repairing", "verifying", "failed"})
POLL_S = 0.02
FILTER = 'state="JOB_STATE_RUNNING"'  # few match: the filter cannot stop at the first page


class Connection:
    """One keep-alive HTTP connection with the token; reconnects after a failure."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: Any = None) -> tuple[str, Any]:
        """(status, the JSON answer or None)."""
        status, data = self.raw(method, path, None if body is None else json.dumps(body))
        try:
            return status, json.loads(data) if data else None
        except ValueError:
            return status, None

    def raw(self, method: str, path: str, body: str | None = None) -> tuple[str, bytes]:
        """(status, the answer's bytes); ("no answer", b"") when none came."""
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            self.conn.request(method, path, body, self.headers)
            resp = self.conn.getresponse()
            return str(resp.status), resp.read()
        except (OSError, http.client.HTTPException):
            self.close()
            return "no answer", b""

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@dataclass
class Client:
    """One user: a thread calling ``MIX`` until ``stop`` is set."""

    url: str
    seed: int
    jobs: int
    think_s: float
    calls: list[tuple[str, str, float]] = field(default_factory=list)  # kind, status, s
    created: int = 0

    def call(self, conn: Connection, kind: str, method: str, path: str, body: Any = None
             ) -> Any:
        t = time.perf_counter()
        status, answer = conn.request(method, path, body)
        self.calls.append((kind, status, time.perf_counter() - t))
        return None if failed(status) else answer

    def run(self, stop: threading.Event) -> None:
        rng = random.Random(self.seed)
        kinds, weights = zip(*MIX, strict=True)
        base = f"/v1/{PARENT}/customJobs"
        conn = Connection(self.url)
        try:
            while not stop.is_set():
                kind = rng.choices(kinds, weights)[0]
                if kind == "list_jobs":
                    self.call(conn, kind, "GET", f"{base}?pageSize=20")
                elif kind == "list_filtered":
                    self.call(conn, kind, "GET", f"{base}?pageSize=20&filter={FILTER}")
                elif kind == "get_job":
                    self.call(conn, kind, "GET", f"{base}/j{rng.randrange(self.jobs)}")
                else:
                    self.created += 1
                    job_id = f"load-{self.seed}-{self.created}"
                    made = self.call(conn, "create_job", "POST", f"{base}?customJobId={job_id}",
                                     job_body("c1", ("sleep", "3600")))
                    if made is not None:
                        self.call(conn, "cancel_job", "POST", f"{base}/{job_id}:cancel", {})
                if self.think_s:
                    stop.wait(self.think_s)
        finally:
            conn.close()


def cluster_path(cluster_id: str) -> str:
    return f"/v1beta1/{PARENT}/modelDevelopmentClusters/{cluster_id}"


def node_view(conn: Connection, cluster_id: str, node_id: str) -> dict[str, Any]:
    """The node as the cluster's node list shows it ({} when the list did not answer)."""
    status, answer = conn.request("GET", f"{cluster_path(cluster_id)}/nodes?pageSize=100")
    for node in (answer or {}).get("nodes", []) if status == "200" else []:
        if node["nodeId"] == node_id:
            return dict(node)
    return {}


def worker_of(url: str, cluster_id: str) -> str:
    conn = Connection(url)
    status, answer = conn.request("GET", f"{cluster_path(cluster_id)}/nodes?pageSize=100")
    conn.close()
    assert status == "200", answer
    return next(n["nodeId"] for n in answer["nodes"] if n["role"] == "worker")


def fault_to_drain(url: str, cluster_id: str, node_id: str, timeout_s: float = 60.0
                   ) -> float | None:
    """Seconds from sending an XID 79 on ``node_id`` until the node list shows it out of
    service, or its failures counted one more (a repair that was over before a slow list
    answered); None if neither happened within ``timeout_s``."""
    conn = Connection(url)
    try:
        failures = node_view(conn, cluster_id, node_id).get("failures", 0)
        start = time.perf_counter()
        status, answer = conn.request(
            "POST", f"{cluster_path(cluster_id)}/nodes/{node_id}:reportHealth", {"xids": [79]})
        if status != "200":
            raise SystemExit(f"reportHealth on {node_id}: {status} {answer}")
        while time.perf_counter() - start < timeout_s:
            node = node_view(conn, cluster_id, node_id)
            if node.get("state") in OUT_OF_SERVICE or node.get("failures", 0) > failures:
                return time.perf_counter() - start
            time.sleep(POLL_S)
        return None
    finally:
        conn.close()


def server_drains(url: str) -> tuple[int, float]:
    """The server's own fault-to-drain histogram (``/metrics``: the report's observation to
    the drain decision), count and sum: healing as the control loop sees it."""
    conn = Connection(url)
    try:
        text = conn.raw("GET", "/metrics")[1].decode()
    finally:
        conn.close()
    values = dict(line.split(" ", 1) for line in text.splitlines()
                  if line.startswith("mtc_fault_to_drain_seconds_"))
    return (int(float(values.get("mtc_fault_to_drain_seconds_count", "0"))),
            float(values.get("mtc_fault_to_drain_seconds_sum", "0")))


@dataclass
class Phase:
    """``clients`` clients for ``seconds``, and a fault on each of ``targets`` (cluster,
    node) spaced evenly in it."""

    clients: int
    seconds: float
    think_s: float
    targets: list[tuple[str, str]]
    drains: list[float | None] = field(default_factory=list)

    def faults(self, url: str, start: float) -> None:
        for i, (cluster_id, node_id) in enumerate(self.targets):
            time.sleep(max(0.0, start + (i + 1) * self.seconds / (len(self.targets) + 1)
                           - time.monotonic()))
            self.drains.append(fault_to_drain(url, cluster_id, node_id))

    def run(self, url: str, jobs: int, seed: int, server_pid: int) -> dict[str, Any]:
        clients = [Client(url, seed + i, jobs, self.think_s) for i in range(self.clients)]
        stop = threading.Event()
        meter = CpuMeter({"server": server_pid, "bench": os.getpid()})
        drains_before = server_drains(url)
        start = time.monotonic()
        faults = threading.Thread(target=self.faults, args=(url, start), name="faults")
        threads = [threading.Thread(target=c.run, args=(stop,), name=f"client{i}")
                   for i, c in enumerate(clients)]
        for t in (faults, *threads):
            t.start()
        time.sleep(max(0.0, start + self.seconds - time.monotonic()))
        stop.set()
        elapsed = time.monotonic() - start
        cpu = meter.percent()
        for t in threads:
            t.join(timeout=90)
        faults.join(timeout=90)
        count, total = (a - b for a, b in zip(server_drains(url), drains_before, strict=True))
        calls = [c for client in clients for c in client.calls]
        measured = [d for d in self.drains if d is not None]
        by_kind = {kind: {"count": len(mine), "errors": sum(failed(c[1]) for c in mine),
                          **quantiles(mine)}
                   for kind in KINDS if (mine := [c for c in calls if c[0] == kind])}
        errors: dict[str, int] = {}
        for _, status, _ in calls:
            if failed(status):
                errors[status] = errors.get(status, 0) + 1
        return {"clients": self.clients, "seconds": round(elapsed, 1), "calls": len(calls),
                "calls_per_s": round(len(calls) / elapsed, 1), **quantiles(calls),
                "errors": errors, "by_kind": by_kind,
                "fault_to_drain_ms": [None if d is None else round(d * 1000, 1)
                                      for d in self.drains],
                "fault_to_drain_p50_ms": round(statistics.median(measured) * 1000, 1)
                if measured else None,
                "server_fault_to_drain_mean_ms": round(total / count * 1000, 1) if count
                else None,
                "load_avg": [round(x, 2) for x in os.getloadavg()], "cpu_pct": cpu}


def server_pid(state_dir: Path) -> int:
    """The pid of the `mtc serve` holding ``state_dir`` (a child of this process)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == os.getpid() and b"serve" in argv and str(state_dir).encode() in argv:
            return int(entry.name)
    raise RuntimeError("mtc serve's process not found")


def table(results: dict[str, Any]) -> str:
    lines = [f"{results['jobs']} jobs stored; mix {dict(MIX)}; think {results['think_s']} s",
             f"{'clients':>7} {'calls':>6} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
             f"{'errors':>6}  {'fault-to-drain ms':>18} {'(server)':>8}  {'server cpu%':>11} "
             f"{'load1':>5}"]
    for p in results["phases"]:
        drains = ", ".join("-" if d is None else f"{d:g}" for d in p["fault_to_drain_ms"])
        lines.append(
            f"{p['clients']:>7} {p['calls']:>6} {p['calls_per_s']:>7} "
            f"{p['p50_ms'] if p['p50_ms'] is not None else '-':>7} "
            f"{p['p99_ms'] if p['p99_ms'] is not None else '-':>7} "
            f"{sum(p['errors'].values()):>6}  {drains:>18} "
            f"{p['server_fault_to_drain_mean_ms'] or '-':>8}  {p['cpu_pct']['server']:>11} "
            f"{p['load_avg'][0]:>5}")
    lines.append("\np50/p99 ms by call:")
    lines.append(f"{'clients':>7} " + " ".join(f"{k:>17}" for k in KINDS))
    for p in results["phases"]:
        if p["clients"]:
            cells = [f"{k['p50_ms']}/{k['p99_ms']}" if (k := p["by_kind"].get(kind)) else "-"
                     for kind in KINDS]
            lines.append(f"{p['clients']:>7} " + " ".join(f"{c:>17}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs stored before the load")
    parser.add_argument("--levels", default="1,4,16,32", help="client counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase")
    parser.add_argument("--reference-seconds", type=float, default=10.0,
                        help="the phase with no clients")
    parser.add_argument("--faults", type=int, default=2, help="XID 79 reports per phase")
    parser.add_argument("--think", type=float, default=0.0,
                        help="seconds each client waits between calls")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between phases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="passed on to `mtc serve` (e.g. --serve-arg=--threads=4)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    levels = [int(k) for k in args.levels.split(",") if k]
    if args.jobs < 1 or not levels or min(levels) < 1 or args.seconds <= 0 or args.faults < 0:
        parser.error("--jobs, --levels and --seconds must be positive, --faults >= 0")
    phases = [Phase(0, args.reference_seconds, 0.0, []),
              *(Phase(k, args.seconds, args.think, []) for k in levels)]
    fault_clusters = [[f"f{p}x{i}" for i in range(args.faults)] for p in range(len(phases))]
    results: dict[str, Any] = {"jobs": args.jobs, "think_s": args.think, "mix": dict(MIX),
                               "filter": FILTER, "serve_args": args.serve_arg,
                               "cpus": os.cpu_count(), "phases": []}
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        t = time.monotonic()
        app, client = in_process(state)
        seed(app, client, args.jobs, clusters=tuple(c for cs in fault_clusters for c in cs))
        app.close()
        print(f"seeded {args.jobs} jobs in {time.monotonic() - t:.0f} s", file=sys.stderr)
        with mtc_serve(state, TOKEN, timeout_s=60, extra_args=args.serve_arg) as url:
            pid = server_pid(state)
            conn = Connection(url)
            status, answer = conn.request("POST", f"/v1/{PARENT}/customJobs?customJobId=blocker",
                                          job_body("c1", ("sleep", "3600")))
            conn.close()
            assert status == "200", answer
            for phase, clusters in zip(phases, fault_clusters, strict=True):
                phase.targets = [(c, worker_of(url, c)) for c in clusters]
            for i, phase in enumerate(phases):
                time.sleep(args.settle)
                result = phase.run(url, args.jobs, args.seed + 1000 * i, pid)
                print(f"{phase.clients} clients: {json.dumps(result)}", file=sys.stderr)
                results["phases"].append(result)
    print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
        print(f"(JSON: {args.json})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
