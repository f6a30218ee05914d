#!/usr/bin/env python3
"""End-to-end numbers through the emulator stack (Pub/Sub push, HTTP functions, Firestore).

    .venv/bin/python bench/stack_bench.py [--nodes 32] [--samples 60] [--rates 25,50,100]

1. Health-report-to-drain latency: an XID 79 report is published to ``mtc-node``; it is
   pushed to health_triage (Firestore transaction, publishes ``node.diagnosed``), which is
   pushed to repair (Firestore transaction: the node leaves service, publishes
   ``node.repair_started`` for an idle node or ``node.draining`` for a busy one: the same
   two hops). Latency = from the publish call to that event arriving on a tap
   subscription, so it includes one extra Pub/Sub delivery to the observer. Samples are
   spaced ``--interval`` apart over the cluster's nodes, with every node's agent
   heartbeating in the background.
2. Sustained reports/s: healthy reports published at fixed offered rates for
   ``--seconds`` each; handled = the report's idempotency record exists in Firestore;
   latency = publish to the handler's start (the record's ``at``).

The cluster is created through the Vertex AI REST API (a modelDevelopmentCluster, its
Operation waited on), and its nodes are listed through it; the measurements themselves
publish to and read from Pub/Sub and Firestore directly.

The repair policy is opened up for the run (no blast-radius hold, no escalation, no lemon
detection: MTC_REPAIR_CONFIG) so every sample measures the pipeline, not the policy.
Results go to stdout and, as JSON, to ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from load_stats import pct  # noqa: E402
from stack import Stack, running  # noqa: E402

from shared.adapters.docstore import PROCESSED  # noqa: E402
from shared.adapters.outbox import make_envelope  # noqa: E402
from shared.domain.events import Envelope, NodeHealthReported  # noqa: E402
from shared.domain.health import Condition, ConditionStatus, ConditionType  # noqa: E402

DRAIN_TYPES = ("mtc.node.draining.v1", "mtc.node.repair_started.v1")
OPEN_POLICY = {"max_out_of_service_fraction": 1.0, "blast_window_s": 0,
               "escalation_window_s": 0, "lemon_window_s": 0}


CLUSTER_ID = "bench"
H100 = {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
        "acceleratorCount": 8}  # every worker node's machine, and a job's


def cluster_spec(nodes: int, per_partition: int) -> dict[str, Any]:
    """A modelDevelopmentCluster of pools of ``per_partition`` nodes, one Slurm partition
    each: the blast-radius record of a partition is one Firestore document that every repair
    decision in it writes, so one big partition would measure that document's contention,
    not the pipeline."""
    pools = []
    for i in range(0, nodes, per_partition):
        size = min(per_partition, nodes - i)
        pools.append({"id": f"gpu{i // per_partition}",
                      "machineSpec": H100,
                      "scalingSpec": {"minNodeCount": size, "maxNodeCount": size},
                      "mtcHotSpareCount": 0})
    return {
        "displayName": f"stack bench, {nodes} nodes",
        "nodePools": [{"id": "login", "machineSpec": {"machineType": "n2-standard-8"},
                       "scalingSpec": {"minNodeCount": 1, "maxNodeCount": 1}}, *pools],
        "orchestratorSpec": {"slurmSpec": {
            "partitions": [{"id": f"p{i}", "nodePoolIds": [p["id"]]}
                           for i, p in enumerate(pools)],
            "loginNodePoolId": "login"}},
    }


def healthy(at: float) -> tuple[dict[str, Any], ...]:
    return tuple(Condition(t.value, ConditionStatus.FALSE, "checked", at).to_dict()
                 for t in ConditionType if t is not ConditionType.HEARTBEAT_LOST)


def xid79(at: float) -> tuple[dict[str, Any], ...]:
    return (Condition(ConditionType.XID_ERROR.value, ConditionStatus.TRUE, "Xid 79", at,
                      {"xids": [79]}).to_dict(),)


class Tap:
    """Drain decisions seen on Pub/Sub, by node, with their arrival time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.drains: dict[str, list[float]] = {}
        self.count = 0

    def __call__(self, env: Envelope) -> None:
        arrived = time.time()
        with self.lock:
            self.count += 1
            if env.type in DRAIN_TYPES:
                self.drains.setdefault(env.event.subject, []).append(arrived)

    def first_after(self, node: str, t: float) -> float | None:
        with self.lock:
            return next((a for a in self.drains.get(node, []) if a >= t), None)


def report_xid79(stack: Stack, node: str) -> float:
    """An agent's XID 79 report for ``node``, published (waited on); its publish time."""
    assert stack.publisher is not None
    t = time.time()
    stack.publisher.publish(make_envelope(
        NodeHealthReported(node_id=node, observed_at=t, conditions=xid79(t)), "//bench/agent", t))
    return t


def latency_phase(stack: Stack, tap: Tap, nodes: list[str], samples: int, interval: float,
                  timeout_s: float = 30.0) -> dict[str, Any]:
    sent: list[tuple[str, float]] = []
    for i in range(samples):
        node = nodes[i % len(nodes)]
        t = report_xid79(stack, node)
        sent.append((node, t))
        time.sleep(max(0.0, t + interval - time.time()))
    return {"samples": samples, "interval_s": interval, **drain_figures(tap, sent, timeout_s)}


def drain_figures(tap: Tap, sent: list[tuple[str, float]], timeout_s: float = 30.0
                  ) -> dict[str, Any]:
    """Report-to-drain latency of each (node, publish time) sent, waiting up to
    ``timeout_s`` for the drains still on their way."""
    deadline = time.time() + timeout_s
    latencies: list[float] = []
    missing = 0
    for node, t in sent:
        # looked at once even past the deadline: one drain that never came must not turn
        # every later sample into a miss
        arrived = tap.first_after(node, t)
        while arrived is None and time.time() < deadline:
            time.sleep(0.05)
            arrived = tap.first_after(node, t)
        if arrived is None:
            missing += 1
        else:
            latencies.append(arrived - t)
    return {"measured": len(latencies), "missing": missing,
            "p50_ms": round(pct(latencies, 50) * 1000, 1),
            "p99_ms": round(pct(latencies, 99) * 1000, 1),
            "mean_ms": round(statistics.fmean(latencies) * 1000, 1) if latencies else None,
            "max_ms": round(max(latencies) * 1000, 1) if latencies else None}


def publish_report(stack: Stack, node: str, conditions: tuple[dict[str, Any], ...],
                   source: str) -> tuple[str, float, Any]:
    """One agent's health report published without waiting: its idempotency key at
    health_triage, the publish time and the publish future."""
    assert stack.publisher is not None
    from shared.codec import to_pubsub

    t = time.time()
    env = make_envelope(NodeHealthReported(node_id=node, observed_at=t, conditions=conditions),
                        source, t)
    data, attrs = to_pubsub(env)
    future = stack.publisher.client.publish(stack.publisher.topic_path("mtc-node"), data,
                                            **attrs)
    return f"health_triage:{env.key}", t, future


def wait_handled(stack: Stack, sent: dict[str, float], timeout_s: float = 60.0
                 ) -> dict[str, float]:
    """When health_triage started on each sent report (its idempotency record's ``at``),
    waiting up to ``timeout_s`` for all of them."""
    assert stack.store is not None
    handled: dict[str, float] = {}
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for doc in stack.store.read(PROCESSED, {}):
            if doc["key"] in sent:
                handled[doc["key"]] = doc["at"]
        if len(handled) == len(sent):
            break
        time.sleep(1.0)
    return handled


def handled_figures(sent: dict[str, float], handled: dict[str, float], start: float
                    ) -> dict[str, Any]:
    """Reports handled, their rate from ``start`` to the last one, publish-to-handler
    latency."""
    latencies = [handled[k] - sent[k] for k in handled]
    span = (max(handled.values()) - start) if handled else float("nan")
    return {"handled": len(handled),
            "handled_per_s": round(len(handled) / span, 1) if handled else 0.0,
            "p50_ms": round(pct(latencies, 50) * 1000, 1),
            "p99_ms": round(pct(latencies, 99) * 1000, 1)}


def throughput_phase(stack: Stack, nodes: list[str], rate: float, seconds: float,
                     drain_timeout_s: float = 60.0) -> dict[str, Any]:
    sent: dict[str, float] = {}
    futures = []
    start = time.time()
    n = int(rate * seconds)
    for i in range(n):
        due = start + i / rate
        time.sleep(max(0.0, due - time.time()))
        key, t, future = publish_report(stack, nodes[i % len(nodes)], healthy(time.time()),
                                        "//bench/load")
        futures.append(future)
        sent[key] = t
    for f in futures:
        f.result(timeout=60)
    published_s = time.time() - start
    handled = wait_handled(stack, sent, drain_timeout_s)
    return {"offered_per_s": rate, "published": n, "publish_s": round(published_s, 2),
            **handled_figures(sent, handled, start)}


@dataclass(frozen=True)
class BenchCluster:
    """A started stack with the bench cluster READY: its workers and create Operation."""

    stack: Stack
    nodes: list[str]
    ready_s: float
    operation: dict[str, Any]


@contextlib.contextmanager
def bench_cluster(state_dir: Path, nodes: int, per_partition: int, agent_interval_s: float,
                  tap: Tap) -> Iterator[BenchCluster]:
    """The stack (open repair policy, the tap on every topic) with a cluster of ``nodes``
    workers created through the API and READY; everything is stopped, by PID, on exit."""
    stack = Stack(state_dir.resolve(), agent_interval_s=agent_interval_s, tick_s=60.0,
                  extra_env={"MTC_REPAIR_CONFIG": json.dumps(OPEN_POLICY)},
                  log=lambda m: print(m, file=sys.stderr))
    with running(stack, tap):
        t0 = time.time()
        op = stack.create_cluster(CLUSTER_ID, cluster_spec(nodes, per_partition))
        stack.wait_operation(op, timeout_s=180)  # done: READY (an error raises)
        ready_s = round(time.time() - t0, 1)
        workers = sorted(n["nodeId"] for n in stack.nodes(CLUSTER_ID) if n["role"] == "worker")
        print(f"cluster of {len(workers)} workers READY in {ready_s} s", file=sys.stderr)
        yield BenchCluster(stack, workers, ready_s, op)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--per-partition", type=int, default=4)
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--interval", type=float, default=1.0,
                        help="seconds between latency samples")
    parser.add_argument("--rates", default="25,50,100", help="offered reports/s, comma-separated")
    parser.add_argument("--seconds", type=float, default=10.0, help="per offered rate")
    parser.add_argument("--agent-interval", type=float, default=2.0,
                        help="background heartbeat period of every node")
    parser.add_argument("--state-dir", type=Path, default=ROOT / "var" / "bench-stack")
    parser.add_argument("--out", type=Path, default=ROOT / "var" / "bench" / "stack_bench.json")
    args = parser.parse_args(argv)

    tap = Tap()
    results: dict[str, Any] = {"nodes": args.nodes, "per_partition": args.per_partition,
                               "agent_interval_s": args.agent_interval}
    with bench_cluster(args.state_dir, args.nodes, args.per_partition, args.agent_interval,
                       tap) as bench:
        stack, nodes = bench.stack, bench.nodes
        results["cluster_ready_s"] = bench.ready_s
        results["report_to_drain"] = latency_phase(stack, tap, nodes, args.samples,
                                                   args.interval)
        print(f"report-to-drain: {results['report_to_drain']}", file=sys.stderr)
        time.sleep(8)  # let the repaired nodes return before the load phase
        results["throughput"] = []
        for rate in [float(r) for r in args.rates.split(",") if r]:
            r = throughput_phase(stack, nodes, rate, args.seconds)
            print(f"throughput: {r}", file=sys.stderr)
            results["throughput"].append(r)
        results["events_seen"] = tap.count
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
