"""One readable line per event, for `mtc events`, the demo and `make stack`."""

from __future__ import annotations

import datetime as dt
from typing import Any

from services.presentation.views import shown_job_id

QUIET_SOURCES = frozenset({"agent"})  # routine heartbeats: shown only when they find a problem
NO_CHECKPOINT = "no checkpoint recognised (see docs/pytorch.md)"


# where a save went, as a timeline line says it (mtc_program.protocol's tier names)
TIER_WORDS = {"durable": "durable storage", "memory": "node memory",
              "peer": "its buddy node's memory"}


def without_checkpoint(attempt: int) -> str:
    """What an attempt that starts from no checkpoint mtc knows of starts from: the first
    from scratch; a later one may be resuming from files its program names in a way mtc
    cannot read a step from, so mtc does not claim it starts over."""
    return "from scratch" if attempt <= 1 else NO_CHECKPOINT


def _problems(conditions: list[dict[str, Any]]) -> list[str]:
    out = []
    for c in conditions:
        if c.get("status") != "true":
            continue
        details = c.get("details") or {}
        if c.get("type") == "XidError" and details.get("xids"):
            out.append("XID " + ",".join(str(x) for x in details["xids"]))
        else:
            out.append(f"{c.get('type')} ({c.get('reason', '')})")
    return out


def is_routine(doc: dict[str, Any]) -> bool:
    """A healthy heartbeat from an agent: true of almost every event on a healthy fleet."""
    if doc["type"] != "mtc.node.health_reported.v1":
        return bool(doc["type"] == "mtc.fleet.ticked.v1")
    data = doc["data"]
    quiet = data.get("source") in QUIET_SOURCES
    return bool(quiet and not _problems(data.get("conditions", [])))


def describe(doc: dict[str, Any]) -> str:
    """doc: an envelope document (type, time, data); jobs by the ids users type."""
    d = doc["data"]
    if isinstance(d.get("job_id"), str):
        d = {**d, "job_id": shown_job_id(d["job_id"])}
    t = doc["type"].split(".")
    entity, verb = t[1], t[2]
    match doc["type"]:
        case "mtc.node.health_reported.v1":
            problems = _problems(d.get("conditions", []))
            status = "; ".join(problems) if problems else "all checks pass"
            return f"node {d['node_id']}: health report [{d.get('source')}]: {status}"
        case "mtc.node.diagnosed.v1":
            return (f"node {d['node_id']}: diagnosed {d['failure_mode']} "
                    f"({d['severity']}) -> {d['action']}")
        case "mtc.node.draining.v1":
            return f"node {d['node_id']}: draining, job {d['job_id']} must checkpoint and leave"
        case "mtc.node.drained.v1":
            return f"node {d['node_id']}: drained"
        case "mtc.node.repair_started.v1":
            return f"node {d['node_id']}: repair started: {d['action']} (attempt {d['attempt']})"
        case "mtc.node.repair_completed.v1":
            ok = "done" if d["ok"] else f"FAILED {d.get('detail', '')}"
            return f"node {d['node_id']}: {d['action']} {ok}"
        case "mtc.node.repair_held.v1":
            return f"node {d['node_id']}: ALERT repair held ({d['action']}): {d['reason']}"
        case "mtc.domain.drained.v1":
            what = "ALERT rack drain HELD" if d.get("held") else "ALERT rack drained as one"
            return (f"rack {d['domain']} ({d['partition']}): {what}, nodes "
                    f"{', '.join(d['node_ids'])}: {d['reason']}")
        case "mtc.node.operator_acted.v1":
            return f"node {d['node_id']}: OPERATOR {d['by']} {d['action']}: {d['reason']}"
        case "mtc.node.returned_to_service.v1":
            return f"node {d['node_id']}: passed its checks, back in service"
        case "mtc.node.retired.v1":
            extra = f", replaced by {d['replacement_id']}" if d.get("replacement_id") else ""
            return f"node {d['node_id']}: retired ({d.get('reason', '')}){extra}"
        case "mtc.node.provisioned.v1":
            return f"node {d['node_id']}: provisioned" + ("" if d.get("ok", True) else " FAILED")
        case "mtc.job.started.v1":
            resume = (f"resuming from checkpoint step {d['resume_step']}"
                      if d.get("resume_step", -1) >= 0 else without_checkpoint(d["attempt"]))
            return (f"job {d['job_id']}: attempt {d['attempt']} started on "
                    f"{', '.join(d['node_ids'])}, {resume}")
        case "mtc.job.preflight_checked.v1":
            spent = d["finished_at"] - d["started_at"]
            failed = d.get("failed_node_ids") or []
            verdict = (f"EXCLUDED {', '.join(failed)}, placing again" if failed
                       else d.get("detail") or "passed")
            return (f"job {d['job_id']}: preflight ({d['mode']}) of {len(d['node_ids'])} "
                    f"node(s) in {spent:.1f} s: {verdict}")
        case "mtc.job.adopted.v1":
            return (f"job {d['job_id']}: Slurm job {d['slurm_job_id']} ({d.get('name', '')}, user "
                    f"{d.get('user', '')}) run {d['attempt']} adopted on {', '.join(d['node_ids'])}")
        case "mtc.job.interrupt_requested.v1":
            return f"job {d['job_id']}: SIGTERM requested ({d['reason']})"
        case "mtc.job.signalled.v1":
            return (f"job {d['job_id']}: SIGTERM to attempt {d['attempt']}: checkpoint and exit "
                    f"within {d['grace_s']:g} s")
        case "mtc.job.checkpoint_saved.v1":
            return (f"job {d['job_id']}: checkpoint step {d['step']} saved to "
                    f"{TIER_WORDS.get(d.get('tier', 'durable'), d.get('tier'))} "
                    f"(attempt {d['attempt']})")
        case "mtc.job.workers_exited.v1":
            full = f": disk full at {d['storage_full']}" if d.get("storage_full") else ""
            if d.get("launch_failed"):
                full += f": the platform could not start it ({d['launch_failed']})"
            return (f"job {d['job_id']}: attempt {d['attempt']} workers exited, code "
                    f"{d['exit_code']}{full}")
        case "mtc.job.restored.v1":
            return f"job {d['job_id']}: attempt {d['attempt']} {restored(d)}"
        case "mtc.job.recovery_chosen.v1":
            return (f"job {d['job_id']}: recovery {d['mode']} for attempt {d['attempt']} "
                    f"({d['incident']}), expected {d['expected_lost_s']:.0f} s lost: "
                    f"{d['reason']}")
        case "mtc.job.requeued.v1":
            return f"job {d['job_id']}: requeued (restart {d['restart_count']}): {d['reason']}"
        case "mtc.job.finished.v1":
            return f"job {d['job_id']}: {d['state']} after {d['restart_count']} restart(s)"
        case "mtc.job.submitted.v1":
            return f"job {d['job_id']}: submitted to cluster {d['cluster_id']}"
        case "mtc.job.cancel_requested.v1":
            return f"job {d['job_id']}: cancel requested"
        case _:
            subject = doc.get("subject") or ""
            return f"{entity} {subject}: {verb.replace('_', ' ')}"


def restored(d: dict[str, Any]) -> str:
    """What an attempt's ranks restored: the step, the tiers read, the tiers skipped and the
    entries that failed their check (which tier, why)."""
    what = (f"restored step {d['step']} from {' + '.join(d.get('tiers') or ['?'])}"
            if d.get("step", -1) >= 0 else "restored nothing (from scratch)")
    if d.get("skipped"):
        what += f", {' and '.join(d['skipped'])} skipped"
    if d.get("failed"):
        what += f"; FELL BACK: {'; '.join(d['failed'])}"
    return what


def clock(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3]


def style(type_: str) -> str:
    """The terminal colour of an event type in a timeline: faults red, repairs yellow,
    recoveries green, the rest cyan (rich markup)."""
    if "diagnosed" in type_ or "health_reported" in type_ or "held" in type_:
        return "bold red"
    if "repair" in type_ or "drain" in type_:
        return "yellow"
    if "returned" in type_ or "finished" in type_ or "recovery_chosen" in type_:
        return "bold green"
    if "restored" in type_:
        return "green"
    return "cyan"
