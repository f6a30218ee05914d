"""How entities look to users (API responses, CLI tables): one place, camelCase JSON."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from shared.domain.model import IN_SERVICE, Cluster, Job, Node, NodeRole

ALL_IN_SERVICE = "all nodes in service"  # what a cluster says when it becomes READY
SERVER_ASSIGNED = "cj-"  # a numeric CustomJob id's domain form (services.api.job_listing)


def shown_job_id(job_id: str) -> str:
    """The id a user sees and types for a job: a server-assigned CustomJob's is the number
    in its resource name, as on Vertex (``cj-5`` is only the domain's spelling of job 5)."""
    rest = job_id[len(SERVER_ASSIGNED):]
    return rest if job_id.startswith(SERVER_ASSIGNED) and rest.isdigit() else job_id


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat().replace("+00:00", "Z")


def out_of_service(nodes: Iterable[Node]) -> tuple[int, dict[str, int]]:
    """A cluster's worker count (nodes leaving in a scale-down aside) and its nodes out of
    service by state."""
    total, out = 0, dict[str, int]()
    for n in nodes:
        if n.role is NodeRole.LOGIN or n.retire_when_drained:
            continue
        total += 1
        if n.state not in IN_SERVICE:
            out[n.state.value] = out.get(n.state.value, 0) + 1
    return total, out


def service_message(message: str, total: int, out: Mapping[str, int]) -> str:
    """The cluster's message as of now: "all nodes in service", said when it became READY,
    is not true while a node is drained, repairing or failed; then it says how many are."""
    n = sum(out.values())
    if message != ALL_IN_SERVICE or n == 0:
        return message
    states = ", ".join(f"{count} {state}" for state, count in sorted(out.items()))
    return f"{total - n} of {total} nodes in service ({states})"


def cluster_view(c: Cluster) -> dict[str, Any]:
    return {
        "name": f"clusters/{c.cluster_id}",
        "clusterId": c.cluster_id,
        "state": c.state.value,
        "generation": c.generation,
        "message": c.message,
        "createTime": iso(c.created_at),
        "updateTime": iso(c.updated_at),
        "spec": c.spec.to_dict(),
    }


def node_view(n: Node) -> dict[str, Any]:
    return {
        "nodeId": n.node_id,
        "partition": n.partition or "-",
        "pool": n.pool,
        "role": n.role.value,
        "state": n.state.value,
        "reason": n.reason,
        "since": iso(n.since),
        "spare": n.is_spare,
        "job": n.job_id,
        "repairAction": n.repair_action.value if n.repair_action else None,
        "failures": len(n.history),
    }


def job_view(j: Job) -> dict[str, Any]:
    latest = j.latest_checkpoint
    return {
        "name": f"customJobs/{j.job_id}",
        "jobId": j.job_id,
        "clusterId": j.cluster_id,
        "displayName": j.spec.display_name,
        "state": j.state.value,
        "attempt": j.attempt,
        "restartCount": j.restart_count,
        "nodes": [n for n in j.node_ids if n],
        "latestCheckpoint": None if latest is None else
        {"step": latest.step, "path": latest.path, "time": iso(latest.at)},
        "createTime": iso(j.created_at),
        "startTime": iso(j.started_at),
        "endTime": iso(j.ended_at),
        "updateTime": iso(j.updated_at),
        "error": j.error or None,
        "jobSpec": j.spec.to_dict()["jobSpec"],
        "recovery": recovery_view(j),
    }


def recovery_view(j: Job) -> dict[str, Any] | None:
    """The newest recovery the policy chose (mode, why, expected and measured seconds) and
    the earlier ones; None when the job never had a choice (today's requeue only)."""
    decisions = j.recovery.decisions
    if not decisions:
        return None
    rows = [{"attempt": d["attempt"], "mode": d["mode"], "incident": d["incident"],
             "why": d["why"], "expectedLostSeconds": d["expected_lost_s"],
             "measuredSeconds": d.get("measured_s"), "time": iso(d["at"])}
            for d in decisions]
    return {**rows[-1], "history": rows}
