"""mtc extension: a CustomJob's worker output, ``GET .../customJobs/{id}/logs``.

Where the compute adapter keeps it is its own affair (``shared.adapters.compute.worker_logs``:
locally one file per attempt and rank, kept across restarts; on Slurm one file for every
attempt and rank). A page is read from a byte offset the page token carries, with the
attempt and rank it was issued for, so ``mtc job logs --follow`` polls from where it was.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from services.api.context import ApiContext, load_record
from services.api.custom_jobs import COLLECTION, KIND, job_of
from services.api.errors import ApiError, invalid, not_found
from services.api.names import Parent
from services.api.wire.job_logs import ReadCustomJobLogsResponse
from shared.adapters.compute.worker_logs import LogFile, WorkerLogs, read_lines

DEFAULT_LINES = 1000
MAX_LINES = 10_000


def read(ctx: ApiContext, parent: Parent, job_id: str, *, rank: str | None = None,
         attempt: str | None = None, size: str | None = None, token: str | None = None
         ) -> dict[str, Any]:
    """One page of ``rank``'s output (default 0) in ``attempt`` (default the newest)."""
    want_rank = _number(rank, "rank", 0)
    want_attempt = _number(attempt, "attempt", 1)
    limit = _number(size, "pageSize", 0)
    limit = min(limit or DEFAULT_LINES, MAX_LINES)
    offset = 0
    if token:
        t_attempt, t_rank, offset = _decode(token)
        if (want_attempt is not None and want_attempt != t_attempt) or \
                (want_rank is not None and want_rank != t_rank):
            raise invalid("pageToken", "was issued for another attempt or rank")
        want_attempt, want_rank = t_attempt, t_rank
    ctx.refresh()
    name = parent.child(COLLECTION, job_id)
    with ctx.unit() as uow:
        domain_id = job_of(load_record(uow, KIND, job_id, parent, name))
        job = uow.jobs.get(domain_id)
        if job is None:
            raise not_found(name)
    layout = [(p.replica_count, p.processes_per_replica()) for p in job.spec.worker_pool_specs]
    compute = ctx.runtime.deps.compute
    if not isinstance(compute, WorkerLogs):
        raise ApiError("FAILED_PRECONDITION", f"this deployment's compute "
                       f"({type(compute).__name__}) keeps no worker logs mtc can read")
    files = compute.log_files(domain_id)
    attempts = sorted({f.attempt for f in files})
    latest = attempts[-1] if attempts else 0
    if want_attempt is None:
        want_attempt = latest
    elif want_attempt not in attempts:
        have = f"attempts {attempts[0]}..{latest}" if attempts else "no attempts yet"
        raise invalid("attempt", f"{name} has {have}, not {want_attempt}")
    if not attempts:
        return _answer([], "", 0, want_rank or 0, 0)
    log = _pick(files, want_attempt, replica_of(want_rank, layout), name)
    try:
        page = read_lines(log.path, offset, max_lines=limit, ended=log.ended)
    except ValueError as exc:
        raise invalid("pageToken", str(exc)) from None
    done = page.at_end and log.ended
    rank_out = log.rank if want_rank is None or log.rank is None else want_rank
    nxt = "" if done else _encode(want_attempt, rank_out, page.offset)
    return _answer(page.lines, nxt, want_attempt, rank_out, latest)


def replica_of(rank: int | None, layout: Sequence[tuple[int, int]]) -> int | None:
    """The replica whose log holds program rank ``rank`` (``RANK`` as the program sees it):
    ``layout`` is each pool's (replicas, processes per replica), ranks counted pool by pool.
    One process per replica (Vertex's world, the default): the rank is the replica; with
    ``MTC_PROCESSES_PER_NODE`` a replica's processes share its log. Past the last rank: the
    rank as given (the error then names what there is)."""
    if rank is None or all(n == 1 for _, n in layout):
        return rank
    left, replicas = rank, 0
    for count, n in layout:
        if left < count * n:
            return replicas + left // n
        left, replicas = left - count * n, replicas + count
    return rank


def _pick(files: Sequence[LogFile], attempt: int, rank: int | None, name: str) -> LogFile:
    mine = [f for f in files if f.attempt == attempt]
    if len(mine) == 1 and mine[0].rank is None:  # one file for every rank
        if rank:
            raise invalid("rank", f"attempt {attempt} of {name} keeps one log for every "
                          "rank (Slurm): leave rank out")
        return mine[0]
    wanted = 0 if rank is None else rank
    for f in mine:
        if f.rank == wanted:
            return f
    ranks = sorted(f.rank for f in mine if f.rank is not None)
    raise invalid("rank", f"attempt {attempt} of {name} has ranks "
                  f"{ranks[0]}..{ranks[-1]}, not {wanted}" if ranks else "has no ranks")


def _answer(lines: list[str], token: str, attempt: int, rank: int | None, latest: int
            ) -> dict[str, Any]:
    return ReadCustomJobLogsResponse(lines=lines, next_page_token=token, attempt=attempt,
                                     rank=rank, latest_attempt=latest).to_json()


def _number(raw: str | None, field: str, minimum: int) -> int | None:
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise invalid(field, f"must be an integer >= {minimum}, got {raw!r}") from None
    if value < minimum or value >= 2**31:
        raise invalid(field, f"must be an integer >= {minimum} (int32), got {raw!r}")
    return value


def _encode(attempt: int, rank: int | None, offset: int) -> str:
    raw = json.dumps({"a": attempt, "r": rank, "o": offset}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode(token: str) -> tuple[int, int | None, int]:
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4)))
        attempt, rank, offset = data["a"], data["r"], data["o"]
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62
                   for v in (attempt, offset, 0 if rank is None else rank)) or attempt < 1:
            raise ValueError
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise invalid("pageToken", "is not a token this log returned") from None
    return attempt, rank, offset
