"""`mtc policy`: a candidate triage table beside the active one.

``show`` (its stages, the diff report by cause on live traffic, the recommendations),
``configure`` (the candidate and its stages), ``accept`` / ``dismiss`` (a recommendation)
and ``clear`` go through the API (``.../triagePolicy``, audited with their reason); ``diff``
reads a recorded history offline and reports the causes the candidate would treat
differently, by the same pure comparison the live shadow runs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rich.table import Table

from services.cli.client import Client, ClientError
from services.cli.commands_api import out, show
from shared import yaml_text
from shared.domain.errors import ValidationError
from shared.domain.health import Condition, HealthReport
from shared.policies import triage_rollout as ro
from shared.policies.shadow import ANY, diff_history
from shared.policies.triage_table import load_triage_table

HEALTH_REPORTED = "mtc.node.health_reported.v1"
COMMANDS = ("show", "configure", "accept", "dismiss", "clear")  # through the API
OFFLINE = ("diff",)


def add_parser(sub: Any, leaf: Callable[..., Any], local_leaf: Callable[..., Any]) -> None:
    p = sub.add_parser("policy", help="a candidate triage table in shadow, recommend-only or "
                       "active, beside the active one")
    psub = p.add_subparsers(dest="action", required=True)
    x = leaf(psub, "show", "the candidate's stages, its diff report by cause on live traffic "
             "and its recommendations")
    x.add_argument("cluster_id")
    x = leaf(psub, "configure", "set the candidate triage table and its stages, and/or a "
             "candidate repair configuration (in shadow); audited")
    x.add_argument("cluster_id")
    x.add_argument("--candidate", type=Path, metavar="TABLE.yaml",
                   help="the candidate triage table (shared/policies/triage_table.py format)")
    x.add_argument("--repair", type=Path, metavar="REPAIR.yaml",
                   help="a candidate repair configuration (RepairConfig fields), in shadow")
    x.add_argument("--stage", action="append", default=[], metavar="STAGE[:CAUSE[:PARTITION]]",
                   help="shadow, recommend or active for a cause (a failure mode) on a "
                        "partition; '*' or absent: any (repeatable; default: all in shadow)")
    x.add_argument("--timeout", type=float, default=ro.DEFAULT_TIMEOUT_S, metavar="S",
                   help="how long a recommendation waits for an operator")
    x.add_argument("--timeout-default", choices=["accept", "dismiss"], default="dismiss",
                   help="what a recommendation nobody decided becomes")
    x.add_argument("--reason", required=True, help="why (goes in the audit record)")
    for verb, what in (("accept", "apply a recommendation through the repair service (the "
                        "blast-radius guard included)"), ("dismiss", "dismiss a recommendation")):
        x = leaf(psub, verb, what + "; audited")
        x.add_argument("cluster_id")
        x.add_argument("recommendation", help="its id, as `mtc policy show` lists it")
        x.add_argument("--reason", required=True, help="why (goes in the audit record)")
    x = leaf(psub, "clear", "remove the candidate, its report and its recommendations; audited")
    x.add_argument("cluster_id")
    x.add_argument("--reason", required=True, help="why (goes in the audit record)")
    p.set_defaults(fn=cmd_policy)
    x = local_leaf(psub, "diff", "a recorded history (state dir, mtc.db, Firestore export or "
                   "events.jsonl) through the active and a candidate triage table: the causes "
                   "the candidate would treat differently; offline")
    x.add_argument("events", type=Path)
    x.add_argument("--candidate", required=True, type=Path, metavar="TABLE.yaml")
    x.add_argument("--baseline", type=Path, default=None, metavar="TABLE.yaml",
                   help="the table to compare with (default: the packaged one)")
    x.set_defaults(fn=cmd_policy_diff)


def _stage(text: str) -> dict[str, str]:
    parts = text.split(":")
    if len(parts) > 3:
        raise ClientError("INVALID_ARGUMENT", f"--stage {text}: STAGE[:CAUSE[:PARTITION]]",
                          [("--stage", text)])
    parts += [ANY] * (3 - len(parts))
    return {"stage": parts[0], "cause": parts[1] or ANY, "partition": parts[2] or ANY}


def _table_doc(path: Path, option: str) -> Any:
    try:
        return yaml_text.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ClientError("INVALID_ARGUMENT", f"cannot read {path}: {exc.strerror}",
                          [(option, str(path))]) from exc


def cmd_policy(args: argparse.Namespace, client: Client) -> None:
    parent, cluster = args.parent, args.cluster_id
    if args.action == "show":
        view = client.triage_policy(parent, cluster)
    elif args.action == "configure":
        body: dict[str, Any] = {
            "stages": [_stage(s) for s in args.stage], "recommendTimeoutS": args.timeout,
            "timeoutDefault": args.timeout_default, "reason": args.reason}
        for key, path in (("candidate", args.candidate), ("repair", args.repair)):
            if path is not None:
                body[key] = _table_doc(path, f"--{key}")
        view = client.triage_command(parent, cluster, "configure", body)
    elif args.action == "clear":
        view = client.triage_command(parent, cluster, "clear", {"reason": args.reason})
    else:
        view = client.triage_command(parent, cluster, args.action, {
            "recommendation": args.recommendation, "reason": args.reason})
    if args.json:
        show(view, True)
        return
    policy = view.get("policy")
    if policy is None:
        print(f"{cluster}: no candidate triage table (the active table decides alone)")
    else:
        stages = ", ".join(f"{s['stage']} {s['cause']} on {s['partition']}"
                           for s in policy.get("stages", ())) or "none"
        print(f"{cluster}: candidate set by {policy.get('by', '?')}; default stage "
              f"{policy.get('defaultStage')}; stages: {stages}; a recommendation waits "
              f"{policy.get('recommendTimeoutS'):g}s, then {policy.get('timeoutDefault')}")
    out().print(diff_table(view.get("diff", {})))
    repair = view.get("repairDiff", {})
    if repair.get("evaluated"):
        out().print(diff_table(repair, "the candidate repair configuration would act "
                               "differently", "diagnoses"))
    recs = view.get("recommendations", [])
    if recs:
        out().print(recommendations_table(recs))


def diff_table(diff: dict[str, Any], what: str = "the candidate triage table would decide "
               "differently", of: str = "reports with a finding") -> Table:
    t = Table(title=f"{what}: {diff.get('differing', 0)} of {diff.get('evaluated', 0)} {of}")
    for col in ("cause", "count", "active", "candidate", "nodes"):
        t.add_column(col)
    for row in diff.get("rows", ()):
        t.add_row(row["cause"], str(row["count"]), _decision(row["active"]),
                  _decision(row["candidate"]), ", ".join(row.get("nodes", ())))
    return t


def _decision(d: dict[str, Any]) -> str:
    return f"{d.get('failureMode') or d.get('step')}: {d['action']}"


def recommendations_table(recs: list[dict[str, Any]]) -> Table:
    t = Table(title="recommendations")
    for col in ("id", "verdict", "node", "cause", "candidate", "by", "reason"):
        t.add_column(col)
    for r in recs:
        t.add_row(r["id"], r["verdict"], r["nodeId"], r["cause"], r["candidate"]["action"],
                  r.get("by", ""), r.get("reason", ""))
    return t


def reports_of(rows: list[dict[str, Any]]) -> Iterator[HealthReport]:
    """The health reports of an event history (``simulator.history`` rows), oldest first."""
    for row in rows:
        if row.get("type") != HEALTH_REPORTED:
            continue
        d = row["data"]
        yield HealthReport(str(d["node_id"]), float(d["observed_at"]),
                           Condition.parse_all(d.get("conditions", ())),
                           str(d.get("source", "agent")))


def cmd_policy_diff(args: argparse.Namespace, _client: Client | None) -> None:
    from simulator import history

    try:
        rows = history.load_events(args.events)
        candidate = load_triage_table(args.candidate)
        baseline = load_triage_table(args.baseline)
    except (history.HistoryError, ValidationError, OSError) as exc:
        raise ClientError("INVALID_ARGUMENT", str(exc)) from exc
    report = diff_history(reports_of(rows), baseline, candidate)
    doc = ro.report_doc(report)
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    out().print(diff_table(doc))
    causes = ", ".join(report.causes) or "none"
    print(f"causes the candidate would treat differently: {causes}")
