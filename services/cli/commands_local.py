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
from services.presentation.timeline import clock, describe, is_routine
from services.wiring.embedded import EmbeddedApp
from shared import logs
from shared.domain.errors import ValidationError
from shared.domain.faults import FaultRequest, check_fault_target, validate_fault
from shared.domain.faults import fault_conditions as conditions_of
from shared.domain.health import Condition

LOCAL_ONLY = ("works on the local state directory only (--state-dir), not through --api: "
              "run it on the server's machine")


# FaultRequest field -> the `mtc node fault` option that sets it (errors name the option)
FAULT_OPTIONS = {"xids": "--xid", "ecc_dbe": "--ecc-dbe", "dcgm_level": "--dcgm-fail",
                 "thermal_c": "--thermal", "disk_used_fraction": "--disk",
                 "slow_ratio": "--slow"}


def fault_request(args: argparse.Namespace) -> FaultRequest:
    """`mtc node fault` flags as a FaultRequest, checked by the rules every entry point
    shares (shared.domain.faults): a ValidationError names the bad option."""
    fault = FaultRequest(xids=tuple(args.xid or ()), ecc_dbe=args.ecc_dbe,
                         row_remap_failure=bool(args.row_remap_failure),
                         dcgm_level=args.dcgm_fail, thermal_c=args.thermal,
                         disk_used_fraction=args.disk, slow_ratio=args.slow)
    if fault.empty:
        raise ValidationError("fault", "name at least one fault (--xid, --ecc-dbe, ...)")
    return validate_fault(fault, FAULT_OPTIONS)


def fault_conditions(args: argparse.Namespace, now: float) -> list[Condition]:
    """Turn `mtc node fault` flags into the conditions a node agent would report."""
    return conditions_of(fault_request(args), now)


def cmd_fault(args: argparse.Namespace, app: EmbeddedApp) -> None:
    """Inject a health report on a node, as its agent would send it: only faults a node could
    report, only on a worker node that is still there."""
    conditions = fault_conditions(args, app.deps.clock.now())
    with app.transaction() as uow:
        check_fault_target(uow.nodes.get(args.node_id), args.node_id, "NODE_ID")
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
    logs.setup()  # mtc.* loggers: JSON lines off a terminal
    console.print(f"controller on {app.state_dir}; Ctrl-C to stop")
    with contextlib.suppress(KeyboardInterrupt):
        app.run(lambda: False, timeout_s=args.duration or float("inf"))


def cmd_demo(args: argparse.Namespace, app: EmbeddedApp) -> None:
    if getattr(args, "torch", False):
        from services.cli.demo_torch import run_torch_demo

        outcome = run_torch_demo(app)
        if not (outcome.state.value == "JOB_STATE_SUCCEEDED" and outcome.continuous
                and outcome.equal):
            raise SystemExit("demo-torch: the job did not heal as it should (see above)")
        return
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
