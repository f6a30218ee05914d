"""Health-report throughput through triage and repair, and fault-to-drain latency, on the
embedded adapters (sqlite store, outbox bus) and on the in-memory store.

    .venv/bin/python bench/handler_bench.py [--reports 4000] [--nodes 512]

Throughput: a cluster of N nodes (one partition) receives a stream of agent reports, 10% of
them faults (XID 79 / ECC DBE / slow); each report goes through health_triage and, for faults,
repair (diagnosis, blast-radius guard, drain, repair start), with idempotency records and the
outbox in the same transaction. Latency: wall time from injecting one XID 79 report on an
allocated node to the node being DRAINING with its job signalled.
"""

from __future__ import annotations

import sys
from pathlib import Path as _Path

sys.path.insert(0, str(_Path(__file__).resolve().parents[1]))

import argparse
import json
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from services.job_submission import commands as job_commands
from services.wiring.builder import build_deps
from services.wiring.routes import control_plane_routes
from shared.adapters.clock import SystemClock
from shared.adapters.memory_store import MemoryDocStore
from shared.adapters.outbox import make_envelope
from shared.adapters.outbox_bus import OutboxBus
from shared.adapters.sqlite_store import SqliteDocStore
from shared.config import ControlPlaneConfig
from shared.domain.events import NodeHealthReported, NodeProvisioned
from shared.domain.model import NodeState
from shared.policies.repair import RepairConfig
from shared.ports import DocStore
from tests.harness import FakeCompute, healthy, job_body, xid


def cluster_spec(nodes: int) -> dict[str, Any]:
    return {"clusterId": "bench", "nodePools": [{
        "id": "gpu", "nodeCount": nodes, "spareCount": 0,
        "machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
                        "acceleratorCount": 8}}]}


class Bench:
    def __init__(self, store: DocStore, nodes: int, config: ControlPlaneConfig | None = None
                 ) -> None:
        self.store = store
        self.bus = OutboxBus(store, control_plane_routes())
        self.compute = FakeCompute()
        self.clock = SystemClock()
        self.deps = build_deps(store, clock=self.clock, compute=self.compute,
                               publisher=self.bus, with_event_log=False, config=config)
        with self.deps.uow() as uow:
            job_commands.create_cluster(cluster_spec(nodes), uow, self.deps)
            uow.commit()
        self.bus.pump(self.deps)
        for node_id in self.compute.provisioned:
            self.inject(NodeProvisioned(node_id=node_id))
        self.bus.pump(self.deps)
        for _ in range(2):
            for node_id in self.compute.provisioned:
                self.inject(NodeHealthReported(node_id=node_id, observed_at=self.clock.now(),
                                               conditions=healthy(self.clock.now())))
            self.bus.pump(self.deps)
        self.workers = [n for n in self.compute.provisioned if "login" not in n]

    def inject(self, event: Any) -> None:
        self.bus.inject(make_envelope(event, "//bench", self.clock.now()))

    def throughput(self, reports: int) -> float:
        faults = [xid(79, 0), xid(48, 0), xid(13, 0)]
        envs = []
        for i in range(reports):
            node = self.workers[i % len(self.workers)]
            now = self.clock.now()
            cond = faults[i % 3] if i % 10 == 0 else healthy(now)
            envs.append(NodeHealthReported(node_id=node, observed_at=now + i * 1e-6,
                                           conditions=cond))
        for event in envs:
            self.inject(event)
        t0 = time.perf_counter()
        delivered = self.bus.pump(self.deps)
        elapsed = time.perf_counter() - t0
        assert delivered >= reports
        return reports / elapsed

    def latency(self, samples: int) -> list[float]:
        out = []
        for i in range(samples):
            job_id = f"lat{i}"
            with self.deps.uow() as uow:
                job_commands.submit_job("bench", job_body(1), uow, self.deps, job_id)
                uow.commit()
            self.bus.pump(self.deps)
            with self.deps.uow() as uow:
                node = uow.jobs.get(job_id).node_ids[0]  # type: ignore[union-attr]
            t0 = time.perf_counter()
            self.inject(NodeHealthReported(node_id=node, observed_at=self.clock.now(),
                                           conditions=xid(79, self.clock.now())))
            self.bus.pump(self.deps)
            elapsed = time.perf_counter() - t0
            with self.deps.uow() as uow:
                n = uow.nodes.get(node)
                assert n is not None and n.state is NodeState.DRAINING, n
            assert self.compute.signalled[-1][0] == job_id
            out.append(elapsed * 1000)
        return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reports", type=int, default=4000)
    p.add_argument("--nodes", type=int, default=512)
    p.add_argument("--samples", type=int, default=30)
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, store in (("sqlite", SqliteDocStore(Path(tmp) / "bench.db")),
                            ("memory", MemoryDocStore())):
            # blast radius off for throughput: every fault is acted on, the worst case
            bench = Bench(store, args.nodes)
            rate = bench.throughput(args.reports)
            # latency: a guard wide enough that every sample drains (none is held)
            wide = replace(ControlPlaneConfig(), repair=RepairConfig(max_out_of_service_fraction=0.5))
            lat_store: DocStore = (SqliteDocStore(Path(tmp) / "lat.db") if name == "sqlite"
                                   else MemoryDocStore())
            lat_bench = Bench(lat_store, 4 * args.samples, wide)
            lat = lat_bench.latency(args.samples)
            results[name] = {
                "reports_per_s": round(rate),
                "fault_to_drain_ms_p50": round(statistics.median(lat), 2),
                "fault_to_drain_ms_p99": round(sorted(lat)[int(0.99 * (len(lat) - 1))], 2),
            }
    print(json.dumps({"nodes": args.nodes, "reports": args.reports, **results}, indent=2))


if __name__ == "__main__":
    main()
