"""The Slurm adapter's operation queue: every Slurm command it issues, keyed and retried.

Each port call records what it wants as an operation keyed by its idempotency key (a repeat
is a no-op; ``replace``: a desired state, the newest wins) and runs it at once; a transient
error (slurmctld down or slow) leaves it pending and ``poll()`` retries it with exponential
backoff, raising an alert; a permanent error ends it with an alert. Operations run outside any
transaction. Each collaborator registers the kinds it owns (``OpQueue.register``): how one
runs, and how its result is recorded (done, failed) in a transaction.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.slurm.cli import SlurmError, SlurmTransientError
from shared.adapters.compute.slurm.settings import SlurmSettings
from shared.adapters.compute.slurm.view import SlurmView

log = logging.getLogger("mtc.compute.slurm")

OP_LEASE_S = 60.0  # an operation claimed by a process that died is run again after this


@dataclass
class OpResult:
    """How one run of an operation went (``data``: what its kind's ``done`` records)."""

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


Run = Callable[[dict[str, Any]], OpResult]
Done = Callable[[sqlite3.Connection, dict[str, Any], dict[str, Any], float], None]
Failed = Callable[[sqlite3.Connection, dict[str, Any], str, float], None]


@dataclass(frozen=True)
class OpKind:
    """One kind of operation: how it runs (outside any transaction), and what its result
    records (inside one)."""

    run: Run
    done: Done | None = None
    failed: Failed | None = None


class OpQueue:
    """The queue, the alerts, and slurmctld's up/down state in the shared ``SlurmView``."""

    def __init__(self, settings: SlurmSettings, store: FactStore, view: SlurmView) -> None:
        self._settings = settings
        self._store = store
        self._view = view
        self._kinds: dict[str, OpKind] = {}

    def register(self, kind: str, run: Run, done: Done | None = None,
                 failed: Failed | None = None) -> None:
        """Say how operations of ``kind`` run (each collaborator registers its own)."""
        if kind in self._kinds:
            raise ValueError(f"operation kind {kind!r} registered twice")
        self._kinds[kind] = OpKind(run, done, failed)

    def alert(self, db: sqlite3.Connection, kind: str, subject: str, detail: str) -> None:
        log.warning("ALERT %s %s: %s", kind, subject, detail)
        db.execute(
            "INSERT INTO alerts (at, kind, subject, detail) VALUES (?, ?, ?, ?)",
            (self._store.clock.now(), kind, subject, detail[:1000]),
        )

    def alerts(self) -> list[Alert]:
        """What a person should look at: Slurm unreachable, commands that failed."""
        with self._store.tx() as db:
            rows = db.execute("SELECT * FROM alerts ORDER BY id").fetchall()
        return [Alert(r["at"], r["kind"], r["subject"], r["detail"]) for r in rows]

    # ------------------------------------------------------------ operations

    def put(
        self, db: sqlite3.Connection, key: str, kind: str, args: Mapping[str, Any], *, replace: bool = False,
        again: bool = False,
    ) -> bool:
        """Record an operation under its idempotency key. ``replace``: a desired state (the
        newest wins) rather than a one-off action; ``again``: run it even if the same one is
        done (the state was undone behind mtc's back). Returns whether there is work to do."""
        now = self._store.clock.now()
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

    def kick(self, *keys: str) -> None:
        """Run these operations now, unless the controller is known to be down (then
        ``poll()`` retries them on their backoff schedule): a port call returns quickly."""
        if self._view.down_since is not None:
            return
        self.run(only=keys)

    def run(self, only: Sequence[str] | None = None) -> None:
        done: set[tuple[str, int]] = set()
        while True:
            now = self._store.clock.now()
            with self._store.tx() as db:
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
            with self._store.tx() as db:
                self._record(db, row, result)
            if result.transient and not result.quiet:
                return  # the controller is not answering: the rest waits for the retry

    def _execute(self, kind: str, args: dict[str, Any]) -> OpResult:
        try:
            result = self._kinds[kind].run(args)
        except SlurmTransientError as exc:
            self.controller_down(str(exc))
            return OpResult(False, transient=True, error=str(exc))
        except SlurmError as exc:
            return OpResult(False, error=str(exc))
        except OSError as exc:  # writing scripts, reading run files
            return OpResult(False, error=f"{type(exc).__name__}: {exc}")
        if self._view.down_since is not None and not result.quiet:
            self.controller_up()
        return result

    def _record(self, db: sqlite3.Connection, row: sqlite3.Row, result: OpResult) -> None:
        now = self._store.clock.now()
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
                self._settings.retry_initial_s
                if result.quiet
                else min(self._settings.retry_max_s, self._settings.retry_initial_s * 2 ** (tries - 1))
            )
            if not replaced:
                db.execute(
                    "UPDATE ops SET status = 'pending', tries = ?, next_at = ?, claimed_at = NULL,"
                    " error = ?, updated_at = ? WHERE key = ?",
                    (tries, now + delay, result.error[:1000], now, row["key"]),
                )
            if not result.quiet and tries in (1, 5, 20):
                self.alert(
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
        self.alert(db, "slurm-command-failed", row["key"], f"{kind}: {result.error}")
        self._on_failed(db, kind, args, result.error, now)

    def controller_down(self, error: str) -> None:
        if self._view.down_since is None:
            self._view.down_since = self._store.clock.now()
            with contextlib.suppress(sqlite3.Error), self._store.tx() as db:
                self.alert(db, "slurm-unreachable", "slurmctld", f"{error}; retrying with backoff")

    def controller_up(self) -> None:
        if self._view.down_since is not None:
            now = self._store.clock.now()
            down_for = now - self._view.down_since
            self._view.down_since = None
            self._view.up_since = now
            log.warning("slurmctld answers again after %.1fs: running what waited", down_for)
            with self._store.tx() as db:  # what backed off during the outage need not wait any more
                db.execute("UPDATE ops SET next_at = ? WHERE status = 'pending' AND next_at > ?", (now, now))

    def _on_done(
        self, db: sqlite3.Connection, kind: str, args: dict[str, Any], data: dict[str, Any], now: float
    ) -> None:
        hook = self._kinds[kind].done
        if hook is not None:
            hook(db, args, data, now)

    def _on_failed(
        self, db: sqlite3.Connection, kind: str, args: dict[str, Any], error: str, now: float
    ) -> None:
        hook = self._kinds[kind].failed
        if hook is not None:
            hook(db, args, error, now)
