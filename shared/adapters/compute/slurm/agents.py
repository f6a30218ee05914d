"""The Slurm adapter's node agents: each node's probes, run by ``poll()`` for that node.

Each node's agent is ``shared.probes.agent.collect`` run every ``agent_interval_s`` (the same
probes and HealthReport that ``mtc-agent`` would post from the node; on a one-host cluster
every "node" is this host, so running them in the controller saves a process per node). Its
XID source is the node's own kernel log, ``<state_dir>/nodes/<slurm node>/kern.log``. An agent
is silent while its node is down, powered down or rebooting (its heartbeat then lapses, as a
dead node's would) and while a repair of the node is under way.

Each agent also watches the ranks its node runs (``node_hangs``: their processes in
``/proc``, found by their managed environment): a plain program's rank stopped or stuck past
its limit goes out as ``HangInJob`` on this node in the agent's report, naming the rank.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

from shared.adapters.compute.fact_store import FactStore
from shared.adapters.compute.node_hangs import NodeHangWatch
from shared.adapters.compute.protocol import safe_name
from shared.adapters.compute.slurm.api import operator_condition
from shared.adapters.compute.slurm.scripts import node_memory
from shared.adapters.compute.slurm.settings import SlurmSettings
from shared.adapters.compute.slurm.view import SlurmView
from shared.domain.events import NodeHealthReported
from shared.domain.health import HealthReport
from shared.probes.agent import AgentState, collect
from shared.probes.config import AgentConfig


class SlurmAgents:
    """Node directories, boots and the agents' runs (one ``AgentState`` per Slurm node)."""

    def __init__(self, settings: SlurmSettings, store: FactStore, view: SlurmView) -> None:
        self._settings = settings
        self._store = store
        self._view = view
        self._agents: dict[str, AgentState] = {}
        # every attempt's ranks write to the job's one Slurm output (``attempts.job_log``)
        self.hangs = NodeHangWatch(log_of=lambda job_id: str(
            settings.state_dir / "logs" / safe_name(job_id) / "slurm.out"))

    def node_dir(self, slurm_node: str) -> Path:
        return self._settings.state_dir / "nodes" / safe_name(slurm_node)

    def kernel_log(self, slurm_node: str) -> Path:
        """The node's kernel log: the XID source its agent reads."""
        return self.node_dir(slurm_node) / "kern.log"

    def scratch_dir(self, slurm_node: str) -> Path:
        return self.node_dir(slurm_node) / "scratch"

    def new_boot(self, slurm_node: str, *, wipe_scratch: bool = False) -> None:
        """A (re)booted node: a fresh kernel log (the old one rotated), a fresh agent, its
        memory directory gone (tmpfs does not outlive a boot; on a one-host cluster the
        node's is its own, ``scripts.node_memory``); a reimage also wipes the node's scratch
        directory."""
        shutil.rmtree(node_memory(slurm_node, str(self._settings.state_dir)), ignore_errors=True)
        path = self.kernel_log(slurm_node)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and path.stat().st_size:
            os.replace(path, path.with_name(f"kern.log.{time.strftime('%Y%m%dT%H%M%S')}"))
        path.touch()
        scratch = self.scratch_dir(slurm_node)
        if wipe_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True, exist_ok=True)
        self._agents[slurm_node] = AgentState()

    def _agent_config(self, row: sqlite3.Row, slurm_node: str) -> AgentConfig:
        node_dir = self.node_dir(slurm_node)
        return AgentConfig(
            node_id=row["node_id"],
            node_type=row["machine_type"],
            probes=self._settings.agent_probes,
            xid_source=str(self.kernel_log(slurm_node)),
            xid_cursor_path=str(node_dir / "xid.cursor"),
            mounts=(str(self.scratch_dir(slurm_node)),),
            command_timeout_s=self._settings.agent_command_timeout_s,
            dcgm_timeout_s=max(self._settings.agent_command_timeout_s, 30.0),
        )

    def collect(self, row: sqlite3.Row, now: float) -> HealthReport:
        """One run of the node agent's probes for this node (its XID cursor moves on only
        when the caller ``acknowledge()``s the delivered report)."""
        slurm_node = row["slurm_node"]
        state = self._agents.setdefault(slurm_node, AgentState())
        log_path = self.kernel_log(slurm_node)
        if not log_path.exists():
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_path.touch()
        self.scratch_dir(slurm_node).mkdir(parents=True, exist_ok=True)
        return collect(self._agent_config(row, slurm_node), now, runner=self._settings.agent_runner,
                       state=state)

    def tick(self, now: float) -> None:
        """Each node's agent reports every ``agent_interval_s`` while its slurmd is up."""
        with self._store.tx() as db:
            due = db.execute(
                "SELECT * FROM nodes WHERE role = 'worker' AND deleted = 0 AND provisioned = 1"
                " AND slurm_node IS NOT NULL AND COALESCE(next_report_at, 0) <= ?"
                " AND node_id NOT IN (SELECT node_id FROM repairs WHERE completed_at IS NULL)"
                " ORDER BY node_id",
                (now,),
            ).fetchall()
            for row in due:
                db.execute(
                    "UPDATE nodes SET next_report_at = ? WHERE node_id = ?",
                    (now + self._settings.agent_interval_s, row["node_id"]),
                )
        for row in due:
            record = self._view.records.get(row["slurm_node"])
            if record is not None and not record.up:
                continue  # the node is down: its agent cannot report (the heartbeat lapses)
            report = self.collect(row, now)
            conditions = report_conditions(report) + self.hangs.conditions(row["node_id"], now)
            if row["foreign_reason"] is not None:  # still drained by an operator: say so each time
                conditions += (operator_condition(row["slurm_node"], row["foreign_reason"],
                                                  row["foreign_since"] or now),)
            self._store.emit(NodeHealthReported(row["node_id"], now, conditions, source="agent"))
            self.acknowledge(row["slurm_node"])  # delivered: move the XID cursor on

    def acknowledge(self, slurm_node: str) -> None:
        """The last report collected for the node was delivered: its XID cursor moves on."""
        self._agents[slurm_node].acknowledge()

    def forget(self, slurm_node: str) -> None:
        """The node left this mtc node (replaced): its agent state goes with it."""
        self._agents.pop(slurm_node, None)


def report_conditions(report: HealthReport) -> tuple[dict[str, Any], ...]:
    return tuple(c.to_dict() for c in report.conditions)

