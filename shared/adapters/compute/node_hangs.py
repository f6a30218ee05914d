"""A node's own watch over the ranks it runs: the hangs of plain programs (``proc_watch``)
seen from the node, where a multi-host cluster's ``/proc`` can be read.

On Slurm the control plane cannot see a rank's processes (they run on other hosts), so each
node's agent looks for them itself: every process whose environment (``/proc/<pid>/environ``,
the one it started with) carries the managed job's ``CLOUD_ML_JOB_ID``, ``MTC_JOB_ATTEMPT``,
``RANK`` and this node's ``MTC_NODE_ID``. The topmost such process of a rank (its parent is
not the same rank's) is the root of the rank's processes, as the launcher's pid is on the
local adapter. The same ``ProcWatch`` samples, the same pure policy decides, and its
``HangInJob`` conditions go out in the node's own report (the agent's transport), on this
node, naming the rank.

What a node cannot see: the ranks on other nodes. The stuck-state rules (a rank stopped or in
``D`` past its limit) need no peer; the quiet-gang rule compares only the ranks on this node.
A program that reports per-rank progress (its ``MTC_PROGRESS_FILE`` exists) is left to
``rank_progress``, as on the local adapter.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mtc_program import protocol as p
from shared.adapters.compute.proc_watch import (
    CHILDREN_FRESH_S,
    ProcWatch,
    RankProc,
    config_from_env,
    read_stat,
)

# the output a rank writes, by job (None: the node cannot tell; its size then never moves)
LogOf = Callable[[str], str | None]


@dataclass(frozen=True)
class RankEnv:
    """What a process's managed environment says it is."""

    job_id: str
    attempt: int
    rank: int
    node_id: str
    checkpoint_dir: str
    progress_file: str


@dataclass(frozen=True)
class NodeAttempt:
    """An attempt's ranks on one node: each rank's root process, and where it saves."""

    checkpoint_dir: str
    roots: Mapping[int, int]  # rank -> pid
    progress_files: tuple[str, ...]


def rank_env(environ: bytes) -> RankEnv | None:
    """The rank a process belongs to, from its ``environ`` (NUL-separated); None for one
    that is no managed rank (no job id, attempt, rank or node)."""
    env = dict(kv.split(b"=", 1) for kv in environ.split(b"\0") if b"=" in kv)

    def get(name: str) -> str:
        return env.get(name.encode(), b"").decode(errors="replace")

    attempt, rank = get(p.JOB_ATTEMPT), get(p.RANK)
    if not (get(p.JOB_ID) and get(p.NODE_ID) and attempt.isdigit() and rank.isdigit()):
        return None
    return RankEnv(get(p.JOB_ID), int(attempt), int(rank), get(p.NODE_ID),
                   get(p.CHECKPOINT_DIR), get(p.PROGRESS_FILE))


def node_attempts(procs: Mapping[int, tuple[int, RankEnv]], node_id: str
                  ) -> dict[tuple[str, int], NodeAttempt]:
    """Each job running on ``node_id``, keyed by its newest attempt here, with its ranks'
    root processes, from every managed process's (parent pid, environment). A rank's root
    is its process whose parent is not of the same rank (a shell or launcher above it
    carries no rank, or another's). A rank held warm into a later attempt goes on in its
    process, whose environment still names the attempt it started in: it counts for the
    job's newest attempt. Where a rank has several roots, the newest attempt's oldest
    (lowest pid) stands for it."""
    best: dict[str, dict[int, tuple[int, int]]] = {}  # job -> rank -> (-attempt, pid)
    newest: dict[str, RankEnv] = {}
    files: dict[str, set[str]] = {}
    for pid, (ppid, env) in sorted(procs.items()):
        if env.node_id != node_id:
            continue
        parent = procs.get(ppid)
        if parent is not None and (parent[1].job_id, parent[1].rank) == (env.job_id, env.rank):
            continue
        ranks = best.setdefault(env.job_id, {})
        ranks[env.rank] = min(ranks.get(env.rank, (-env.attempt, pid)), (-env.attempt, pid))
        if env.job_id not in newest or env.attempt > newest[env.job_id].attempt:
            newest[env.job_id] = env
        if env.progress_file:
            files.setdefault(env.job_id, set()).add(env.progress_file)
    return {(job, newest[job].attempt): NodeAttempt(
                newest[job].checkpoint_dir, {r: pid for r, (_, pid) in sorted(ranks.items())},
                tuple(sorted(files.get(job, ()))))
            for job, ranks in best.items()}


def managed_processes(proc: Path = Path("/proc")) -> Iterator[tuple[int, int, RankEnv]]:
    """(pid, parent pid, rank) of every process of a managed rank this host lets us read."""
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours to read
        env = rank_env(environ)
        stat = read_stat(int(entry.name)) if env is not None else None
        if env is not None and stat is not None:
            yield int(entry.name), stat[1], env


def stuck_only(env: Mapping[str, str]) -> ProcWatch:
    """A watch by the stuck-state rules alone (the node's thresholds from ``env``): for an
    agent that cannot read the ranks' output, whose size then never moves, so "no rank wrote
    for ``quiet_s``" would hold of every healthy program."""
    return ProcWatch(replace(config_from_env(env), quiet_s=math.inf))


class NodeHangWatch:
    """The hang watch of the node agents this process runs (one ``ProcWatch`` per node: on
    a one-host test cluster several "nodes" share this host's ``/proc``; each sees only the
    ranks its ``MTC_NODE_ID`` names)."""

    def __init__(self, log_of: LogOf | None = None,
                 new_watch: Callable[[], ProcWatch] = ProcWatch) -> None:
        self._log_of = log_of or (lambda job_id: None)
        self._new_watch = new_watch
        self.watches: dict[str, ProcWatch] = {}
        # one read of /proc serves every node checked in the same tick
        self._seen: tuple[float, dict[int, tuple[int, RankEnv]]] = (float("-inf"), {})

    def conditions(self, node_id: str, now: float) -> tuple[dict[str, Any], ...]:
        """The ``HangInJob`` conditions (set or lifted) for ``node_id``'s report at ``now``."""
        if now - self._seen[0] > CHILDREN_FRESH_S or now < self._seen[0]:
            self._seen = (now, {pid: (ppid, env) for pid, ppid, env in managed_processes()})
        attempts = node_attempts(self._seen[1], node_id)
        watch = self.watches.get(node_id)
        if watch is None:
            if not attempts:
                return ()  # nothing to watch, nothing set: no state for this node yet
            watch = self.watches[node_id] = self._new_watch()
        out: list[dict[str, Any]] = []
        for (job_id, attempt), found in sorted(attempts.items()):
            if any(Path(f).exists() for f in found.progress_files):
                continue  # it reports per-rank progress: rank_progress's sharper watch
            log = self._log_of(job_id) or ""
            ranks = {r: RankProc(pid, log, node_id) for r, pid in found.roots.items()}
            for report in watch.scan(job_id, attempt, ranks, found.checkpoint_dir, now):
                out += report.conditions
        for key in [k for k in watch.attempts if k not in attempts]:
            watch.forget(*key)  # the attempt left this node
        return tuple(out)

    def forget(self, node_id: str) -> None:
        self.watches.pop(node_id, None)
