"""Each rank's processes watched from its node, without the program's help: their state and
CPU time from ``/proc`` (https://man7.org/linux/man-pages/man5/proc.5.html), the size of its
output, the attempt's checkpoints. The pure policy (``shared.policies.process_hangs``)
decides; a hang goes out as ``HangInJob`` on the culprit's node, like one found from per-rank
progress (``rank_progress``), with evidence a person can check: the process and its state,
its Python stack (py-spy, when installed and allowed to read the process; otherwise
"stack: unknown (why)") and the lines torch itself wrote about the hang in the ranks' output
(gloo and NCCL timeouts, the NCCL watchdog and flight recorder).

Programs that report per-rank progress are left to ``rank_progress`` (its threshold is the
job's own step time, sharper than anything seen from outside).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.domain.events import NodeHealthReported
from shared.domain.health import JOB_PROGRESS_SOURCE, ConditionType
from shared.policies import process_hangs
from shared.policies.process_hangs import ProcessHangConfig, ProcSample, RankTrack

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PY_SPY_TIMEOUT_S = 10.0
# what torch writes when a collective times out or its watchdog fires (the peers' side of
# a hang: they name the collective and often the rank they wait for)
TORCH_SIGNALS = re.compile(
    r"(Timed out waiting|timed out|Connection closed by peer|Connection reset by peer|"
    r"Watchdog caught collective operation timeout|ProcessGroupNCCL|NCCL WARN|"
    r"flight recorder|DistBackendError|gloo)", re.IGNORECASE)
_TAIL_BYTES = 64 * 1024
# the order in which a rank's processes' states tell most (a stopped one over a sleeping one)
_RANK_ORDER = {letter: i for i, (letter, _, _) in enumerate(process_hangs.STATE_RULES)}


@dataclass(frozen=True)
class RankProc:
    """Where a live rank runs: its launcher's pid (the root of its processes), output, node."""

    pid: int
    log_path: str
    node_id: str


CHILDREN_FRESH_S = 0.5  # a poll's attempts are scanned well within this


def config_from_env(env: Mapping[str, str]) -> ProcessHangConfig:
    """``MTC_HANG_STOPPED_S``, ``MTC_HANG_D_STATE_S``, ``MTC_HANG_QUIET_S`` over the
    defaults (the node's own settings)."""
    base = ProcessHangConfig()
    names = {"MTC_HANG_STOPPED_S": "stopped_s", "MTC_HANG_D_STATE_S": "uninterruptible_s",
             "MTC_HANG_QUIET_S": "quiet_s"}
    values = {f: float(env[n]) for n, f in names.items() if env.get(n)}
    return ProcessHangConfig(**{**base.__dict__, **values})


def read_stat(pid: int) -> tuple[str, int, float] | None:
    """(state, parent pid, CPU seconds) of ``pid``; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # the name may hold spaces and parentheses
    return fields[0], int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS


def children_map() -> dict[int, list[int]]:
    """Every process's children, from one listing of ``/proc``."""
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = read_stat(int(entry))
            if stat is not None:
                out.setdefault(stat[1], []).append(int(entry))
    return out


def tree(root: int, children: Mapping[int, Sequence[int]]) -> list[int]:
    """``root`` and its descendants, root first."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def sample(rank: int, proc: RankProc, children: Mapping[int, Sequence[int]]
           ) -> ProcSample | None:
    """The rank's processes as one sample; None when none is left."""
    cpu = 0.0
    pids = tree(proc.pid, children)
    picked: tuple[int, int, str, int] | None = None
    for depth, pid in enumerate(pids):
        stat = read_stat(pid)
        if stat is None or stat[0] in ("Z", "X"):
            continue
        cpu += stat[2]
        # the most telling state; among equals the program over its launcher (the root)
        key = (_RANK_ORDER.get(stat[0], len(_RANK_ORDER)), 0 if depth else 1, stat[0], pid)
        if picked is None or key[:2] < picked[:2]:
            picked = key
    if picked is None:
        return None
    try:
        size = os.stat(proc.log_path).st_size
    except OSError:
        size = 0
    return ProcSample(rank, picked[2], picked[3], cpu, size)


def checkpoint_at(checkpoint_dir: str) -> float:
    """The newest modification time two levels into the checkpoint directory (0: none)."""
    newest = 0.0
    try:
        with os.scandir(checkpoint_dir) as top:
            for entry in top:
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
                if entry.is_dir(follow_symlinks=False):
                    with os.scandir(entry.path) as inner:
                        for sub in inner:
                            newest = max(newest, sub.stat(follow_symlinks=False).st_mtime)
    except OSError:
        pass
    return newest


def python_stack(pid: int, timeout_s: float = PY_SPY_TIMEOUT_S) -> str:
    """The process's Python stack by py-spy (without pausing it: a stopped process cannot be
    paused again), or "stack: unknown (why)"; never a guess."""
    tool = shutil.which("py-spy") or _beside_python("py-spy")
    if tool is None:
        return "stack: unknown (py-spy is not installed: the node extra installs it)"
    try:
        done = subprocess.run([tool, "dump", "--nonblocking", "--pid", str(pid)],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"stack: unknown (py-spy gave nothing within {timeout_s:.0f} s)"
    except OSError as exc:
        return f"stack: unknown (py-spy could not run: {exc})"
    if done.returncode != 0 or not done.stdout.strip():
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0]
        return f"stack: unknown (py-spy: {why})"
    return done.stdout.strip()


def _beside_python(name: str) -> str | None:
    import sys  # the interpreter's own bin directory (a virtual environment's scripts)
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else None


def torch_signals(log_paths: Mapping[int, str], limit: int = 8) -> list[str]:
    """Lines about timeouts and collectives torch wrote at the end of the ranks' output."""
    out: list[str] = []
    for rank, path in sorted(log_paths.items()):
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - _TAIL_BYTES))
                tail = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        out += [f"rank {rank}: {line.strip()[:300]}" for line in tail.splitlines()
                if TORCH_SIGNALS.search(line)]
    return out[-limit:]


@dataclass
class _Attempt:
    tracks: dict[int, RankTrack] = field(default_factory=dict)
    started: float = 0.0
    hung: bool = False


@dataclass
class ProcWatch:
    """Per live attempt, its ranks' tracks (in memory: a restarted adapter starts afresh)."""

    config: ProcessHangConfig = field(default_factory=lambda: config_from_env(os.environ))
    attempts: dict[tuple[str, int], _Attempt] = field(default_factory=dict)
    hung_on: dict[str, set[str]] = field(default_factory=dict)  # job -> nodes with HangInJob
    # one listing of /proc serves every attempt scanned in the same poll
    _children: tuple[float, dict[int, list[int]]] = (float("-inf"), {})

    def scan(self, job_id: str, attempt: int, ranks: Mapping[int, RankProc],
             checkpoint_dir: str, now: float) -> list[NodeHealthReported]:
        if not ranks:
            return []
        for key in [k for k in self.attempts if k[0] == job_id and k[1] < attempt]:
            del self.attempts[key]  # bounded: one attempt per job is remembered
        state = self.attempts.setdefault((job_id, attempt), _Attempt(started=now))
        if now - self._children[0] > CHILDREN_FRESH_S or now < self._children[0]:
            self._children = (now, children_map())
        children = self._children[1]
        out: list[NodeHealthReported] = []
        for rank, proc in ranks.items():
            found = sample(rank, proc, children)
            if found is not None:
                state.tracks[rank] = process_hangs.observe(state.tracks.get(rank), found, now,
                                                           self.config)
        tracks = [state.tracks[r] for r in sorted(state.tracks) if r in ranks]
        if job_id in self.hung_on and any(t.wrote_at > state.started for t in tracks):
            out += self._clear(job_id, attempt, now)
        if state.hung:
            return out
        active = max(state.started, checkpoint_at(checkpoint_dir))
        hang = process_hangs.judge(tracks, active, now, self.config)
        if hang is not None:
            state.hung = True
            out.append(self._report(job_id, attempt, hang, ranks, state.tracks, now))
        return out

    def _report(self, job_id: str, attempt: int, hang: Any, ranks: Mapping[int, RankProc],
                tracks: Mapping[int, RankTrack], now: float) -> NodeHealthReported:
        rank = hang.culprit if hang.culprit is not None else min(ranks)
        node = ranks[rank].node_id
        self.hung_on.setdefault(job_id, set()).add(node)
        track = tracks.get(rank)
        stack = python_stack(track.pid) if track is not None else "stack: unknown (no process)"
        signals = torch_signals({r: p.log_path for r, p in ranks.items()})
        details = {"job_id": job_id, "attempt": attempt, "culprit": hang.culprit,
                   "node": node, "seen_from": "processes",
                   "silent_s": round(hang.silent_s, 3), "threshold_s": round(hang.threshold_s, 3),
                   "ranks": {str(t.rank): [t.state, t.pid, round(process_hangs.cpu_rate(t), 3)]
                             for t in tracks.values()},
                   "stack": stack, "torch_signals": signals}
        first = stack.splitlines()[0] if stack.startswith("stack: unknown") else "stack dumped"
        reason = (f"job {job_id} attempt {attempt}: {hang.evidence}; on node {node}; {first}"
                  + (f"; torch: {signals[-1]}" if signals else ""))
        return _report(node, True, reason, details, now)

    def _clear(self, job_id: str, attempt: int, now: float) -> list[NodeHealthReported]:
        """A later attempt writes output: the hang conditions left on nodes are lifted."""
        if self.attempts.get((job_id, attempt), _Attempt()).hung:
            return []
        return [_report(node, False, f"job {job_id} progresses again (attempt {attempt})", {},
                        now) for node in sorted(self.hung_on.pop(job_id, set()))]

    def forget(self, job_id: str, attempt: int) -> None:
        self.attempts.pop((job_id, attempt), None)


def _report(node_id: str, true: bool, reason: str, details: dict[str, Any], now: float
            ) -> NodeHealthReported:
    cond = {"type": ConditionType.HANG_IN_JOB.value, "status": "true" if true else "false",
            "reason": reason, "since": now, "details": details}
    return NodeHealthReported(node_id=node_id, observed_at=now, conditions=(cond,),
                              source=JOB_PROGRESS_SOURCE)
