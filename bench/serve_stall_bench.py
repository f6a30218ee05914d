#!/usr/bin/env python3
"""Fault-to-drain and the latency of other requests on `mtc serve`, with and without stalled
clients, interleaved in one sitting (docs/server.md records a run).

    PYTHONPATH=. .venv/bin/python bench/serve_stall_bench.py [--rounds 6]
        [--silent 50] [--partial 50] [--idle 10]

One server, a cluster per fault. Each round injects an XID 79 on a worker through the API
(``:reportHealth``) while a load thread keeps asking for the cluster list, the node list and
``/healthz``, once with nothing else connected ("quiet") and once while ``--silent``
connections send nothing, ``--partial`` hold half a request and ``--idle`` keep-alives wait
("stalled"); the two modes alternate which goes first. Fault-to-drain is measured twice:
by the client (the inject call sent until ``/metrics`` counts one more drain, polled every
10 ms) and by the server (``mtc_fault_to_drain_seconds``: the report's observation to the
drain event). Prints each mode's figures and the stalled/quiet ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.serving import PARENT, create_cluster, mtc_serve
from tests.stalled_clients import drains_seen, inject_xid, nodes, stalled_clients

TOKEN = "bench-token"
MODES = ("quiet", "stalled")


class Load:
    """A thread asking other questions back to back; each answer's latency kept."""

    def __init__(self, url: str) -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        cluster = f"{url}/v1beta1/{PARENT}/modelDevelopmentClusters"
        self.calls = [(f"{cluster}", headers), (f"{cluster}/c0/nodes", headers),
                      (f"{url}/healthz", {})]
        self.latencies: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with requests.Session() as session:
            i = 0
            while not self._stop.is_set():
                target, headers = self.calls[i % len(self.calls)]
                i += 1
                t = time.perf_counter()
                try:
                    session.get(target, headers=headers, timeout=30).raise_for_status()
                except requests.RequestException:
                    self.failures += 1
                    continue
                self.latencies.append(time.perf_counter() - t)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


def one_fault(url: str, cluster_id: str) -> tuple[float, float, Load]:
    """(client fault-to-drain, server fault-to-drain, the load's record) for one XID 79, in
    a cluster of its own (the blast-radius guard holds a second repair in a partition that
    just had one: that would measure the policy, not the server)."""
    node = next(n["nodeId"] for n in nodes(url, TOKEN, cluster_id) if n["role"] == "worker")
    count, total = drains_seen(url, TOKEN)
    with Load(url) as load:
        time.sleep(0.5)  # the load's latency before the fault too
        start = time.perf_counter()
        inject_xid(url, TOKEN, cluster_id, node)
        while True:
            now_count, now_total = drains_seen(url, TOKEN)
            if now_count > count:
                client = time.perf_counter() - start
                break
            if time.perf_counter() - start > 120:
                raise SystemExit(f"{node}: no drain counted in 120 s")
            time.sleep(0.01)
        time.sleep(1.0)
    return client, (now_total - total) / (now_count - count), load


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--silent", type=int, default=50)
    ap.add_argument("--partial", type=int, default=50)
    ap.add_argument("--idle", type=int, default=10)
    args = ap.parse_args()
    results: dict[str, dict[str, list[float]]] = {
        m: {"client": [], "server": [], "latency": [], "failures": []} for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        # every client is on loopback: a share that holds the stalled ones and the load
        share = 2 * (args.silent + args.partial + args.idle) + 8
        with mtc_serve(state, TOKEN, extra_args=["--connections-per-client", str(share)]) as url:
            for k in range(2 * args.rounds):
                create_cluster(url, TOKEN, f"c{k}", workers=2)
            clusters = iter(range(2 * args.rounds))
            for r in range(args.rounds):
                for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                    stalls = (stalled_clients(url, silent=args.silent, partial=args.partial,
                                              idle=args.idle) if mode == "stalled"
                              else contextlib.nullcontext())
                    with stalls:
                        client, server, load = one_fault(url, f"c{next(clusters)}")
                    got = results[mode]
                    got["client"].append(client)
                    got["server"].append(server)
                    got["latency"].extend(load.latencies)
                    got["failures"].append(load.failures)
                    print(f"round {r} {mode:8s} fault-to-drain client {client * 1e3:7.1f} ms"
                          f"  server {server * 1e3:6.1f} ms  requests {len(load.latencies)}"
                          f"  p99 {p(load.latencies, 0.99) * 1e3:6.1f} ms", flush=True)
    print(f"\n{'mode':8s} {'faults':>6s} {'drain client p50':>16s} {'max':>8s} "
          f"{'server p50':>10s} {'requests':>8s} {'p50':>7s} {'p99':>7s} {'failed':>6s}")
    for mode in MODES:
        got = results[mode]
        print(f"{mode:8s} {len(got['client']):6d} {statistics.median(got['client']) * 1e3:13.1f} ms"
              f" {max(got['client']) * 1e3:5.0f} ms {statistics.median(got['server']) * 1e3:7.1f} ms"
              f" {len(got['latency']):8d} {p(got['latency'], 0.5) * 1e3:4.1f} ms"
              f" {p(got['latency'], 0.99) * 1e3:4.1f} ms {int(sum(got['failures'])):6d}")
    quiet, stalled = results["quiet"], results["stalled"]
    print("\nstalled/quiet: fault-to-drain (client p50) "
          f"{statistics.median(stalled['client']) / statistics.median(quiet['client']):.2f}x, "
          f"(server p50) {statistics.median(stalled['server']) / statistics.median(quiet['server']):.2f}x, "
          f"request p99 {p(stalled['latency'], 0.99) / p(quiet['latency'], 0.99):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
