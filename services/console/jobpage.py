"""One job's page: its attempts, each incident with the recovery mode the policy chose and
what it cost, its goodput, and the tail of each rank's log (the page polls it: following
live). Built from the event log and the compute adapter's worker logs; bounded: at most
``MAX_ATTEMPTS`` attempts and incidents, ``TAIL_LINES`` lines of at most ``MAX_RANKS`` ranks,
read from the last ``TAIL_BYTES`` of each file whatever its size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from services.presentation.timeline import restored, without_checkpoint
from services.presentation.views import iso
from shared.adapters.compute.worker_logs import LogFile

T = "mtc.job."
MAX_ATTEMPTS = 50
MAX_RANKS = 16
TAIL_LINES = 40
TAIL_BYTES = 16_384
# what starts an incident on an attempt: the first of these for it (a node's drain names
# the job, not the attempt: it is the one running then)
INCIDENT_START = ("mtc.node.draining.v1", f"{T}signalled.v1", f"{T}interrupt_requested.v1",
                  f"{T}workers_exited.v1", f"{T}recovery_chosen.v1")


def _mine(docs: Sequence[Mapping[str, Any]], job_id: str) -> list[Mapping[str, Any]]:
    seen: set[str] = set()
    out = []
    for d in docs:
        key = str(d.get("id", ""))
        if (d.get("data") or {}).get("job_id") != job_id or (key and key in seen):
            continue
        seen.add(key)
        out.append(d)
    return out


def attempts(docs: Sequence[Mapping[str, Any]], job_id: str) -> list[dict[str, Any]]:
    """Each attempt: when it started, on which nodes, from which checkpoint, how it ended."""
    out: dict[int, dict[str, Any]] = {}
    for d in _mine(docs, job_id):
        data = d["data"]
        if d["type"] == f"{T}started.v1":
            resume = int(data.get("resume_step", -1))
            out[int(data["attempt"])] = {
                "attempt": int(data["attempt"]), "started": iso(float(d["time"])),
                "nodes": list(data.get("node_ids", ()))[:MAX_RANKS],
                "resumeStep": resume if resume >= 0 else None,
                "resume": f"step {resume}" if resume >= 0 else without_checkpoint(
                    int(data["attempt"])),
                "exitCode": None, "detail": ""}
        elif d["type"] == f"{T}restored.v1" and int(data["attempt"]) in out:
            out[int(data["attempt"])]["restore"] = restored(data)
        elif d["type"] == f"{T}workers_exited.v1" and int(data["attempt"]) in out:
            row = out[int(data["attempt"])]
            row["exitCode"] = int(data.get("exit_code", 0))
            row["detail"] = str(data.get("detail", ""))[:2000]
            row["ended"] = iso(float(d["time"]))
    return [out[k] for k in sorted(out)][-MAX_ATTEMPTS:]


def incidents(docs: Sequence[Mapping[str, Any]], job_id: str) -> list[dict[str, Any]]:
    """Each incident: the attempt it hit, what happened, the recovery mode chosen and why,
    and the seconds from its start (a drain, a signal, the workers' exit) to the next
    attempt's start (None: not recovered yet)."""
    mine = _mine(docs, job_id)
    begun: dict[int, float] = {}
    chosen: dict[int, Mapping[str, Any]] = {}
    started: dict[int, float] = {}
    current = 0
    for d in mine:
        data = d["data"]
        attempt = int(data.get("attempt", current))
        if d["type"] in INCIDENT_START:
            begun.setdefault(attempt, float(d["time"]))
        if d["type"] == f"{T}recovery_chosen.v1":
            chosen.setdefault(attempt, d)
        if d["type"] == f"{T}requeued.v1":  # the plain requeue with nothing else to weigh: no
            chosen.setdefault(attempt, {"time": d["time"], "data": {  # choice was recorded
                "mode": "requeue", "reason": data.get("reason")}})
        if d["type"] == f"{T}started.v1":
            started.setdefault(attempt, float(d["time"]))
            current = max(current, attempt)
    out = []
    for attempt in sorted(chosen):
        d = chosen[attempt]
        data = d["data"]
        at = begun.get(attempt, float(d["time"]))
        nxt = [t for a, t in started.items() if a > attempt and t >= at]
        out.append({"attempt": attempt, "at": iso(at), "mode": data.get("mode"),
                    "incident": data.get("incident"), "reason": data.get("reason"),
                    "expectedLostS": data.get("expected_lost_s"),
                    "recoveryS": round(min(nxt) - at, 1) if nxt else None})
    return out[-MAX_ATTEMPTS:]


def tail(path: str | Path, lines: int = TAIL_LINES, max_bytes: int = TAIL_BYTES) -> list[str]:
    """The last ``lines`` lines of a file, from its last ``max_bytes`` only."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            raw = f.read(max_bytes)
    except OSError:
        return []
    text = raw.decode("utf-8", errors="replace").splitlines()
    if size > max_bytes and text:
        text = text[1:]  # the first line read is most likely cut
    return [line[:500] for line in text[-lines:]]


def log_tails(files: Sequence[LogFile], lines: int = TAIL_LINES) -> dict[str, Any]:
    """The newest attempt's log, one tail per rank (one for all ranks on Slurm)."""
    if not files:
        return {"attempt": None, "ranks": []}
    latest = max(f.attempt for f in files)
    mine = sorted((f for f in files if f.attempt == latest),
                  key=lambda f: -1 if f.rank is None else f.rank)[:MAX_RANKS]
    return {"attempt": latest,
            "ranks": [{"rank": f.rank, "ended": f.ended, "lines": tail(f.path, lines)}
                      for f in mine]}
