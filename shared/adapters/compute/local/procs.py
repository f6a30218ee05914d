"""Worker processes on this machine: spawn a rank's launcher, tell whether it runs, signal it.

A rank is ``worker_launcher`` leading its own session and process group (so it outlives the
CLI process that started it); the launcher relays SIGTERM to its group once and leaves the
rank's exit code in an exit file. Pids get reused, so a launcher is identified by pid *and*
start time (``/proc/<pid>/stat``, field 22: https://man7.org/linux/man-pages/man5/proc.5.html).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path

from shared.adapters.compute.job_env import LAUNCHER_ENV, write_env_file
from shared.adapters.compute.protocol import EXIT_KILLED, LAUNCHER, read_exit_file

TMP_ROOT = Path("/tmp")  # where a rank's own TMPDIR is made when it is not sandboxed


def rank_tmp(exit_file: Path | str) -> Path:
    """A rank's own TMPDIR: named by its exit file, so the attempt's end finds it to remove
    it, and short (a program's Unix sockets there must fit in 108 bytes)."""
    tag = hashlib.sha256(str(Path(exit_file).absolute()).encode()).hexdigest()[:20]
    return TMP_ROOT / f"mtc-rank-{tag}"


def with_tmp(env: Mapping[str, str], exit_file: Path, sandboxed: bool) -> dict[str, str]:
    """``env`` with a TMPDIR of the rank's own (unless the job set one), so torch's compile
    caches and torchrun's files do not outlive the job on the node: a sandboxed rank's /tmp
    is already a tmpfs of its own (``sandbox.SCRATCH``); any other gets ``rank_tmp``, made
    here, removed when its attempt ends (``remove_rank_tmp``)."""
    out = dict(env)
    if out.get("TMPDIR"):
        return out
    if sandboxed:
        out["TMPDIR"] = "/tmp"
        return out
    path = rank_tmp(exit_file)
    shutil.rmtree(path, ignore_errors=True)  # an earlier launch's of this same rank
    path.mkdir(mode=0o700, parents=True)
    out["TMPDIR"] = str(path)
    return out


def remove_rank_tmp(exit_file: Path | str) -> None:
    shutil.rmtree(rank_tmp(exit_file), ignore_errors=True)


def spawn_launcher(python: str, exit_file: Path, command: Sequence[str], env: Mapping[str, str],
                   log: Path, sandbox: Path | None = None) -> int:
    """Start ``command`` under the launcher in a new session, output appended to ``log``;
    ``sandbox``: the plan file the command runs in (``sandbox``). ``env`` is the command's
    only (with a TMPDIR of its own: ``with_tmp``): it goes to the launcher in a file beside
    the exit file, and the launcher itself runs isolated (``-I``) with a fixed environment
    (``job_env``)."""
    env = with_tmp(env, exit_file, sandbox is not None)
    env_file = write_env_file(exit_file.with_name(exit_file.name + ".env"), env)
    argv = [python, "-I", str(LAUNCHER), "--exit-file", str(exit_file),
            "--env-file", str(env_file),
            *(["--sandbox", str(sandbox)] if sandbox is not None else []), "--", *command]
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        return os.posix_spawn(
            python,
            argv,
            dict(LAUNCHER_ENV),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
        )
    finally:
        os.close(fd)


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, pgrp, start time in clock ticks) from /proc, or None if there is no such pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[2]), int(fields[19])


def _has_proc() -> bool:
    return Path("/proc/self/stat").exists()


def start_ticks(pid: int) -> int:
    stat = _proc_stat(pid)
    return stat[2] if stat else 0


def _launcher_alive(pid: int, start_ticks: int) -> bool:
    """Our launcher still runs: same pid *and* same start time (pids get reused); a zombie
    (exited, not yet reaped by its parent) counts as gone."""
    if _has_proc():
        stat = _proc_stat(pid)
        return stat is not None and stat[2] == start_ticks and stat[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_alive(pgid: int) -> bool:
    """Some process other than a zombie is still in the process group."""
    if not _has_proc():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _proc_stat(int(entry.name))
            if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
                return True
    return False

def exit_code(worker: sqlite3.Row) -> int | None:
    """The rank's exit code once it is over, else None. The launcher leads its own group, so
    the rank is over when the exit file exists, or when the launcher is gone without one:
    then nothing waits for or records the command, so what is left of the group is SIGKILLed
    (no orphan trains on unobserved) and the rank counts as killed once the group is gone."""
    path = Path(worker["exit_file"])
    code = read_exit_file(path)
    if code is not None:
        return code
    if _launcher_alive(worker["pid"], worker["start_ticks"]):
        return None
    code = read_exit_file(path)  # it may have written the file just before going
    if code is not None:
        return code
    if _group_alive(worker["pid"]):
        end_group(worker)
        if _group_alive(worker["pid"]):
            return None  # dying: the next poll reports it
    return EXIT_KILLED


def end_group(worker: sqlite3.Row) -> None:
    """SIGKILL whatever is left in the rank's process group (a rank's leftovers once its
    launcher is gone). The group id cannot have been reused while the group still exists."""
    if _group_alive(worker["pid"]):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker["pid"], signal.SIGKILL)


def rank_running(worker: sqlite3.Row) -> bool:
    return _launcher_alive(worker["pid"], worker["start_ticks"]) or _group_alive(worker["pid"])


def signal_rank(worker: sqlite3.Row, sig: signal.Signals) -> None:
    """SIGTERM goes to the launcher, which relays it to its group once; SIGKILL cannot be
    relayed, so it goes to the group itself. A launcher already gone is left alone unless
    something of its group is still running."""
    pid = worker["pid"]
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if sig == signal.SIGTERM and _launcher_alive(pid, worker["start_ticks"]):
            os.kill(pid, sig)
        elif rank_running(worker):
            os.killpg(pid, sig)



def reap(children: set[int]) -> None:
    """Collect our own exited launchers so they do not linger as zombies. Safe: a pid we
    spawned cannot be reused until we reap it."""
    for pid in list(children):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            children.discard(pid)
