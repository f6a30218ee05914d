"""The endpoints' autoscaler and health watch: once a second, each deployed model whose
maxReplicaCount is above its minimum gets the replica count its load asks for
(``shared.policies.autoscaling``), replicas started or stopped as a deploy does
(``endpoints.scale``), the change kept as a scale event on the deployed model.

A replica whose health route stopped answering (it answered before, in this attempt) for
``UNHEALTHY_S`` while its process runs on a node in service is a hang of its job: it is
reported as the training ranks' hangs are (``HangInJob`` on its node, the replica its
culprit), so the same triage, blast-radius guard and repair ladder act on it (restart the
job; the node replaced when it happens there again within a day). A later attempt that
answers lifts the condition.

It runs in the process that routes the requests (it reads their arrivals,
``serving_router.ARRIVALS``): `mtc serve` starts it with its API.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from typing import Any

from services.api import endpoints, ids
from services.api.context import READING, RESOURCES, ApiContext
from services.api.serving_router import ARRIVALS, STATS, healthy, placed, unhealthy_for
from shared.domain.events import NodeHealthReported
from shared.domain.health import JOB_PROGRESS_SOURCE, ConditionType
from shared.policies.autoscaling import ScaleState, desired, policy_of
from shared.policies.serving import ROUTABLE_NODE_STATES

log = logging.getLogger("mtc.serving")
TICK_S = 1.0
MAX_EVENTS = 50  # a deployed model keeps its newest scale events
_started: list[threading.Thread] = []
_lock = threading.Lock()


_context: list[ApiContext] = []  # the context of the newest call: what the ticks read


def ensure(ctx: ApiContext) -> None:
    """Start the autoscaler of this process, once; it goes on with the newest call's
    context (a process that serves one API has one; tests make several in turn)."""
    with _lock:
        _context[:] = [ctx]
        if _started and _started[0].is_alive():
            return
        thread = threading.Thread(target=_loop, name="mtc-autoscaler", daemon=True)
        _started[:] = [thread]
        thread.start()


def _loop() -> None:
    failed: ApiContext | None = None  # the context whose tick last failed: logged once
    while True:
        time.sleep(TICK_S)
        with _lock:
            ctx = _context[0] if _context else None
        if ctx is None:
            continue
        try:
            tick(ctx, time.monotonic())
            failed = None
        except sqlite3.ProgrammingError:  # its server closed its store: wait for the next
            with _lock:
                if _context and _context[0] is ctx:
                    _context.clear()
        except Exception:  # the next tick tries again; routing goes on meanwhile
            if failed is not ctx:
                log.exception("autoscaler tick failed")
            failed = ctx


def tick(ctx: ApiContext, now: float) -> list[dict[str, Any]]:
    """One pass over every endpoint; the scale events it made. It reads in read-only units
    (they take no locks and do not nudge the control loop) and writes only what changes:
    a health report, a deployed model whose replica count is to change."""
    reading = READING.set(True)
    try:
        with ctx.unit() as uow:
            records = uow.records(RESOURCES, {"kind": endpoints.KIND})
            reports = watch_health(uow, now, ctx.now)
            due = [ids.domain_of(r) for r in records
                   if any(_wanted(r, e, now) is not None
                          for e in r["resource"].get("deployedModels") or [])]
    finally:
        READING.reset(reading)
    if reports:
        with ctx.unit() as uow:
            for report in reports:
                uow.emit(report)
    made = []
    for key in due:
        with ctx.unit() as uow:
            record = uow.record(RESOURCES, f"{endpoints.KIND}:{key}")
            if record is None:
                continue
            resource = dict(record["resource"])
            deployed = [dict(d) for d in resource.get("deployedModels") or []]
            changed = False
            for entry in deployed:
                event = _decide(ctx, uow, record, entry, key, now)
                if event is not None:
                    made.append(event)
                    changed = True
            if changed:
                resource["deployedModels"] = deployed
                endpoints.save(uow, record, resource, ctx.now)
    return made


UNHEALTHY_S = 10.0
_reported: dict[str, int] = {}  # replica job -> the attempt reported hung


def watch_health(uow: Any, now: float, wall: float) -> list[NodeHealthReported]:
    """``HangInJob`` for each replica whose health route went silent, once per attempt; its
    lifting once a later attempt answers. ``now``: time.monotonic's; ``wall``: the clock's,
    when the reports are observed."""
    out = []
    for record in uow.records(RESOURCES, {"kind": endpoints.KIND}):
        for entry in record["resource"].get("deployedModels") or []:
            for replica, running, node, state, attempt in placed(uow, entry):
                job_id = replica["job"]
                hung = _reported.get(job_id)
                if hung is not None and attempt > hung and node and healthy(
                        entry, replica, attempt):
                    del _reported[job_id]
                    out.append(_report(node, False, f"serving replica {job_id} answers "
                                       f"again (attempt {attempt})", {}, wall))
                if not running or not node or state not in ROUTABLE_NODE_STATES or \
                        hung == attempt:
                    continue
                healthy(entry, replica, attempt)  # asked afresh (cached for 2 s)
                silent = unhealthy_for(replica, attempt, now)
                if silent is None or silent < UNHEALTHY_S:
                    continue
                _reported[job_id] = attempt
                log.warning("serving replica %s (attempt %d) on %s: health route silent "
                            "for %.0f s", job_id, attempt, node, silent)
                out.append(_report(node, True, f"serving replica {job_id} attempt {attempt}: "
                                 f"its health route has not answered for {silent:.0f} s",
                                 {"job_id": job_id, "attempt": attempt, "culprit": 0,
                                  "silent_s": round(silent, 3), "threshold_s": UNHEALTHY_S},
                                 wall))
    return out


def _report(node: str, true: bool, reason: str, details: dict[str, Any], now: float
            ) -> NodeHealthReported:
    cond = {"type": ConditionType.HANG_IN_JOB.value, "status": "true" if true else "false",
            "reason": reason, "since": now, "details": details}
    return NodeHealthReported(node_id=node, observed_at=now, conditions=(cond,),
                              source=JOB_PROGRESS_SOURCE)


def _wanted(record: dict[str, Any], entry: dict[str, Any], now: float) -> int | None:
    """The replica count a deployed model wants now, when it differs from what it has."""
    res = entry["dedicatedResources"]
    low, high = int(res.get("minReplicaCount", 1)), int(res.get("maxReplicaCount") or 0)
    if high <= low:
        return None
    replicas = len(entry.get("replicas") or [])
    last = entry.get("scaledAt")
    want = desired(policy_of(res.get("autoscalingMetricSpecs") or []), ScaleState(
        replicas, ARRIVALS.rate((ids.domain_of(record), entry["id"]), now), now,
        last if isinstance(last, float) and last <= now else None, low, high))
    return None if want == replicas else want


def _decide(ctx: ApiContext, uow: Any, record: dict[str, Any], entry: dict[str, Any],
            key: str, now: float) -> dict[str, Any] | None:
    want = _wanted(record, entry, now)
    if want is None:
        return None
    replicas = len(entry.get("replicas") or [])
    load = ARRIVALS.rate((key, entry["id"]), now)
    endpoints.scale(ctx, uow, record, entry, want)
    event = {"time": ctx.now, "from": replicas, "to": want, "loadPerS": round(load, 2)}
    entry["scaleEvents"] = [*(entry.get("scaleEvents") or []), event][-MAX_EVENTS:]
    entry["scaledAt"] = now
    STATS.scaled(f"{record['parent']}/{endpoints.COLLECTION}/{record['id']}", entry["id"],
                 "up" if want > replicas else "down")
    log.info("endpoint %s deployed model %s: %d -> %d replicas (%.1f requests/s)",
             record["id"], entry["id"], replicas, want, load)
    return event
