"""The web console: ``/console`` on ``mtc serve``, plain HTML/JS/CSS and bounded JSON.

The page asks for the API token once (kept in the tab's sessionStorage, sent as the bearer
token on every call); each data endpoint checks it with the API's guard and a viewer
permission on the cluster's project. The page polls ``/console/api/poll`` every 2 s (one
request: ``mtc serve`` answers one at a time), drills down through ``/console/api/nodes``
and ``/console/api/timeline``, and shows the twin's results (``mtc serve --sim-dir DIR``)
through ``/console/api/sim``. Every answer is bounded, whatever the fleet's size.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import flask

from services.api import ids
from services.api.context import RESOURCES, ApiContext, find_record
from services.api.errors import ApiError, invalid
from services.api.job_listing import domain_job_id
from services.api.names import Parent
from services.console import endpoints_view, jobpage, sim, views
from services.console.accounting import accounting
from services.console.history import MAX_POINTS, History, series
from services.observability.alerts import held
from services.presentation.views import iso, out_of_service, service_message
from shared.adapters.compute.worker_logs import WorkerLogs
from shared.domain.model import ClusterState
from shared.policies.rollout import ROLLOUTS
from shared.service_layer import triage_policy

STATIC = Path(__file__).parent / "static"
PAGE_FILES = {"console.js": "text/javascript", "console-more.js": "text/javascript",
              "console-policy.js": "text/javascript", "console.css": "text/css"}
VIEW_CLUSTERS = "aiplatform.modelDevelopmentClusters.get"
LIST_CLUSTERS = "aiplatform.modelDevelopmentClusters.list"
LIST_JOBS = "aiplatform.customJobs.list"
WINDOW_S = 6 * 3600.0  # the timeline reads this far back at most per request
POLL_WINDOW_S = 1800.0  # ... and a poll this far (older pages: /console/api/timeline)
JOBS_PAGE = 20
MAX_EVENTS = 200


def _json(body: Any, status: int = 200) -> flask.Response:
    return flask.Response(json.dumps(body), status=status, mimetype="application/json",
                          headers={"Cache-Control": "no-store"})


def _int(name: str, default: int, low: int, high: int) -> int:
    raw = flask.request.args.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid(name, f"must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise invalid(name, f"must be {low} to {high}, got {value}")
    return value


def _float(name: str) -> float | None:
    raw = flask.request.args.get(name)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise invalid(name, f"must be a number, got {raw!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise invalid(name, "must be a finite number")
    return value


class Console:
    """The console's data, read through the API's context (its store, event log, guard)."""

    def __init__(self, ctx: ApiContext, sim_dir: Path | None,
                 history: History | None = None) -> None:
        self.ctx = ctx
        self.sim_dir = sim_dir
        self.history = history

    @contextmanager
    def read(self) -> Iterator[Any]:
        """A read of the store, without the delivery an API call triggers after it: the
        console polls, and ``mtc serve`` delivers and ticks between requests anyway (on a
        16,384-node fleet one delivery costs seconds)."""
        uow = self.ctx.runtime.deps.uow()
        with uow:
            yield uow

    def _auth(self) -> str | None:
        return flask.request.headers.get("Authorization")

    def check(self, permission: str, project: str) -> str:
        return self.ctx.guard.check(self._auth(), permission, project).name

    def whoami(self) -> dict[str, Any]:
        try:
            return {"principal": self.check(LIST_CLUSTERS, "*")}
        except ApiError as exc:
            if exc.http_status == 401:
                raise
            return {"principal": "(token accepted)"}

    def clusters(self, uow: Any) -> list[dict[str, Any]]:
        """The clusters the caller may view, in every project it is bound to."""
        allowed: dict[str, bool] = {}
        out = []
        for record in sorted(uow.records(RESOURCES, {"kind": "cluster"}),
                             key=lambda r: (r["parent"], r["created"], r["id"])):
            project = record["project"]
            if project not in allowed:
                try:
                    self.check(LIST_CLUSTERS, project)
                    allowed[project] = True
                except ApiError as exc:
                    if exc.http_status == 401:
                        raise
                    allowed[project] = False
            cluster = uow.clusters.get(ids.domain_of(record))
            if not allowed[project] or cluster is None or cluster.state is ClusterState.DELETED:
                continue
            out.append({"name": f"{record['parent']}/modelDevelopmentClusters/{record['id']}",
                        "id": record["id"], "project": project, "location": record["location"],
                        "displayName": record["resource"].get("displayName") or record["id"],
                        "state": cluster.state.value, "message": cluster.message or None})
            if len(out) >= 200:
                break
        if not allowed:
            self.whoami()  # no cluster anywhere: still refuse a bad token
        return out

    def _cluster(self, uow: Any, name: str, permission: str) -> dict[str, Any]:
        parts = name.split("/")
        if len(parts) != 6 or parts[0] != "projects" or parts[2] != "locations" \
                or parts[4] != "modelDevelopmentClusters":
            raise invalid("cluster", "must be projects/P/locations/L/modelDevelopmentClusters/C")
        self.check(permission, parts[1])
        record = find_record(uow, "cluster", parts[5], Parent(parts[1], parts[3]))
        if record is None:
            raise ApiError("NOT_FOUND", f"{name} not found")
        return {**record, "domain": ids.domain_of(record)}  # the domain's id (api.ids)

    def _events(self, since: float, until: float | None = None) -> list[dict[str, Any]]:
        log = self.ctx.runtime.deps.event_log
        if log is None:
            return []
        out = []
        for doc in log.read(since):
            if until is not None and doc["time"] >= until:
                break
            out.append(doc)
        return out

    def _filter(self) -> views.EventFilter:
        a = flask.request.args
        return views.EventFilter(node=a.get("node", "")[:200], job=a.get("job", "")[:200],
                                 type=a.get("type", "")[:200], text=a.get("text", "")[:200],
                                 routine=a.get("routine") in ("1", "true"))

    def _timeline(self, cluster_id: str, nodes: list[Any], job_ids: set[str], limit: int,
                  before: float | None, docs: list[dict[str, Any]] | None = None,
                  api_id: str | None = None) -> dict[str, Any]:
        now = self.ctx.now
        until = before if before is not None else None
        start = (until if until is not None else now) - WINDOW_S
        docs = docs if docs is not None else self._events(start, until)
        node_ids = {n.node_id for n in nodes}
        mine = [d for d in docs if d["time"] >= start and (until is None or d["time"] < until)
                and views.belongs(d, cluster_id, node_ids, job_ids)]
        shown = views.timeline(mine, self._filter(), limit)
        for row in shown["events"]:  # the names this project's API gives them
            for key in ("text", "node"):
                if row[key]:
                    row[key] = ids.api_text(cluster_id, api_id or cluster_id, row[key])
        return shown

    def poll(self) -> dict[str, Any]:
        now = self.ctx.now
        config = self.ctx.runtime.deps.config.repair
        name = flask.request.args.get("cluster", "")
        limit = _int("limit", 100, 1, MAX_EVENTS)
        offset = _int("jobsOffset", 0, 0, 1 << 30)
        with self.read() as uow:
            clusters = self.clusters(uow)
            if not name and clusters:
                name = clusters[0]["name"]
            body: dict[str, Any] = {"now": iso(now), "clusters": clusters,
                                    "cluster": name or None, "grid": [], "jobs": None,
                                    "timeline": None, "sim": self.sim_dir is not None}
            if not name:
                return body
            record = self._cluster(uow, name, VIEW_CLUSTERS)
            self.check(LIST_JOBS, record["project"])
            cluster_id = record["domain"]
            nodes = uow.nodes.list(cluster_id)
            # the page's jobs are read, the others only projected (id, created): a poll of a
            # cluster with 5,000 jobs decodes the 20 it shows
            keys = sorted(uow.jobs.project(cluster_id, ("job_id", "created_at")),
                          key=lambda k: (-k[1], k[0]))
            page = [j for j in (uow.jobs.get(k[0]) for k in keys[offset:offset + JOBS_PAGE])
                    if j is not None]
            names = {j.job_id: _job_name(uow, j.job_id) for j in page}
            body["rollout"] = views.rollout_box(uow.records(ROLLOUTS, {"cluster_id": cluster_id}))
        since = min([now - POLL_WINDOW_S, *(j.created_at for j in page)])
        docs = self._events(since)
        accts = accounting(docs, page, now)
        body["grid"] = views.grid(nodes, now, config)
        holds = sorted(n.node_id for n in views.workers(nodes) if held(n))
        body["held"] = {"count": len(holds), "nodes": holds[:20]}
        for c in clusters:  # a node out or a held repair is never "all nodes in service"
            if c["name"] == name:
                c["message"] = service_message(c["message"] or "", *out_of_service(nodes)) or None
            if c["name"] == name and holds:
                c["message"] = views.held_note(holds, c["message"])
        body["jobs"] = {"items": [views.job_row(j, *accts[j.job_id], name=names[j.job_id])
                                  for j in page],
                        "total": len(keys), "offset": offset,
                        "next": offset + JOBS_PAGE if offset + JOBS_PAGE < len(keys) else None}
        body["timeline"] = self._timeline(cluster_id, nodes, {k[0] for k in keys}, limit, None,
                                          docs, api_id=record["id"])
        return body

    def endpoints(self) -> dict[str, Any]:
        with self.read() as uow:
            return endpoints_view.endpoints(uow, self.check)

    def nodes(self) -> dict[str, Any]:
        with self.read() as uow:
            record = self._cluster(uow, flask.request.args.get("cluster", ""), VIEW_CLUSTERS)
            nodes = uow.nodes.list(record["domain"])
        page = views.node_page(nodes, self.ctx.now, self.ctx.runtime.deps.config.repair,
                               partition=flask.request.args.get("partition") or None,
                               word=flask.request.args.get("state") or None,
                               offset=_int("offset", 0, 0, 1 << 30),
                               size=_int("size", 100, 1, views.MAX_PAGE))
        for row in page["nodes"]:  # named as the API names them to this project
            row["id"] = ids.api_node(record["domain"], record["id"], row["id"])
        return page

    def policy(self) -> dict[str, Any]:
        """The cluster's candidate triage table: its stages, diff report by cause and
        recommendations (``GET .../triagePolicy``'s answer)."""
        with self.read() as uow:
            record = self._cluster(uow, flask.request.args.get("cluster", ""), VIEW_CLUSTERS)
            return triage_policy.view(uow, record["domain"])

    def timeline(self) -> dict[str, Any]:
        with self.read() as uow:
            record = self._cluster(uow, flask.request.args.get("cluster", ""), VIEW_CLUSTERS)
            self.check(LIST_JOBS, record["project"])
            nodes = uow.nodes.list(record["domain"])
            job_ids = {k[0] for k in uow.jobs.project(record["domain"], ("job_id",))}
        return self._timeline(record["domain"], nodes, job_ids, _int("limit", 100, 1, MAX_EVENTS),
                              _float("before"), api_id=record["id"])

    def job(self) -> dict[str, Any]:
        """One job's page: attempts, incidents with their recovery mode, goodput, log tails."""
        job_id = flask.request.args.get("job", "")
        with self.read() as uow:
            record = self._cluster(uow, flask.request.args.get("cluster", ""), VIEW_CLUSTERS)
            self.check(LIST_JOBS, record["project"])
            job = uow.jobs.get(domain_job_id(job_id)) or uow.jobs.get(job_id)
            if job is None or job.cluster_id != record["domain"]:
                raise ApiError("NOT_FOUND", f"job {job_id[:200]!r} not found in this cluster")
            name = _job_name(uow, job.job_id)
        now = self.ctx.now
        docs = self._events(job.created_at)
        acct, goodput = accounting(docs, [job], now)[job.job_id]
        compute = self.ctx.runtime.deps.compute
        files = compute.log_files(job.job_id) if isinstance(compute, WorkerLogs) else []
        return {"job": views.job_row(job, acct, goodput, name=name),
                "attempts": jobpage.attempts(docs, job.job_id),
                "incidents": jobpage.incidents(docs, job.job_id),
                "logs": jobpage.log_tails(files, _int("lines", jobpage.TAIL_LINES, 1, 200)),
                "logsKept": isinstance(compute, WorkerLogs)}

    def charts(self) -> dict[str, Any]:
        """The cluster's history as chart series: nodes by state, goodput, fault-to-drain."""
        with self.read() as uow:
            record = self._cluster(uow, flask.request.args.get("cluster", ""), VIEW_CLUSTERS)
        if self.history is None:
            return {"enabled": False, **series([])}
        window = _int("windowS", 3600, 60, int(self.history.retention_s))
        samples = self.history.read(record["domain"], self.ctx.now - window)
        return {"enabled": True, "windowS": window, "intervalS": self.history.interval_s,
                **series(samples, _int("points", MAX_POINTS, 2, MAX_POINTS))}

    def _sim_dir(self) -> Path:
        self.check(LIST_CLUSTERS, flask.request.args.get("project") or "*")
        if self.sim_dir is None:
            raise ApiError("NOT_FOUND", "no twin results: start mtc serve with --sim-dir DIR")
        return self.sim_dir

    def sim_list(self) -> dict[str, Any]:
        return sim.listing(self._sim_dir())

    def sim_file(self) -> flask.Response:
        root = self._sim_dir()
        path = sim.resolve(root, flask.request.args.get("path", ""))
        if path.suffix == ".png":
            return flask.Response(path.read_bytes(), mimetype="image/png",
                                  headers={"Cache-Control": "no-store"})
        return _json(sim.table(path))


def _job_name(uow: Any, job_id: str) -> str | None:
    """The API name of a job submitted as a CustomJob (None: a trial, an adopted job)."""
    rid = job_id[3:] if job_id.startswith("cj-") else job_id
    record = uow.record(RESOURCES, f"customJob:{rid}")
    return f"{record['parent']}/customJobs/{record['id']}" if record else None


def register(app: flask.Flask, ctx: ApiContext, sim_dir: Path | None = None,
             history: History | None = None) -> None:
    """Add ``/console`` and its data endpoints to the API's Flask app."""
    console = Console(ctx, sim_dir, history)

    def data(fn: Callable[[], Any]) -> Callable[[], flask.Response]:
        def endpoint() -> flask.Response:
            try:
                console.whoami()  # a bad or missing token is a 401 before anything else
                out = fn()
                return out if isinstance(out, flask.Response) else _json(out)
            except ApiError as exc:
                return _json(exc.body(), exc.http_status)
        endpoint.__name__ = f"console_{fn.__name__}"
        return endpoint

    app.add_url_rule("/console/api/whoami", view_func=data(console.whoami))
    app.add_url_rule("/console/api/poll", view_func=data(console.poll))
    app.add_url_rule("/console/api/nodes", view_func=data(console.nodes))
    app.add_url_rule("/console/api/endpoints", view_func=data(console.endpoints))
    app.add_url_rule("/console/api/timeline", view_func=data(console.timeline))
    app.add_url_rule("/console/api/policy", view_func=data(console.policy))
    app.add_url_rule("/console/api/job", view_func=data(console.job))
    app.add_url_rule("/console/api/history", view_func=data(console.charts))
    app.add_url_rule("/console/api/sim", view_func=data(console.sim_list))
    app.add_url_rule("/console/api/sim/file", view_func=data(console.sim_file))

    def page() -> flask.Response:
        return flask.Response((STATIC / "console.html").read_bytes(), mimetype="text/html",
                              headers=_SECURITY)

    def static(name: str) -> flask.Response:
        if name not in PAGE_FILES:
            return _json(ApiError("NOT_FOUND", f"no such console file: {name}").body(), 404)
        return flask.Response((STATIC / name).read_bytes(), mimetype=PAGE_FILES[name],
                              headers=_SECURITY)

    app.add_url_rule("/console", view_func=page, endpoint="console_page")
    app.add_url_rule("/console/", view_func=page, endpoint="console_page_slash")
    app.add_url_rule("/console/static/<name>", view_func=static, endpoint="console_static")


_SECURITY = {"Content-Security-Policy": "default-src 'self'; img-src 'self' blob:; "
             "object-src 'none'; frame-ancestors 'none'",
             "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
             "Cache-Control": "no-store"}
