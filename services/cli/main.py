"""`mtc`: clusters, jobs, nodes, faults and the event timeline on the embedded default.

Every command opens the same state directory (sqlite + the local compute's records), does
its work in one transaction, then pumps the bus so the system moves on. A command killed
half-way leaves its events in the outbox; the next command delivers them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from services.job_submission import handlers as api
from services.wiring.embedded import EmbeddedApp, embedded
from shared.domain.errors import MtcError, ValidationError
from shared.domain.health import Condition, ConditionStatus, ConditionType
from shared.timeline import clock, describe, is_routine
from shared.views import cluster_view, job_view, node_view

console = Console()


def _load(path: str) -> Any:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise ValidationError("-f", f"cannot read {path}: {exc.strerror}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValidationError("-f", f"{path} is not JSON: {exc.msg} at line {exc.lineno}"
                              ) from exc


def _print(obj: Any, as_json: bool, table: Callable[[], Table] | None = None) -> None:
    if as_json or table is None:
        print(json.dumps(obj, indent=2))
    else:
        console.print(table())


# ---------------------------------------------------------------- commands


def cmd_cluster(args: argparse.Namespace, app: EmbeddedApp) -> None:
    deps = app.deps
    with app.transaction() as uow:
        match args.action:
            case "create":
                out: Any = cluster_view(api.create_cluster(_load(args.file), uow, deps))
            case "get":
                out = cluster_view(api.get_cluster(args.cluster_id, uow))
            case "list":
                out = [cluster_view(c) for c in api.list_clusters(uow)]
            case "update":
                out = cluster_view(api.update_cluster(args.cluster_id, _load(args.file), uow,
                                                      deps))
            case "delete":
                out = cluster_view(api.delete_cluster(args.cluster_id, uow, deps))
    app.pump()
    if args.action in ("create", "update") and args.wait:
        cid = out["clusterId"]
        app.run(lambda: _cluster_state(app, cid) in ("READY", "FAILED"), timeout_s=args.wait)
        with app.transaction() as uow:
            out = cluster_view(api.get_cluster(cid, uow))

    def table() -> Table:
        rows = out if isinstance(out, list) else [out]
        t = Table("CLUSTER", "STATE", "GEN", "POOLS", "PARTITIONS", "MESSAGE")
        for c in rows:
            pools = ", ".join(f"{p['id']}:{p['nodeCount']}(+{p['spareCount']} spare)"
                              if p["spareCount"] else f"{p['id']}:{p['nodeCount']}"
                              for p in c["spec"]["nodePools"])
            parts = ", ".join(p["name"] for p in c["spec"]["partitions"])
            t.add_row(c["clusterId"], c["state"], str(c["generation"]), pools, parts,
                      c["message"])
        return t

    _print(out, args.json, table)


def _cluster_state(app: EmbeddedApp, cluster_id: str) -> str:
    with app.transaction() as uow:
        cluster = uow.clusters.get(cluster_id)
        return cluster.state.value if cluster else "MISSING"


def cmd_job(args: argparse.Namespace, app: EmbeddedApp) -> None:
    deps = app.deps
    with app.transaction() as uow:
        match args.action:
            case "submit":
                out: Any = job_view(api.submit_job(args.cluster, _load(args.file), uow, deps,
                                                   args.job_id))
            case "get":
                out = job_view(api.get_job(args.job_id, uow))
            case "list":
                out = [job_view(j) for j in api.list_jobs(uow, args.cluster)]
            case "cancel":
                out = job_view(api.cancel_job(args.job_id, uow, deps))
    _crash_point()
    app.pump()

    def table() -> Table:
        rows = out if isinstance(out, list) else [out]
        t = Table("JOB", "CLUSTER", "STATE", "ATTEMPT", "RESTARTS", "NODES", "CHECKPOINT")
        for j in rows:
            ckpt = j["latestCheckpoint"]
            t.add_row(j["jobId"], j["clusterId"], j["state"].removeprefix("JOB_STATE_"),
                      str(j["attempt"]), str(j["restartCount"]), ",".join(j["nodes"]),
                      str(ckpt["step"]) if ckpt else "-")
        return t

    _print(out, args.json, table)


def _crash_point() -> None:
    """Fault injection for tests: pause between commit and delivery, so a test can kill us."""
    pause = os.environ.get("MTC_TEST_PAUSE_BEFORE_PUMP")
    if pause:
        time.sleep(float(pause))


def cmd_node(args: argparse.Namespace, app: EmbeddedApp) -> None:
    if args.action == "fault":
        _inject_fault(args, app)
        return
    app.pump()
    with app.transaction() as uow:
        clusters = [args.cluster] if args.cluster else [c.cluster_id
                                                        for c in api.list_clusters(uow)]
        nodes = [n for cid in clusters for n in uow.nodes.list(cid)]
    views = [node_view(n) for n in sorted(nodes, key=lambda n: (n.partition, n.node_id))]
    if not args.all:
        views = [v for v in views if v["state"] != "retired"]

    def table() -> Table:
        t = Table("PARTITION", "NODE", "STATE", "SPARE", "JOB", "REASON", "SINCE")
        for v in views:
            t.add_row(v["partition"], v["nodeId"], v["state"], "yes" if v["spare"] else "",
                      v["job"] or "", v["reason"], (v["since"] or "")[11:19])
        return t

    _print(views, args.json, table)


def fault_conditions(args: argparse.Namespace, now: float) -> list[Condition]:
    """Turn `mtc node fault` flags into the conditions a node agent would report."""
    T, TRUE = ConditionType, ConditionStatus.TRUE
    out = []
    if args.xid:
        out.append(Condition(T.XID_ERROR.value, TRUE, f"NVRM: Xid {args.xid}", now,
                             {"xids": list(args.xid)}))
    if args.ecc_dbe:
        out.append(Condition(T.ECC_UNCORRECTABLE.value, TRUE, f"{args.ecc_dbe} volatile DBE",
                             now, {"volatile_dbe": args.ecc_dbe, "aggregate_dbe": args.ecc_dbe}))
    if args.row_remap_failure:
        out.append(Condition(T.ROW_REMAP_FAILURE.value, TRUE, "row remapping failed", now,
                             {"failure": True, "pending": False}))
    if args.dcgm_fail:
        out.append(Condition(T.DCGM_DIAG_FAILED.value, TRUE, f"dcgmi diag -r {args.dcgm_fail}",
                             now, {"level": args.dcgm_fail, "failed_tests": ["memory"]}))
    if args.thermal is not None:
        out.append(Condition(T.THERMAL_THROTTLING.value, TRUE, f"{args.thermal} C", now,
                             {"temperature_c": args.thermal, "reasons": ["hw_thermal_slowdown"]}))
    if args.disk is not None:
        out.append(Condition(T.DISK_PRESSURE.value, TRUE, f"{args.disk:.0%} used", now,
                             {"mount": "/", "used_fraction": args.disk}))
    if args.slow is not None:
        out.append(Condition(T.SLOW_SPEED_CHECK.value, TRUE, f"{args.slow:.2f}x baseline", now,
                             {"ratio_to_baseline": args.slow}))
    if not out:
        raise ValidationError("fault", "name at least one fault (--xid, --ecc-dbe, ...)")
    return out


def _inject_fault(args: argparse.Namespace, app: EmbeddedApp) -> None:
    with app.transaction() as uow:
        if uow.nodes.get(args.node_id) is None:
            from shared.domain.errors import NotFound

            raise NotFound("node", args.node_id)
    conditions = fault_conditions(args, app.deps.clock.now())
    app.compute.inject_fault(args.node_id, conditions)
    app.pump()
    print(f"injected {', '.join(c.reason for c in conditions)} on {args.node_id}")


def cmd_events(args: argparse.Namespace, app: EmbeddedApp) -> None:
    """Print the timeline; ``--follow`` reads on from a time cursor (the store's time index),
    not the whole log again each round."""
    from shared.adapters.docstore import DocEventLog, EventCursor

    app.pump()
    log = app.deps.event_log
    if not isinstance(log, DocEventLog):
        return
    cursor = EventCursor(log, since=args.since)
    deadline = time.monotonic() + (args.follow or 0)
    while True:
        for doc in cursor.next():
            if is_routine(doc) and not args.all:
                continue
            if args.json:
                print(json.dumps(doc))
            else:
                print(f"{clock(doc['time'])}  {describe(doc)}")
        if time.monotonic() >= deadline:
            return
        app.pump()
        time.sleep(0.2)


def cmd_controller(args: argparse.Namespace, app: EmbeddedApp) -> None:
    """Keep the embedded control plane moving: pump, poll the machines, tick."""
    console.print(f"controller on {app.state_dir}; Ctrl-C to stop")
    with contextlib.suppress(KeyboardInterrupt):
        app.run(lambda: False, timeout_s=args.duration or float("inf"))


def cmd_demo(args: argparse.Namespace, app: EmbeddedApp) -> None:
    from services.cli.demo import run_demo

    run_demo(app, steps=args.steps)


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mtc", description=__doc__.splitlines()[0])
    p.add_argument("--state-dir", default=os.environ.get("MTC_STATE_DIR", "var/mtc"),
                   help="where the embedded control plane keeps its state (default var/mtc)")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("cluster", help="create, get, list, update, delete clusters")
    csub = c.add_subparsers(dest="action", required=True)
    for name in ("create", "update"):
        x = csub.add_parser(name)
        if name == "update":
            x.add_argument("cluster_id")
        x.add_argument("-f", "--file", required=True, help="cluster spec JSON ('-' for stdin)")
        x.add_argument("--wait", type=float, default=0.0, metavar="S",
                       help="wait up to S seconds for READY")
    for name in ("get", "delete"):
        csub.add_parser(name).add_argument("cluster_id")
    csub.add_parser("list")
    c.set_defaults(fn=cmd_cluster)

    j = sub.add_parser("job", help="submit, get, list, cancel custom jobs")
    jsub = j.add_subparsers(dest="action", required=True)
    s = jsub.add_parser("submit")
    s.add_argument("--cluster", required=True)
    s.add_argument("-f", "--file", required=True, help="CustomJob JSON ('-' for stdin)")
    s.add_argument("--job-id", help="a client-chosen id makes retries idempotent")
    for name in ("get", "cancel"):
        jsub.add_parser(name).add_argument("job_id")
    jsub.add_parser("list").add_argument("--cluster")
    j.set_defaults(fn=cmd_job)

    n = sub.add_parser("node", help="list nodes (sinfo-like), inject faults")
    nsub = n.add_subparsers(dest="action", required=True)
    nl = nsub.add_parser("list")
    nl.add_argument("--cluster")
    nl.add_argument("--all", action="store_true", help="include retired nodes")
    f = nsub.add_parser("fault", help="inject a health fault, as a node agent would report it")
    f.add_argument("node_id")
    f.add_argument("--xid", type=int, action="append", help="an NVIDIA XID code (repeatable)")
    f.add_argument("--ecc-dbe", type=int, help="volatile double-bit ECC errors")
    f.add_argument("--row-remap-failure", action="store_true")
    f.add_argument("--dcgm-fail", type=int, choices=[1, 2, 3, 4], help="failed DCGM level")
    f.add_argument("--thermal", type=float, metavar="CELSIUS")
    f.add_argument("--disk", type=float, metavar="USED_FRACTION")
    f.add_argument("--slow", type=float, metavar="RATIO_TO_BASELINE")
    n.set_defaults(fn=cmd_node)

    e = sub.add_parser("events", help="the timeline")
    e.add_argument("--since", type=float, default=0.0)
    e.add_argument("--follow", type=float, metavar="S", help="keep printing for S seconds")
    e.add_argument("--all", action="store_true", help="include routine heartbeats")
    e.set_defaults(fn=cmd_events)

    ctl = sub.add_parser("controller", help="run the embedded control plane loop")
    ctl.add_argument("--for", dest="duration", type=float, metavar="S")
    ctl.set_defaults(fn=cmd_controller)

    sv = sub.add_parser("serve", help="run the Vertex AI API and the control plane together")
    sv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8080)
    sv.add_argument("--for", dest="duration", type=float, metavar="S", help="stop after S s")

    d = sub.add_parser("demo", help="the self-healing story, start to end, in one run")
    d.add_argument("--steps", type=int, default=120)
    d.set_defaults(fn=cmd_demo)

    try:
        from simulator.cli import add_parser as add_sim
    except ImportError:
        pass
    else:
        add_sim(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "sim":
        return int(args.fn(args) or 0)
    state_dir = Path(args.state_dir)
    if args.command == "serve":
        from services.cli.serve import serve

        return serve(state_dir, host=args.host, port=args.port, duration_s=args.duration)
    if args.command == "demo" and not os.environ.get("MTC_STATE_DIR") \
            and args.state_dir == "var/mtc":
        state_dir = Path("var/demo")
    if args.command == "demo":
        from services.cli.demo import fresh_state

        fresh_state(state_dir)
    app = embedded(state_dir, **({} if args.command != "demo" else _demo_options()))
    try:
        args.fn(args, app)
    except MtcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        app.close()
    return 0


def _demo_options() -> dict[str, Any]:
    from services.cli.demo import demo_compute_options, demo_config

    return {"config": demo_config(), "compute_options": demo_compute_options()}


if __name__ == "__main__":
    raise SystemExit(main())
