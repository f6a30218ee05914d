"""`mtc cluster`, `mtc job`, `mtc node list`: API calls through a ``Client`` (in process or
over HTTP), printed as tables or as the wire JSON (``--json``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from services.cli.client import Client, ClientError

console = Console()
PIPED_WIDTH = 1000  # rich lays out for 80 columns off a terminal: a pipe gets whole rows


def out() -> Console:
    """The console for a table: the terminal's width, or, piped (``| grep``, a file), wide
    enough that no id or name is cut or wrapped."""
    return console if console.is_terminal else Console(width=PIPED_WIDTH)


def load_body(path: str) -> Any:
    """A JSON request body from a file, or stdin for ``-``."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise ClientError("INVALID_ARGUMENT", f"cannot read {path}: {exc.strerror}",
                          [("-f", f"cannot read {path}")]) from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        reason = f"{path} is not JSON: {exc.msg} at line {exc.lineno}"
        raise ClientError("INVALID_ARGUMENT", reason, [("-f", reason)]) from exc


def show(obj: Any, as_json: bool, table: Callable[[], Table] | None = None, *,
         where: str = "") -> None:
    """``obj`` as JSON, or as the table; an empty list says where it looked (``where``: the
    parent), on stderr, so `--project` and `--api` mistakes are visible."""
    if as_json or table is None:
        print(json.dumps(obj, indent=2))
    else:
        out().print(whole_ids(table()))
    if where and isinstance(obj, list) and not obj:
        print(f"none in {where}" + ("" if "--api" in sys.argv or os.environ.get("MTC_API")
                                    else " (the local state; --api URL for a server)"),
              file=sys.stderr)


def whole_ids(t: Table) -> Table:
    """The first column (the ids people copy) is never cut to fit the terminal."""
    if t.columns:
        first = t.columns[0]
        first.no_wrap = True
        first.min_width = max((len(str(c)) for c in first.cells), default=0) or None
    return t


def last_segment(name: str | None) -> str:
    return (name or "").rsplit("/", 1)[-1]


# ---------------------------------------------------------------- clusters


def _count(value: Any) -> int:
    """int64 fields arrive as strings in proto3 JSON."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def pool_text(pool: dict[str, Any]) -> str:
    scaling = pool.get("scalingSpec") or {}
    count = _count(scaling.get("minNodeCount", scaling.get("maxNodeCount")))
    spares = _count(pool.get("mtcHotSpareCount"))
    return f"{pool.get('id', '?')}:{count}" + (f"(+{spares})" if spares else "")


def cluster_table(clusters: list[dict[str, Any]]) -> Table:
    t = Table("CLUSTER", "STATE", "POOLS", "PARTITIONS", "NODES", "MESSAGE")
    for c in clusters:
        slurm = (c.get("orchestratorSpec") or {}).get("slurmSpec") or {}
        login = slurm.get("loginNodePoolId")
        pools = ", ".join(pool_text(p) + (" (login)" if p.get("id") == login else "")
                          for p in c.get("nodePools", []))
        parts = ", ".join(p.get("id", "?") for p in slurm.get("partitions", []))
        nodes = c.get("mtcNodes") or {}
        in_service = f"{nodes.get('inService', 0)}/{nodes.get('total', 0)}" if nodes else "-"
        t.add_row(last_segment(c.get("name")), c.get("state", "-"), pools, parts or "-",
                  in_service, c.get("mtcStateMessage") or "")
    return t


def operation_error(op: dict[str, Any]) -> ClientError | None:
    error = op.get("error")
    return ClientError.from_status(error) if op.get("done") and error else None


def _finish(client: Client, args: argparse.Namespace, op: dict[str, Any], what: str
            ) -> dict[str, Any]:
    """Wait on ``op`` for up to ``--wait`` seconds; a failed or unfinished one is an error."""
    if not args.wait:
        return op
    op = client.wait_operation(op["name"], args.wait)
    error = operation_error(op)
    if error is not None:
        raise error
    if not op.get("done"):
        raise ClientError("DEADLINE_EXCEEDED", f"{what} is not done after {args.wait:g} s "
                          f"(operation {op['name']}); it goes on: `mtc cluster get` shows it")
    return op


def faulty_body(node_ids: list[str], host: bool, behavior: str, description: str
                ) -> dict[str, Any]:
    """The ``reportFaultyNodes`` body: each node deleted, or its host reported."""
    reason = {"faultReasons": [{"behavior": behavior, "description": description}]}
    return {"nodeActions": [{"nodeId": n, **({"reportFaultyHost": reason} if host else {})}
                            for n in node_ids]}


def _report_faulty(args: argparse.Namespace, client: Client) -> None:
    body = faulty_body(args.node_ids, args.host, args.behavior, args.description)
    op = _finish(client, args, client.report_faulty_nodes(args.parent, args.cluster_id, body),
                 f"reportFaultyNodes on {args.cluster_id}")
    if args.json:
        show(op, True)
        return
    what = "host reported" if args.host else "deleted (recreated under the same name)"
    state = "done" if op.get("done") else "in progress"
    print(f"{', '.join(args.node_ids)}: {what}; operation {op['name']}: {state}")


def rollout_body(args: argparse.Namespace) -> dict[str, Any]:
    version = {k: v for k, v in (("nodeImage", args.node_image), ("driver", args.driver),
                                 ("agent", args.agent)) if v}
    return {"version": version, "waveSize": args.wave_size, "canary": args.canary}


def rollout_lines(op: dict[str, Any]) -> list[str]:
    """The rollout as ``mtc cluster rollout`` prints it: its state, then a line per wave."""
    r = op.get("metadata", {}).get("mtcRollout", {})
    version = ", ".join(f"{k} {v}" for k, v in sorted(r.get("version", {}).items()))
    lines = [f"rollout {r.get('rollout')} ({version}): {r.get('state')}, wave "
             f"{r.get('wave')} of {len(r.get('waves', []))}; operation {op['name']}"]
    if r.get("reason"):
        lines.append(f"  {r['reason']}")
    lines += [f"  wave {i}: {w['state']:<12} {', '.join(w['nodes'])}"
              for i, w in enumerate(r.get("waves", []), 1)]
    return lines


def _rollout(args: argparse.Namespace, client: Client) -> None:
    op = client.rollout_software(args.parent, args.cluster_id, rollout_body(args))
    if args.wait:
        op = client.wait_operation(op["name"], args.wait)
    if args.json:
        show(op, True)
    else:
        print("\n".join(rollout_lines(op)))
    error = operation_error(op)
    if error is not None:
        raise error


def cmd_cluster(args: argparse.Namespace, client: Client) -> None:
    parent = args.parent
    match args.action:
        case "create" | "update":
            body = load_body(args.file)
            call = client.create_cluster if args.action == "create" else client.update_cluster
            op = _finish(client, args, call(parent, args.cluster_id, body),
                         f"cluster {args.action} of {args.cluster_id}")
            if args.json and not args.wait:
                show(op, True)
                return
            cluster = client.get_cluster(parent, args.cluster_id)
            show(cluster, args.json, lambda: cluster_table([cluster]))
            if not args.wait and not args.json:
                print(f"operation {op['name']}: in progress (`--wait S` waits for it)",
                      file=sys.stderr)
        case "report-faulty":
            _report_faulty(args, client)
        case "rollout":
            _rollout(args, client)
        case "get":
            cluster = client.get_cluster(parent, args.cluster_id)
            show(cluster, args.json, lambda: cluster_table([cluster]))
        case "list":
            items = client.list_clusters(parent, args.filter)
            show(items, args.json, lambda: cluster_table(items), where=parent.name)
        case "delete":
            op = _finish(client, args, client.delete_cluster(parent, args.cluster_id),
                         f"cluster delete of {args.cluster_id}")
            if args.json:
                show(op, True)
            else:
                state = "deleted" if op.get("done") else "deleting"
                print(f"{parent.child('modelDevelopmentClusters', args.cluster_id)}: {state}"
                      f" (operation {op['name']})")
        case "nodes":
            cmd_nodes(args, client, [args.cluster_id])


# ---------------------------------------------------------------- jobs


def job_row(j: dict[str, Any]) -> list[str]:
    progress = j.get("mtcProgress") or {}
    ckpt = progress.get("latestCheckpoint")
    cluster = progress.get("clusterId") or (j.get("jobSpec") or {}).get("persistentResourceId")
    return [last_segment(j.get("name")), cluster or "-",
            str(j.get("state", "-")).removeprefix("JOB_STATE_"),
            str(progress.get("attempt", "-")), str(progress.get("restartCount", "-")),
            ",".join(progress.get("nodes", [])), str(ckpt["step"]) if ckpt else "-"]


def queue_line(job: dict[str, Any]) -> str | None:
    """Where a waiting job stands in its team's queue and why (``mtcProgress.queue``)."""
    queue = (job.get("mtcProgress") or {}).get("queue")
    if not queue:
        return None
    return (f"queue: team {queue['team']} on {queue['partition']}, position "
            f"{queue['position']}: {queue['reason']}")


def job_table(jobs: list[dict[str, Any]]) -> Table:
    t = Table("JOB", "CLUSTER", "STATE", "ATTEMPT", "RESTARTS", "NODES", "CHECKPOINT")
    for j in jobs:
        t.add_row(*job_row(j))
    return t


def job_body(args: argparse.Namespace) -> Any:
    """The CustomJob from ``-f``; ``--cluster`` fills ``jobSpec.persistentResourceId`` when the
    file names none (and must agree with it when it does)."""
    body = load_body(args.file)
    if args.cluster and isinstance(body, dict):
        spec = body.setdefault("jobSpec", {})
        if isinstance(spec, dict):
            named = spec.get("persistentResourceId")
            if named and named != args.cluster:
                raise ClientError("INVALID_ARGUMENT", f"--cluster {args.cluster} disagrees "
                                  f"with jobSpec.persistentResourceId {named!r} in {args.file}",
                                  [("jobSpec.persistentResourceId", "disagrees with --cluster")])
            spec["persistentResourceId"] = args.cluster
    return body


def cmd_job(args: argparse.Namespace, client: Client) -> None:
    parent = args.parent
    match args.action:
        case "submit":
            job = client.create_job(parent, job_body(args), args.job_id)
            show(job, args.json, lambda: job_table([job]))
        case "get":
            job = client.get_job(parent, args.job_id)
            show(job, args.json, lambda: job_table([job]))
            line = queue_line(job)
            if line and not args.json:  # a waiting job on a cluster with team queues
                print(line)
        case "list":
            jobs = client.list_jobs(parent, args.filter)
            if args.cluster:
                jobs = [j for j in jobs if (j.get("mtcProgress") or {}).get("clusterId")
                        == args.cluster]
            show(jobs, args.json, lambda: job_table(jobs), where=parent.name)
        case "cancel":
            client.cancel_job(parent, args.job_id)
            job = client.get_job(parent, args.job_id)
            show(job, args.json, lambda: job_table([job]))
            line = queue_line(job)
            if line and not args.json:  # a waiting job on a cluster with team queues
                print(line)
        case "delete":
            op = client.delete_job(parent, args.job_id)
            if args.json:
                show(op, True)
            else:
                print(f"{parent.child('customJobs', args.job_id)}: deleted")


# ---------------------------------------------------------------- nodes


def node_table(nodes: list[dict[str, Any]]) -> Table:
    """One row per node; a RACK column only when some node has one (docs/racks.md)."""
    racks = any(v.get("rack") for v in nodes)
    t = Table("PARTITION", *(("RACK",) if racks else ()), "NODE", "STATE", "SPARE", "JOB",
              "REASON", "SINCE")
    for v in nodes:
        t.add_row(v.get("partition", "-"), *((v.get("rack") or "-",) if racks else ()),
                  v.get("nodeId", "?"), v.get("state", "-"),
                  "yes" if v.get("spare") else "", v.get("job") or "", v.get("reason", ""),
                  (v.get("since") or "")[11:19])
    return t


def cmd_nodes(args: argparse.Namespace, client: Client, cluster_ids: list[str] | None = None
              ) -> None:
    """Nodes (sinfo-like) of the named clusters, or of every cluster in the location."""
    parent = args.parent
    if cluster_ids is None:
        cluster_ids = [args.cluster] if args.cluster else [
            last_segment(c.get("name")) for c in client.list_clusters(parent)]
    nodes = [n for cid in cluster_ids for n in client.cluster_nodes(parent, cid)]
    nodes.sort(key=lambda n: (n.get("partition", ""), n.get("nodeId", "")))
    if not getattr(args, "all", False):
        nodes = [n for n in nodes if n.get("state") != "retired"]
    show(nodes, args.json, lambda: node_table(nodes))


NODE_VERBS = {"release-hold": "releaseHold", "drain": "drain", "resume": "resume",
              "return": "returnToService"}


def cmd_node_op(args: argparse.Namespace, client: Client) -> None:
    """An operator's command on a node (audited: who, what, reason, when)."""
    verb = NODE_VERBS[args.action]
    node = client.node_command(args.parent, args.cluster, args.node_id, verb, args.reason)
    if args.json:
        show(node, True)
        return
    drained = " (drained by an operator)" if node.get("operatorDrained") else ""
    print(f"{node.get('nodeId', args.node_id)}: {verb} done; now {node.get('state', '?')}"
          f"{drained}: {node.get('reason', '')}")
