"""The Slurm adapter's operation queue: every Slurm command it issues, keyed and retried.

Each port call records what it wants as an operation keyed by its idempotency key (a repeat
is a no-op; ``replace``: a desired state, the newest wins) and runs it at once; a transient
error (slurmctld down or slow) leaves it pending and ``poll()`` retries it with exponential
backoff, raising an alert; a permanent error ends it with an alert. Operations run outside any
transaction; ``_op_<kind>`` runs one, ``_done_<kind>`` / ``_failed_<kind>`` record its result.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.adapters.compute.fact_store import FactState
from shared.adapters.compute.slurm.api import NodeRecord, SlurmApi
from shared.adapters.compute.slurm.cli import SlurmError, SlurmJob, SlurmTransientError
from shared.probes.agent import AgentState
from shared.probes.commands import Runner as ProbeRunner

log = logging.getLogger("mtc.compute.slurm")

OP_LEASE_S = 60.0  # an operation claimed by a process that died is run again after this


@dataclass
class OpResult:
    """How one run of an operation went (``data``: what ``_done_<kind>`` records)."""

    ok: bool
    transient: bool = False
    error: str = ""
    quiet: bool = False  # waiting on another operation, not a failure worth an alert
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Alert:
    """Something a person should look at (``SlurmCompute.alerts()``)."""

    at: float
    kind: str
    subject: str
    detail: str


class SlurmOps(FactState):
    """The queue, and the state every part of ``SlurmCompute`` shares (set in its
    ``__init__``)."""

    cli: SlurmApi
    partition: str | None
    instance: str
    _allowed: tuple[str, ...] | None
    _python: str
    _agent_interval: float
    _probes: tuple[str, ...]
    _agent_runner: ProbeRunner
    _agent_timeout: float
    _observe_interval: float
    _provision_timeout: float
    _repair_timeout: float
    _retry_initial: float
    _retry_max: float
    _master_addr: str
    _agents: dict[str, AgentState]
    _view: dict[str, NodeRecord]
    _jobs: dict[int, SlurmJob]
    _observed_at: float
    _fresh: bool
    _down_since: float | None
    _up_since: float
    _partition_ready: bool

    def _alert(self, db: sqlite3.Connection, kind: str, subject: str, detail: str) -> None:
        log.warning("ALERT %s %s: %s", kind, subject, detail)
        db.execute(
            "INSERT INTO alerts (at, kind, subject, detail) VALUES (?, ?, ?, ?)",
            (self._clock.now(), kind, subject, detail[:1000]),
        )

    def alerts(self) -> list[Alert]:
        """What a person should look at: Slurm unreachable, commands that failed."""
        with self._tx() as db:
            rows = db.execute("SELECT * FROM alerts ORDER BY id").fetchall()
        return [Alert(r["at"], r["kind"], r["subject"], r["detail"]) for r in rows]

    # ------------------------------------------------------------ operations

    def _put_op(
        self, db: sqlite3.Connection, key: str, kind: str, args: Mapping[str, Any], *, replace: bool = False,
        again: bool = False,
    ) -> bool:
        """Record an operation under its idempotency key. ``replace``: a desired state (the
        newest wins) rather than a one-off action; ``again``: run it even if the same one is
        done (the state was undone behind mtc's back). Returns whether there is work to do."""
        now = self._clock.now()
        text = json.dumps(dict(args), sort_keys=True)
        row = db.execute("SELECT kind, args, status FROM ops WHERE key = ?", (key,)).fetchone()
        if row is not None:
            if not replace:
                return False
            if row["kind"] == kind and row["args"] == text and row["status"] != "failed" and not again:
                return False
        seq = db.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM ops").fetchone()[0]
        db.execute(
            "INSERT INTO ops (key, seq, kind, args, status, tries, next_at, claimed_at, error,"
            " updated_at) VALUES (?, ?, ?, ?, 'pending', 0, ?, NULL, '', ?)"
            " ON CONFLICT(key) DO UPDATE SET seq = excluded.seq, kind = excluded.kind,"
            " args = excluded.args, status = 'pending', tries = 0, next_at = excluded.next_at,"
            " claimed_at = NULL, error = '', updated_at = excluded.updated_at",
            (key, seq, kind, text, now, now),
        )
        return True

    def _kick(self, *keys: str) -> None:
        """Run these operations now, unless the controller is known to be down (then
        ``poll()`` retries them on their backoff schedule): a port call returns quickly."""
        if self._down_since is not None:
            return
        self._run_ops(only=keys)

    def _run_ops(self, only: Sequence[str] | None = None) -> None:
        done: set[tuple[str, int]] = set()
        while True:
            now = self._clock.now()
            with self._tx() as db:
                sql = (
                    "SELECT * FROM ops WHERE next_at <= ? AND (status = 'pending'"
                    " OR (status = 'running' AND claimed_at <= ?))"
                )
                params: list[Any] = [now, now - OP_LEASE_S]
                if only is not None:
                    if not only:
                        return
                    sql += f" AND key IN ({','.join('?' * len(only))})"
                    params.extend(only)
                rows = db.execute(sql + " ORDER BY seq", params).fetchall()
                row = next((r for r in rows if (r["key"], r["seq"]) not in done), None)
                if row is None:
                    return
                done.add((row["key"], row["seq"]))
                db.execute(
                    "UPDATE ops SET status = 'running', claimed_at = ? WHERE key = ? AND seq = ?",
                    (now, row["key"], row["seq"]),
                )
            result = self._execute(row["kind"], json.loads(row["args"]))
            with self._tx() as db:
                self._record(db, row, result)
            if result.transient and not result.quiet:
                return  # the controller is not answering: the rest waits for the retry

    def _execute(self, kind: str, args: dict[str, Any]) -> OpResult:
        try:
            handler = getattr(self, f"_op_{kind}")
            result = handler(args)
            assert isinstance(result, OpResult)
        except SlurmTransientError as exc:
            self._controller_down(str(exc))
            return OpResult(False, transient=True, error=str(exc))
        except SlurmError as exc:
            return OpResult(False, error=str(exc))
        except OSError as exc:  # writing scripts, reading run files
            return OpResult(False, error=f"{type(exc).__name__}: {exc}")
        if self._down_since is not None and not result.quiet:
            self._controller_up()
        return result

    def _record(self, db: sqlite3.Connection, row: sqlite3.Row, result: OpResult) -> None:
        now = self._clock.now()
        current = db.execute("SELECT seq FROM ops WHERE key = ?", (row["key"],)).fetchone()
        replaced = current is None or current["seq"] != row["seq"]
        kind, args = row["kind"], json.loads(row["args"])
        if result.ok:
            if not replaced:
                db.execute(
                    "UPDATE ops SET status = 'done', claimed_at = NULL, error = '', updated_at = ?"
                    " WHERE key = ?",
                    (now, row["key"]),
                )
            self._on_done(db, kind, args, result.data, now)
            return
        if result.transient:
            tries = row["tries"] + 1
            delay = (
                self._retry_initial
                if result.quiet
                else min(self._retry_max, self._retry_initial * 2 ** (tries - 1))
            )
            if not replaced:
                db.execute(
                    "UPDATE ops SET status = 'pending', tries = ?, next_at = ?, claimed_at = NULL,"
                    " error = ?, updated_at = ? WHERE key = ?",
                    (tries, now + delay, result.error[:1000], now, row["key"]),
                )
            if not result.quiet and tries in (1, 5, 20):
                self._alert(
                    db,
                    "slurm-unreachable",
                    row["key"],
                    f"{kind} failed ({result.error}); retry {tries} in {delay:g}s, with backoff",
                )
            return
        if not replaced:
            db.execute(
                "UPDATE ops SET status = 'failed', claimed_at = NULL, error = ?, updated_at = ?"
                " WHERE key = ?",
                (result.error[:1000], now, row["key"]),
            )
        self._alert(db, "slurm-command-failed", row["key"], f"{kind}: {result.error}")
        self._on_failed(db, kind, args, result.error, now)

    def _waited(self, since: float, now: float) -> float:
        """How long something has waited for Slurm, not counting the last outage: a reboot
        that could not be checked on while slurmctld was down has not timed out."""
        return now - max(since, self._up_since)

    def _controller_down(self, error: str) -> None:
        if self._down_since is None:
            self._down_since = self._clock.now()
            with contextlib.suppress(sqlite3.Error), self._tx() as db:
                self._alert(db, "slurm-unreachable", "slurmctld", f"{error}; retrying with backoff")

    def _controller_up(self) -> None:
        if self._down_since is not None:
            now = self._clock.now()
            down_for = now - self._down_since
            self._down_since = None
            self._up_since = now
            log.warning("slurmctld answers again after %.1fs: running what waited", down_for)
            with self._tx() as db:  # what backed off during the outage need not wait any more
                db.execute("UPDATE ops SET next_at = ? WHERE status = 'pending' AND next_at > ?", (now, now))

    # -- the operations (each runs outside any transaction)

    def _on_done(
        self, db: sqlite3.Connection, kind: str, args: dict[str, Any], data: dict[str, Any], now: float
    ) -> None:
        hook = getattr(self, f"_done_{kind}", None)
        if hook is not None:
            hook(db, args, data, now)

    def _on_failed(
        self, db: sqlite3.Connection, kind: str, args: dict[str, Any], error: str, now: float
    ) -> None:
        hook = getattr(self, f"_failed_{kind}", None)
        if hook is not None:
            hook(db, args, error, now)
