"""The custom jobs of a parent, listed a page at a time (``custom_jobs.JOBS``'s ``seek``):
their API records in creation order, a range of the store's index, then the jobs mtc adopted
on the parent's clusters (users' own ``sbatch``, no API record) by id. A page reads its own
records; each job is read when its page is rendered.

A filter's terms are pushed down where the store can answer them: ``state=`` is the jobs'
state index (keys only, no job decoded). A state few jobs are in is listed from those jobs
(their records found by key); otherwise the records are walked and those the state, the
display name or the labels rule out are answered None, never rendered. What is left is
matched on the rendered job (``services.api.collection``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Set
from typing import Any

from services.api import ids
from services.api.collection import Scope
from services.api.context import RESOURCES, records_of, records_page, resource_key
from services.api.names import Parent
from services.api.paging import Term, bad_token, matches, resource_field
from shared.domain.adopted import ORIGIN_LABEL, SLURM_ORIGIN, adopted
from shared.domain.model import Job

KIND = "customJob"
Listed = tuple[Job | None, dict[str, Any]]  # in a list: the job is read when rendered
Entry = tuple[Any, Listed | None]  # its key, and None where a pushed-down term ruled it out
CANDIDATES = 500  # a state with at most this many jobs is listed from them, not walked


def domain_job_id(job_id: str) -> str:
    """Vertex job ids are numbers; the domain's ids start with a letter. ``job_id``: the
    id's domain form (``services.api.ids``; a number is its own)."""
    return job_id if job_id[:1].isalpha() else f"cj-{job_id}"


def job_of(record: dict[str, Any]) -> str:
    """The domain job id of a custom job's API record."""
    return domain_job_id(ids.domain_of(record))


def adopted_records(uow: Any, parent: Parent) -> list[dict[str, Any]]:
    """The jobs users submitted with plain ``sbatch`` that mtc adopted (no API record: they
    are shown under the parent of the cluster they run on, their spec as mtc recorded it)."""
    out = []
    for cluster in records_of(uow, "cluster", parent):
        # a projection: the cluster's jobs are not all decoded to find the few adopted ones
        for job_id, spec in uow.jobs.project(ids.domain_of(cluster), ("job_id", "spec")):
            if (spec or {}).get("labels", {}).get(ORIGIN_LABEL) == SLURM_ORIGIN:
                job = uow.jobs.get(job_id)
                if job is not None and adopted(job.spec):
                    out.append(adopted_record(job, cluster["id"]))
    return out


def adopted_record(job: Job, cluster_id: str | None = None) -> dict[str, Any]:
    """An adopted job's record: its pools and labels (mtc's scheduling fields are not its);
    ``cluster_id``: its cluster's API id."""
    resource = job.spec.to_dict()
    resource["jobSpec"].pop("scheduling", None)
    return {"id": job.job_id, "resource": resource, "created": job.created_at,
            "cluster": cluster_id or job.cluster_id}


def seek(scope: Scope, after: Any, limit: int, terms: list[Term]) -> list[Entry]:
    """Up to ``limit`` entries of the parent's jobs after the key ``after``, in list order."""
    state = next((v for name, op, v in terms if name == "state" and op == "="), None)
    in_state = None if state is None else scope.uow.jobs.ids(state=state)
    if in_state is not None and len(in_state) <= CANDIDATES:
        return _of_jobs(scope, in_state, after, limit)
    rows = _walk(scope, after, limit)
    keep = _keep(terms, in_state)
    if keep is None:
        return list(rows)
    return [(key, item if keep(item) else None) for key, item in rows]


def _walk(scope: Scope, after: Any, limit: int) -> list[tuple[Any, Listed]]:
    """The records by creation (a page reads its own), then, once they are done, the
    adopted jobs by id (a projection of the parent's clusters' jobs: ``adopted_records``)."""
    uow, parent = scope.uow, scope.parent
    segment, key = _position(after)
    out: list[tuple[Any, Listed]] = []
    if segment == "records":
        for doc_id, record in records_page(uow, KIND, parent, after=key, limit=limit):
            out.append((["r", record["created"], doc_id], (None, record)))
        if len(out) == limit:
            return out
        key = None
    for record in sorted(adopted_records(uow, parent), key=lambda r: str(r["id"])):
        if key is None or record["id"] > key:
            out.append((["a", record["id"]], (uow.jobs.get(record["id"]), record)))
            if len(out) == limit:
                break
    return out


def _of_jobs(scope: Scope, job_ids: Set[str], after: Any, limit: int) -> list[Entry]:
    """The entries of these jobs (a state's few) in list order, after ``after``: each job's
    record read by its key (or the job itself, for one mtc adopted), not the whole list."""
    uow, parent = scope.uow, scope.parent
    clusters: dict[str, str] | None = None  # the parent's clusters: domain id -> API id
    found: list[tuple[Any, Listed]] = []
    for job_id in job_ids:
        record_key, record = _record_of(uow, parent, job_id)
        if record is not None:
            found.append((["r", record["created"], record_key], (None, record)))
            continue
        job = uow.jobs.get(job_id)
        if job is None or not adopted(job.spec):
            continue
        if clusters is None:
            clusters = {ids.domain_of(c): c["id"] for c in records_of(uow, "cluster", parent)}
        if job.cluster_id in clusters:
            found.append((["a", job_id], (job, adopted_record(job, clusters[job.cluster_id]))))
    start = None if after is None else _order(after)
    found = [entry for entry in found if start is None or _order(entry[0]) > start]
    found.sort(key=lambda entry: _order(entry[0]))
    return list(found[:limit])


def _record_of(uow: Any, parent: Parent, job_id: str) -> tuple[str, dict[str, Any] | None]:
    """The key and the API record under ``parent`` of the domain job ``job_id``, if it has
    one (``cj-5`` is the job of record ``5`` or of a client's own id ``cj-5``)."""
    keys = [job_id] + ([job_id[3:]] if job_id.startswith("cj-") else [])
    for domain_id in keys:
        key = resource_key(KIND, domain_id)
        record = uow.record(RESOURCES, key)
        if record is not None and record["parent"] == parent.name and job_of(record) == job_id:
            return key, record
    return "", None


def _position(after: Any) -> tuple[str, Any]:
    """Which part of the list a key ``seek`` gave is in, and where in it: ("records",
    (created, record key) or None), or ("adopted", a job id); a key it never gives is
    INVALID_ARGUMENT."""
    if after is None:
        return "records", None
    if isinstance(after, list) and len(after) == 3 and after[0] == "r" and isinstance(
            after[1], int | float) and not isinstance(after[1], bool) and isinstance(
            after[2], str):
        return "records", (after[1], after[2])
    if isinstance(after, list) and len(after) == 2 and after[0] == "a" and isinstance(
            after[1], str):
        return "adopted", after[1]
    raise bad_token()


def _order(key: Any) -> tuple[int, Any, str]:
    """A key's place in list order: the records by (created, key), then the adopted jobs."""
    segment, where = _position(key)
    return (0, *where) if segment == "records" else (1, 0, where)


def _keep(terms: list[Term], in_state: Set[str] | None) -> Callable[[Listed], bool] | None:
    """What the terms rule out before a job is read: its state (``in_state``: the jobs in
    the state asked for), its display name and labels (from its record); None: nothing."""
    checks: list[Callable[[Listed], bool]] = []
    if in_state is not None:
        checks.append(functools.partial(_in, in_state))
    for term in terms:
        if term[0] == "displayName" or term[0].startswith("labels."):
            checks.append(functools.partial(_record_matches, term))
    return (lambda item: all(check(item) for check in checks)) if checks else None


def _in(job_ids: Set[str], item: Listed) -> bool:
    job, record = item
    return (job.job_id if job is not None else job_of(record)) in job_ids


def _record_matches(term: Term, item: Listed) -> bool:
    return matches([term], functools.partial(resource_field, item[1]["resource"]))
