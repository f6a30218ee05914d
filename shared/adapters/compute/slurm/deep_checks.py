"""The deep checks of ``SlurmCompute`` (``start_deep_check``, the ``DeepChecks`` port):
one run per (node, attempt), recorded in the adapter's sqlite state, run in a worker thread
(it takes minutes; ``poll()`` must not wait), resumed after a restart, its results reported
once by ``poll()``. How one run goes (the maintenance reservation, DCGM, the collective
test) is ``reservations.run_deep_check``.
"""

from __future__ import annotations

import json
import sqlite3
import threading

from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.slurm.api import SlurmApi
from shared.adapters.compute.slurm.reservations import BANDWIDTH_TYPE, DCGM_TYPE, run_deep_check
from shared.adapters.compute.slurm.settings import SlurmSettings
from shared.adapters.compute.slurm.view import SlurmView
from shared.domain.events import NodeHealthReported
from shared.probes.conditions import unknown

DEEP_SCHEMA = """
CREATE TABLE IF NOT EXISTS deep_checks (
    node_id TEXT NOT NULL, attempt INTEGER NOT NULL, slurm_node TEXT NOT NULL,
    started_at REAL NOT NULL, result TEXT, reported INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (node_id, attempt));
"""


class SlurmDeepChecks:
    """``start_deep_check`` for ``SlurmCompute``."""

    def __init__(self, settings: SlurmSettings, store: FactStore, view: SlurmView,
                 cli: SlurmApi) -> None:
        self._settings = settings
        self._store = store
        self._view = view
        self._cli = cli

    def start_deep_check(self, node_id: str, attempt: int) -> None:
        """Once per (node, attempt); runs in a thread, ``poll()`` reports the results."""
        with self._store.tx() as db:
            row = db.execute("SELECT slurm_node FROM nodes WHERE node_id = ?", (node_id,)
                             ).fetchone()
            slurm_node = row["slurm_node"] if row is not None else None
            now = self._store.clock.now()
            result = None
            if slurm_node is None:  # no Slurm node to check: say so, never leave it pending
                reason = f"{node_id} has no Slurm node here: deep checks could not run"
                result = json.dumps([{**unknown(t, now, reason).to_dict(), "details": {
                    "deep_check_attempt": attempt}} for t in (DCGM_TYPE, BANDWIDTH_TYPE)])
            cur = db.execute("INSERT OR IGNORE INTO deep_checks (node_id, attempt, slurm_node,"
                             " started_at, result) VALUES (?, ?, ?, ?, ?)",
                             (node_id, attempt, slurm_node or "", now, result))
            started = cur.rowcount == 1 and slurm_node is not None
        if started and slurm_node is not None:
            self._deep_thread(node_id, attempt, slurm_node)

    def resume(self) -> None:
        """After a restart: rerun the checks that never finished (the reservation is reused)."""
        with self._store.tx() as db:
            rows = db.execute("SELECT node_id, attempt, slurm_node FROM deep_checks"
                              " WHERE result IS NULL").fetchall()
        for r in rows:
            self._deep_thread(r["node_id"], r["attempt"], r["slurm_node"])

    def _deep_thread(self, node_id: str, attempt: int, slurm_node: str) -> None:
        peers = self._idle_peers(slurm_node)
        thread = threading.Thread(target=self._run_deep, args=(node_id, attempt, slurm_node,
                                                               peers),
                                  name=f"deep-check-{node_id}-{attempt}", daemon=True)
        thread.start()

    def _idle_peers(self, slurm_node: str) -> list[str]:
        return sorted(name for name, rec in self._view.records.items()
                      if name != slurm_node and rec.up and not rec.node.drained
                      and rec.node.state == "idle")

    def _run_deep(self, node_id: str, attempt: int, slurm_node: str, peers: list[str]) -> None:
        conditions = run_deep_check(self._cli, slurm_node, peers, attempt,
                                    self._settings.deep_check_spec,
                                    self._settings.deep_check_runner, self._store.clock.now)
        with self._store.tx() as db:
            db.execute("UPDATE deep_checks SET result = ? WHERE node_id = ? AND attempt = ?",
                       (json.dumps(conditions), node_id, attempt))

    def report(self, db: sqlite3.Connection, now: float) -> None:
        for row in db.execute("SELECT * FROM deep_checks WHERE result IS NOT NULL AND"
                              " reported = 0 ORDER BY started_at").fetchall():
            db.execute("UPDATE deep_checks SET reported = 1 WHERE node_id = ? AND attempt = ?",
                       (row["node_id"], row["attempt"]))
            self._store.queue(db, NodeHealthReported(row["node_id"], now,
                                               tuple(json.loads(row["result"])),
                                               source="deep-check"))
