"""What the console shows, built from the store's entities and the event log: pure functions.

Sized for a 16,384-node cluster: a partition is its counts per state; only the nodes that
matter (out of service, held, lemons) are listed, at most ``NOTABLE`` per partition; the
rest come on drill-down, one page at a time. Every list here is bounded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from services.observability.alerts import held
from services.presentation.timeline import describe, is_routine
from services.presentation.views import iso, shown_job_id
from shared.domain import lifecycle
from shared.domain.model import IN_SERVICE, Job, Node, NodeRole, NodeState
from shared.goodput import JobAccounting
from shared.policies.repair import RepairConfig

NOTABLE = 100  # individual nodes listed per partition without drill-down
MAX_PAGE = 500
SMALL = 64  # a partition this small lists every node
S = NodeState
# sinfo's word for each state (a node under repair is down to Slurm, one being checked boots;
# "susp": sick but kept in service by the blast-radius guard, mtc's own)
SINFO: Mapping[NodeState, str] = {
    S.PROVISIONING: "boot", S.IDLE: "idle", S.ALLOCATED: "alloc", S.SUSPECT: "susp",
    S.DRAINING: "drng", S.DRAINED: "drain", S.REPAIRING: "down", S.VERIFYING: "boot",
    S.FAILED: "fail", S.RETIRED: "down~"}
WORDS = ("idle", "alloc", "susp", "drng", "drain", "down", "boot", "fail")


def is_lemon(node: Node, now: float, config: RepairConfig) -> bool:
    """Its next node-level failure would have it replaced (or this one did)."""
    recent = [r for r in node.history
              if r.action.takes_node_out and r.at >= now - config.lemon_window_s]
    return "lemon" in node.reason or len(recent) + 1 >= config.lemon_failure_count


def node_row(node: Node, now: float, config: RepairConfig) -> dict[str, Any]:
    active = [{"type": t, "reason": c.reason, "since": iso(c.since)}
              for t, c in sorted(node.conditions.items()) if c.status == "true"]
    return {
        "id": node.node_id, "partition": node.partition or "-", "pool": node.pool,
        "state": node.state.value, "sinfo": SINFO[node.state], "reason": node.reason,
        "since": iso(node.since), "spare": node.is_spare,
        "job": node.job_id and shown_job_id(node.job_id),
        "rung": (f"{node.repair_action.value} (attempt {node.repair_attempt})"
                 if node.repair_action else None),
        "conditions": active[:8], "hold": node.alert or None,
        "lemon": is_lemon(node, now, config), "failures": len(node.history),
        "inService": node.state in IN_SERVICE,
        "operatorDrained": lifecycle.operator_drained(node), "held": held(node),
    }


def _matters(node: Node, now: float, config: RepairConfig) -> bool:
    return (node.state not in IN_SERVICE or bool(node.alert) or node.state is S.SUSPECT
            or is_lemon(node, now, config))


def workers(nodes: Iterable[Node]) -> list[Node]:
    """The nodes a grid shows: workers still there (retired ones and the login node aside)."""
    return sorted((n for n in nodes if n.role is NodeRole.WORKER and n.state is not S.RETIRED),
                  key=lambda n: n.node_id)


def grid(nodes: Iterable[Node], now: float, config: RepairConfig,
         notable: int = NOTABLE, small: int = SMALL) -> list[dict[str, Any]]:
    """Per partition: counts per sinfo word, spares, and the nodes that matter (bounded);
    a partition of at most ``small`` nodes lists them all (``all``)."""
    mine = workers(nodes)
    sizes: dict[str, int] = {}
    for n in mine:
        sizes[n.partition or "-"] = sizes.get(n.partition or "-", 0) + 1
    parts: dict[str, dict[str, Any]] = {}
    for n in mine:
        name = n.partition or "-"
        p = parts.setdefault(name, {
            "name": name, "total": 0, "counts": dict.fromkeys(WORDS, 0), "spares": 0,
            "inService": 0, "notable": [], "notableTotal": 0, "all": sizes[name] <= small})
        p["total"] += 1
        p["counts"][SINFO[n.state]] = p["counts"].get(SINFO[n.state], 0) + 1
        p["spares"] += n.is_spare
        p["inService"] += n.state in IN_SERVICE
        if p["all"] or _matters(n, now, config):
            p["notableTotal"] += 1
            if len(p["notable"]) < notable:
                p["notable"].append(node_row(n, now, config))
    return [parts[k] for k in sorted(parts)]


def held_note(held_ids: Sequence[str], message: str | None) -> str:
    """The cluster's message with its held repairs said first (not "all nodes in service")."""
    n = len(held_ids)
    note = (f"{n} repair{'s' if n > 1 else ''} held by the blast-radius guard "
            f"({', '.join(held_ids[:3])}{'...' if n > 3 else ''}): release it here or with "
            f"`mtc node release-hold {held_ids[0]} --reason WHY`")
    rest = "" if not message or message == "all nodes in service" else f"; {message}"
    return note + rest


def node_page(nodes: Iterable[Node], now: float, config: RepairConfig, *,
              partition: str | None, word: str | None, offset: int, size: int
              ) -> dict[str, Any]:
    """One page of a partition's nodes (drill-down), optionally of one sinfo word."""
    size = max(1, min(size, MAX_PAGE))
    found = [n for n in workers(nodes)
             if (not partition or (n.partition or "-") == partition)
             and (not word or SINFO[n.state] == word)]
    page = found[offset:offset + size]
    return {"nodes": [node_row(n, now, config) for n in page], "total": len(found),
            "offset": offset, "next": offset + size if offset + size < len(found) else None}


def _pct(x: float | None) -> float | None:
    return None if x is None else round(100.0 * x, 1)


def _seconds(by: Mapping[str, float]) -> dict[str, float]:
    return {k: round(v, 1) for k, v in sorted(by.items()) if round(v, 1) > 0}


_WAITING = ("JOB_STATE_QUEUED", "JOB_STATE_PENDING")


def job_row(job: Job, acct: JobAccounting, goodput: Any | None, name: str | None = None
            ) -> dict[str, Any]:
    """A job with its attempts, checkpoints, lost work and (when accounted) the three goodputs
    and badput by cause (``goodput``: shared.goodput.JobGoodput); ``name``: its API name,
    for the actions (None: not a CustomJob, e.g. a trial)."""
    latest = job.latest_checkpoint
    row: dict[str, Any] = {
        "id": shown_job_id(job.job_id), "displayName": job.spec.display_name, "state": job.state.value,
        "attempts": job.attempt, "restarts": job.restart_count,
        "nodes": [n for n in job.node_ids if n][:16], "nodeCount": len([n for n in job.node_ids if n]),
        "checkpoints": len(job.checkpoints),
        "latestCheckpoint": None if latest is None else {"step": latest.step, "time": iso(latest.at)},
        "lostSteps": acct.lost_steps, "recoveryS": round(acct.recovery_s, 1),
        "wallS": round(acct.wall_s, 1), "created": iso(job.created_at), "error": job.error or None,
        "name": name,
        # where it waits on a cluster with team queues (shared.policies.fair_share)
        "queue": job.queue if job.queue and job.state.value in _WAITING else None,
    }
    if goodput is not None:
        row["goodput"] = {
            "scheduling": _pct(goodput.scheduling_goodput),
            "runtime": _pct(goodput.runtime_goodput),
            "program": _pct(goodput.program_goodput), "overall": _pct(goodput.goodput),
            "badputByCategoryS": _seconds(goodput.by_category()),
            "badputByCauseS": _seconds(goodput.by_cause()),
        }
    return row


@dataclass(frozen=True)
class EventFilter:
    node: str = ""
    job: str = ""
    type: str = ""
    text: str = ""
    routine: bool = False  # include healthy heartbeats

    def keep(self, doc: Mapping[str, Any], line: str) -> bool:
        data = doc.get("data") or {}
        if not self.routine and is_routine(dict(doc)):
            return False
        if self.node and self.node not in (data.get("node_id"), *data.get("node_ids", ())):
            return False
        if self.job and shown_job_id(str(data.get("job_id"))) != shown_job_id(self.job):
            return False
        if self.type and self.type not in doc["type"]:
            return False
        return not self.text or self.text.lower() in line.lower()


def belongs(doc: Mapping[str, Any], cluster_id: str, node_ids: set[str], job_ids: set[str]
            ) -> bool:
    """Whether an event is about this cluster, its nodes or its jobs."""
    data = doc.get("data") or {}
    return (data.get("cluster_id") == cluster_id or data.get("node_id") in node_ids
            or data.get("job_id") in job_ids)


def kind(type_: str) -> str:
    """The timeline's colour class of an event type: fault, repair, recovery or info."""
    if "diagnosed" in type_ or "health_reported" in type_ or "held" in type_:
        return "fault"
    if "repair" in type_ or "drain" in type_ or "interrupt" in type_ or "signalled" in type_:
        return "repair"
    if "returned" in type_ or "finished" in type_ or "started" in type_ \
            or "recovery_chosen" in type_:
        return "recovery"
    return "info"


def timeline(docs: Sequence[Mapping[str, Any]], flt: EventFilter, limit: int
             ) -> dict[str, Any]:
    """The newest ``limit`` events of ``docs`` (oldest first in, newest first out) that pass
    ``flt``, one line each; ``more``: older ones were left out."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for doc in reversed(docs):
        key = str(doc.get("id", ""))
        if key and key in seen:
            continue  # a redelivered event is logged again
        seen.add(key)
        try:
            line = describe(dict(doc))
        except (KeyError, TypeError, ValueError):
            line = doc["type"]
        if not flt.keep(doc, line):
            continue
        if len(out) >= limit:
            return {"events": out, "more": True}
        data = doc.get("data") or {}
        healthy = doc["type"].endswith("health_reported.v1") and line.endswith("all checks pass")
        out.append({"time": float(doc["time"]), "at": iso(float(doc["time"])),
                    "type": doc["type"], "kind": "info" if healthy else kind(doc["type"]),
                    "text": line,
                    "node": data.get("node_id"),
                    "job": data.get("job_id") and shown_job_id(str(data["job_id"])),
                    # the recovery the policy chose (shared.policies.recovery), as a badge
                    "mode": data.get("mode") if doc["type"].endswith("recovery_chosen.v1")
                    else None})
    return {"events": out, "more": False}


def rollout_box(rollouts: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The cluster page's rollout: the one under way, else the newest (None: never one). A
    wave's nodes are counted, not listed: a wave may be hundreds of nodes."""
    if not rollouts:
        return None
    r = max(rollouts, key=lambda x: (x["state"] in ("RUNNING", "ROLLING_BACK"), x["seq"]))
    return {"id": r["id"], "state": r["state"], "version": dict(r["version"]),
            "wave": r["wave"] + 1, "waves": len(r["waves"]),
            "waveSizes": [len(w) for w in r["waves"]], "reason": r["reason"] or None,
            "pausedWave": r.get("paused_wave")}
