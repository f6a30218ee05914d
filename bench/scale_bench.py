"""Scale on the embedded default: time to READY for N workers, state added by a held node.

Runs the real handlers over the real sqlite store, outbox bus and LocalCompute with the
timings ``make demo`` uses (``demo_compute_options``). Not a timed test: the numbers go to
docs/scale.md with the machine they were measured on.

    .venv/bin/python bench/scale_bench.py ready 2000          # seconds to READY
    .venv/bin/python bench/scale_bench.py held --minutes 10   # bytes a held node adds
    .venv/bin/python bench/scale_bench.py ready 500 --profile # cProfile, top 30 by cumtime
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cluster_spec(workers: int, cluster_id: str = "scale") -> dict[str, Any]:
    return {
        "clusterId": cluster_id,
        "loginNode": {"machineType": "n2-standard-8"},
        "nodePools": [{"id": "h100", "nodeCount": workers, "spareCount": 0,
                       "machineSpec": {"machineType": "a3-highgpu-8g",
                                       "acceleratorType": "NVIDIA_H100_80GB",
                                       "acceleratorCount": 8}}],
        "partitions": [{"name": "train", "nodePoolIds": ["h100"]}],
    }


def _app(state_dir: Path, clock: Any = None, **compute: Any) -> Any:
    from services.cli.demo import demo_compute_options, demo_config
    from services.wiring.embedded import embedded

    options = {**demo_compute_options(), **compute}
    return embedded(state_dir, config=demo_config(), clock=clock, compute_options=options)


def _cluster_state(app: Any, cluster_id: str) -> str:
    with app.transaction() as uow:
        cluster = uow.clusters.get(cluster_id)
        return cluster.state.value if cluster else ""


def time_to_ready(workers: int, *, timeout_s: float = 900.0) -> dict[str, Any]:
    """Seconds from the create call to the cluster's READY, on the system clock."""
    from services.job_submission import commands as job_commands

    with tempfile.TemporaryDirectory(prefix="mtc-scale-") as tmp:
        app = _app(Path(tmp))
        t0 = time.monotonic()
        with app.transaction() as uow:
            job_commands.create_cluster(cluster_spec(workers), uow, app.deps)
        # as `mtc cluster create --wait` drives it (EmbeddedApp.run's defaults)
        ok = app.run(lambda: _cluster_state(app, "scale") == "READY", timeout_s=timeout_s)
        elapsed = time.monotonic() - t0
        size = _db_bytes(Path(tmp))
        counts = _doc_counts(app)
        app.close()
    return {"workers": workers, "ready": ok, "seconds": round(elapsed, 2),
            "state_bytes": size, "docs": counts}


class ManualClock:
    def __init__(self, start: float) -> None:
        self.t = start

    def now(self) -> float:
        return self.t


def held_node_growth(minutes: float, *, workers: int = 4) -> dict[str, Any]:
    """A node held by the blast-radius guard, its agent reporting every second, for
    ``minutes`` of manual-clock time through the real handlers and bus: bytes added."""
    from services.job_submission import commands as job_commands
    from shared.domain.health import Condition, ConditionStatus, ConditionType

    clock = ManualClock(time.time())
    with tempfile.TemporaryDirectory(prefix="mtc-held-") as tmp:
        app = _app(Path(tmp), clock=clock, agent_interval_s=1.0, provision_duration_s=0.0)
        # nothing may leave service: every fault is held by the blast-radius guard
        config = app.deps.config
        held = replace(config, repair=replace(config.repair, max_out_of_service_fraction=0.0,
                                              min_out_of_service_allowed=0))
        app.deps = replace(app.deps, config=held)
        with app.transaction() as uow:
            job_commands.create_cluster(cluster_spec(workers), uow, app.deps)
        for _ in range(5):
            app.pump()
            clock.t += 1.0
        assert _cluster_state(app, "scale") == "READY", _cluster_state(app, "scale")
        victim = "scale-h100-000"
        app.compute.inject_fault(victim, [Condition(
            ConditionType.XID_ERROR.value, ConditionStatus.TRUE, "NVRM: Xid 79", clock.t,
            {"xids": [79]})])
        app.pump()
        _checkpoint(app)
        before, docs_before = _db_bytes(Path(tmp)), _doc_counts(app)
        seconds = int(minutes * 60)
        for i in range(seconds):
            clock.t += 1.0
            app.pump()
            if i % 5 == 4:
                app.tick()
                app.pump()
        _checkpoint(app)
        after, docs_after = _db_bytes(Path(tmp)), _doc_counts(app)
        with app.transaction() as uow:
            node = uow.nodes.get(victim)
            state = node.state.value if node else "?"
        app.close()
    return {"minutes": minutes, "node_state": state, "bytes_added": after - before,
            "docs_before": docs_before, "docs_after": docs_after}


def _checkpoint(app: Any) -> None:
    conn = getattr(app.store, "_conn", None)
    if conn is not None:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def _db_bytes(state_dir: Path) -> int:
    """The control plane's state: the sqlite file and its write-ahead log."""
    return sum(p.stat().st_size for p in state_dir.glob("mtc.db*"))


def _doc_counts(app: Any) -> dict[str, int]:
    conn = getattr(app.store, "_conn", None)
    if conn is None:
        return {}
    rows = conn.execute("SELECT collection, count(*) FROM docs GROUP BY collection").fetchall()
    out = {c: n for c, n in rows}
    queued = conn.execute("SELECT json_extract(data, '$.type'), count(*) FROM docs"
                          " WHERE collection = 'outbox' GROUP BY 1").fetchall()
    out.update({f"queued {t.split('.')[2]}": n for t, n in queued})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    ready = sub.add_parser("ready")
    ready.add_argument("workers", type=int, nargs="+")
    ready.add_argument("--profile", action="store_true")
    ready.add_argument("--timeout", type=float, default=900.0)
    held = sub.add_parser("held")
    held.add_argument("--minutes", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.what == "ready":
        for n in args.workers:
            if args.profile:
                prof = cProfile.Profile()
                result = prof.runcall(time_to_ready, n, timeout_s=args.timeout)
                pstats.Stats(prof).sort_stats("cumulative").print_stats(35)
            else:
                result = time_to_ready(n, timeout_s=args.timeout)
            print(json.dumps(result), flush=True)
    else:
        print(json.dumps(held_node_growth(args.minutes)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
