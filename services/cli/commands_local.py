"""Commands on the local state directory only: faults, the timeline, the controller loop,
the demo, API tokens. They open the embedded control plane (or its token file) directly, so
they refuse to run against a remote API (``--api``) rather than act on a local directory
the caller did not mean."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

from rich.table import Table

from services.api.security import TOKENS_FILE
from services.api.tokens import LocalTokens
from services.cli.client import ClientError
from services.cli.commands_api import console, show
from services.wiring.embedded import EmbeddedApp
from shared.domain.errors import NotFound, ValidationError
from shared.domain.health import Condition, ConditionStatus, ConditionType
from shared.timeline import clock, describe, is_routine

LOCAL_ONLY = ("works on the local state directory only (--state-dir), not through --api: "
              "run it on the server's machine")


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


def cmd_fault(args: argparse.Namespace, app: EmbeddedApp) -> None:
    """Inject a health report on a node, as its agent would send it."""
    with app.transaction() as uow:
        if uow.nodes.get(args.node_id) is None:
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


def cmd_token(args: argparse.Namespace, state_dir: Path) -> None:
    """API tokens of the server on ``state_dir`` (``mtc serve`` re-reads the file on change)."""
    tokens = LocalTokens(state_dir / TOKENS_FILE)
    match args.action:
        case "create":
            project = getattr(args, "project", None) or "*"
            token = tokens.create(f"token:{args.name}", args.role, project)
            if args.json:
                print(json.dumps({"principal": f"token:{args.name}", "role": args.role,
                                  "project": project, "token": token}, indent=2))
            else:
                print(token)
                print(f"token:{args.name}, {args.role} on {project}: shown this once (only "
                      "its hash is kept)", file=sys.stderr)
        case "list":
            records = tokens.list()

            def table() -> Table:
                t = Table("ID", "PRINCIPAL", "BINDINGS", "CREATED")
                for r in records:
                    t.add_row(r["id"], r["principal"], ", ".join(
                        f"{role} on {project}" for project, role in r["bindings"]),
                        r.get("createdAt", ""))
                return t

            show(records, args.json, table)
        case "revoke":
            if not tokens.revoke(args.token_id):
                raise ClientError("NOT_FOUND", f"no token {args.token_id} in "
                                  f"{state_dir / TOKENS_FILE}")
            print(f"revoked {args.token_id}")
