"""The local compute's warm processes: the ``WarmProcesses`` port over its state file.

Two kinds of running process can take a rank of an in-place, hot-swap or scale-down attempt
instead of a new one, and this composes them:

- the rank's own, held instead of SIGTERMed when its attempt ended and parked for the next
  (``inprocess``: in-process restart);
- its node's standby, started before any fault with the job's command and waiting for a
  rank (``standby``).

``LocalCompute`` holds one ``LocalWarm`` and calls it inside its own transactions: its start
loop takes a warm process for a rank if there is one, else launches; where it would SIGTERM
a rank it asks ``hold`` first; each ``poll`` parks the ranks that answered and runs ``tick``.
With ``offered`` False no rank is told its control file and no standby is kept, so no
program can declare, and nothing is held or taken.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Callable, Mapping, Set
from pathlib import Path

from shared.adapters.compute.local import inprocess, queries, standby
from shared.adapters.compute.local.procs import exit_code
from shared.ports import Gang, RankProcess, RecoveryPlan, WarmProcesses, WorkerSpec

PARK_S = inprocess.PARK_S
WARM_SCHEMA = inprocess.SCHEMA + standby.SCHEMA

# (transaction, spec, environment, exit file, control file, log) -> the sandbox plan of a
# standby, or None: unsandboxed
Plan = Callable[[sqlite3.Connection | None, WorkerSpec, Mapping[str, str], Path, Path, Path],
                Path | None]


def _process(row: sqlite3.Row) -> RankProcess:
    return RankProcess(row["pid"], row["start_ticks"], row["exit_file"], row["control_file"])


class LocalWarm(WarmProcesses[sqlite3.Connection]):
    """Held ranks and standbys of the local compute. ``park_s``: how long a held process
    waits to be taken (and a job's standbys outlive its last attempt); ``grace_s``: SIGTERM
    to SIGKILL of a held process not taken; ``plan``: a standby's sandbox, as its job's
    ranks get; ``gcs_root``: where the ranks' ``gs://`` directories are on the host
    (``protocol.host_dir``), None: their environment names local paths."""

    def __init__(self, python: str, state_dir: Path, children: set[int], plan: Plan, *,
                 park_s: float = PARK_S, grace_s: float = 10.0, offered: bool = True,
                 gcs_root: str | None = None) -> None:
        self._python = python
        self._gcs_root = gcs_root
        self._state_dir = state_dir
        self._children = children  # launchers started here: the compute reaps them
        self._plan = plan
        self._park_s = park_s
        self._grace_s = grace_s
        self._offered = offered

    @staticmethod
    def migrate(db: sqlite3.Connection) -> None:
        inprocess.migrate(db)
        standby.migrate(db)

    def prepare(self, exit_file: Path) -> tuple[Path, dict[str, str]]:
        """A new rank's control file (cleared) and what its environment gets so that its
        program may declare in-process restart: nothing where it is not offered."""
        control = inprocess.control_path(exit_file)
        control.unlink(missing_ok=True)
        return control, ({inprocess.RESTART_FILE: str(control)} if self._offered else {})

    def take(self, tx: sqlite3.Connection, spec: WorkerSpec, plan: RecoveryPlan | None,
             env: Mapping[str, str], log: str) -> RankProcess | None:
        """The job's held process on the rank's node, else the node's standby; none for a
        requeue or a fresh node (a hot swap's spare)."""
        if plan is None or plan.mode not in inprocess.IN_PROCESS_MODES \
                or spec.node_id in plan.fresh_node_ids:
            return None
        row = inprocess.take(tx, spec.job_id, spec.node_id, env, Path(log)) \
            or standby.take(tx, spec.job_id, spec.node_id, env, Path(log))
        return None if row is None else _process(row)

    def want(self, tx: sqlite3.Connection, spec: WorkerSpec, env: Mapping[str, str]) -> None:
        if self._offered:
            standby.want(tx, spec.job_id, spec.node_id, spec.command, env, spec.buckets)

    def settle(self, tx: sqlite3.Connection, gang: Gang, now: float) -> None:
        inprocess.end_parked(tx, now, self._grace_s, gang.job_id)
        standby.end(tx, gang.job_id, keep_nodes=gang.node_ids)

    def hold(self, tx: sqlite3.Connection, job_id: str, attempt: int) -> Set[int]:
        return {w["rank"] for w in queries.live_ranks(tx, job_id, attempt)
                if inprocess.hold(tx, w, self._park_s)}

    def park(self, tx: sqlite3.Connection, job_id: str, attempt: int, now: float
             ) -> dict[int, int]:
        asked = tx.execute("SELECT * FROM workers WHERE job_id = ? AND attempt = ? AND"
                           " exit_code IS NULL AND hold_gen IS NOT NULL",
                           (job_id, attempt)).fetchall()
        return {w["rank"]: inprocess.park(tx, w, now, self._park_s) for w in asked
                if exit_code(w) is None and inprocess.held(w)}

    def end(self, tx: sqlite3.Connection, job_id: str | None, now: float) -> None:
        if job_id is None:
            inprocess.kill_parked(tx)
        else:
            inprocess.end_parked(tx, now, 0.0, job_id)
        standby.end(tx, job_id)

    def tick(self, tx: sqlite3.Connection, now: float) -> None:
        inprocess.end_parked(tx, now, self._grace_s)  # not taken in time: ended
        standby.end_idle(tx, now, self._park_s)
        standby.renew(tx, time.time())  # a lease is read by the program: wall time
        standby.launch_due(tx, standby.launcher(self._python, self._state_dir, self._children,
                                                functools.partial(self._plan, tx),
                                                self._gcs_root))
