"""Run one worker and leave its exit code in a file.

    python -I worker_launcher.py --exit-file PATH [--env-file ENV] -- CMD [ARG...]

Workers outlive the CLI process that started them, so nobody is left to ``wait()`` for them:
this launcher is the parent that waits. It starts CMD, relays SIGTERM/SIGINT, and when CMD
ends writes its exit code (decimal, one line) to PATH atomically (temp file + ``os.replace``)
and exits with the same code. A child killed by signal N is reported as 128+N (137 for
SIGKILL, 143 for SIGTERM), as shells do; a command that cannot be started is 127 (not found)
or 126 (not executable, or our set-up failed); no exit file: the launcher was killed. These
are the worker protocol's codes (``mtc_program.protocol``), restated because this file
imports nothing (a test checks they agree). A start that failed leaves ``PATH.launch`` (JSON
``{"by", "reason"}``) first: ``by`` is ``command`` when exec refused CMD (the job's failure),
``platform`` when our set-up failed (the sandbox, a bind, a cgroup, the fork): no program
ran, so neither the job nor its nodes are to blame (``launch_evidence``).

Signals: when the launcher leads its own process group (LocalCompute starts it with
``start_new_session=True``), a SIGTERM/SIGINT sent to it is relayed once to the whole group,
so CMD and all it started get it exactly once. Signal the launcher's pid, not the group (a
group signal reaches CMD twice); a launcher not leading its group signals only CMD.

No orphans: on Linux CMD is started with ``PR_SET_PDEATHSIG`` = SIGKILL, so if the launcher
itself is killed (SIGKILL cannot be relayed) CMD dies with it instead of training on alone,
unobserved; whatever CMD started in the group is killed by the adapter when it finds the
launcher gone without an exit file (``local_procs.exit_code``).

Sandbox (``--sandbox PLAN.json``, written by the local adapter when the server runs as
root: ``local/sandbox.py`` says what and why): the child enters a mount namespace of its
own, gets tmpfs over what it must not see and its own paths bound back, then drops to the
plan's uid and gid before exec; the launcher itself stays outside, as root, to wait and to
write the exit file. PR_SET_PDEATHSIG is set after the uid change (a change clears it).

A full disk: when CMD exits non-zero the launcher reads, there and then, the file systems
(``statvfs``) of the job's directories (``AIP_CHECKPOINT_DIR``, ``AIP_MODEL_DIR``,
``AIP_TENSORBOARD_LOG_DIR``; the sandbox plan's ``dirs``, their host paths, where the job's
are ``gs://`` URIs), its log and the exit file, and whether its log ends with ``No
space left on device``, into ``PATH.disk`` (JSON) before the exit file: the adapter's
evidence that the disk, not the program, ended the rank (``disk_evidence``). A write refused
for want of space (ENOSPC, EDQUOT) is tried again, backing off to 2 s, for up to
``WRITE_PATIENCE_S``: the rank reads as running until then, not as killed.

The job's environment (``--env-file``: NUL-separated ``NAME=value``, as ``env -0`` prints
it; removed once read) is CMD's only: the launcher runs with a fixed environment under
``python -I`` (``job_env``): it may be root, and a job's ``PYTHONPATH`` or ``LD_PRELOAD``
must never reach a root interpreter. Without ``--env-file``, CMD gets the launcher's own.

Limits (the plan's ``limits``: a node's processes and memory, ``job_limits``): the child
joins a cgroup of its job and node (``<cgroup root>/mtc/<deployment>/<job>-<node>``, made by
the launcher: v2's ``pids.max`` and ``memory.max``, or v1's pids and memory hierarchies)
before exec, else ``RLIMIT_NPROC`` bounds the job's own uid; and a ``/proc`` of its own
(``hidepid=2``: no job sees another's command lines). The cgroup goes with it.

Standard library only: it runs by file path with any Python, without the package."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import resource
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

EXIT_NOT_FOUND = 127
EXIT_NOT_EXECUTABLE = 126
EXIT_PREEMPTED = 75
RELAYED = (signal.SIGTERM, signal.SIGINT)
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
CLONE_NEWNS = 0x00020000  # <linux/sched.h>
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 1, 2, 4, 32  # <linux/mount.h>
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MS_NOEXEC = 8
CGROUP_FS = "/sys/fs/cgroup"
DISK_SUFFIX = ".disk"  # PATH.disk: the file systems at a non-zero exit (disk_evidence.SUFFIX)
LAUNCH_SUFFIX = ".launch"  # PATH.launch: whose failure a start that did not happen was
COMMAND_ERRNOS = frozenset({errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR,
                            errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG})
JOB_DIRS = ("AIP_CHECKPOINT_DIR", "AIP_MODEL_DIR", "AIP_TENSORBOARD_LOG_DIR")  # the protocol's
TERMINATION_LOG = "MTC_TERMINATION_LOG"  # the protocol's: where the program says why it failed
ENOSPC_SAID = (b"No space left on device", b"[Errno 28]", b"ENOSPC")
LOG_TAIL_BYTES = 8192
WRITE_PATIENCE_S = 24 * 3600.0  # a full disk: how long the exit file is tried again
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def _mount(libc: ctypes.CDLL, src: str | None, dst: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:
    def enc(v: str | None) -> bytes | None:
        return v.encode() if v is not None else None

    if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} on {dst}: {os.strerror(err)}")


_Bind = tuple[int, str, bool, bool]  # (source fd, destination, read-write, a directory)


def apply_sandbox(plan: dict[str, object], libc: ctypes.CDLL) -> None:
    """In the child, before exec: a private mount namespace, tmpfs over ``covers``, the
    ``binds`` back (sources opened first: a cover may hide them), then the plan's uid.
    The directories a tmpfs needs on the way to a bind are made 0711 (traversable only)."""
    if libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)}")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE)  # nothing leaks back to the host
    cwd = os.getcwd()
    binds: list[_Bind] = []
    for src, dst, write, is_dir, *optional in plan["binds"]:  # type: ignore[attr-defined]
        try:
            fd = os.open(str(src), os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            if optional and optional[0]:
                continue  # a node's memory wiped since the plan: the rank starts without it
            raise
        binds.append((fd, str(dst), bool(write), bool(is_dir)))
    # by depth, a tmpfs before a bind at the same depth: a bind re-exposes what is below it
    # (a hidden directory inside bound code), so a deeper cover comes after it; the private
    # temp directories are tmpfs too, the job's own (1777, like the host's)
    mounts: list[tuple[int, int, str, str, _Bind | None]] = [
        (str(c).count("/"), 0, str(c), "mode=0711,size=1m", None)
        for c in plan["covers"]]  # type: ignore[attr-defined]
    mounts += [(str(t).count("/"), 0, str(t), "mode=1777", None)
               for t in plan.get("scratch", ()) if os.path.isdir(str(t))]  # type: ignore[attr-defined]
    mounts += [(b[1].count("/"), 1, b[1], "", b) for b in binds]
    for _, _, where, data, bind in sorted(mounts, key=lambda m: (m[0], m[1])):
        if bind is None:
            os.makedirs(where, mode=0o711, exist_ok=True)
            _mount(libc, "tmpfs", where, "tmpfs", MS_NOSUID | MS_NODEV, data)
            continue
        fd, dst, write, is_dir = bind
        if is_dir:
            os.makedirs(dst, mode=0o711, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), mode=0o711, exist_ok=True)
            if not os.path.exists(dst):
                os.close(os.open(dst, os.O_CREAT | os.O_WRONLY, 0o600))
        _mount(libc, f"/proc/self/fd/{fd}", dst, None, MS_BIND | MS_REC)
        if not write:
            _mount(libc, None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_REC)
        os.close(fd)
    if os.path.isdir("/proc"):  # a /proc of its own: other uids' processes are not there
        _mount(libc, "proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    try:
        os.chdir(cwd)  # the namespace's view of it (a covered one is gone)
    except OSError:
        os.chdir("/")
    os.setgroups([])
    os.setgid(int(plan["gid"]))  # type: ignore[call-overload]
    os.setuid(int(plan["uid"]))  # type: ignore[call-overload]


def make_cgroups(limits: dict[str, object], root: str = CGROUP_FS) -> tuple[list[str], bool]:
    """The job's cgroup on this node, made with its limits: the directories the child joins
    and whether one bounds its processes. Nothing (an empty list) where no cgroup can be
    made here (not root, no controller, a read-only cgroup file system)."""
    name = str(limits.get("cgroup") or "")
    processes, memory = int(limits.get("processes") or 0), int(limits.get("memory") or 0)  # type: ignore[call-overload]
    if not name or ".." in name.split("/"):
        return [], False
    made: list[str] = []
    try:
        if os.path.exists(os.path.join(root, "cgroup.controllers")) and not os.path.isdir(
                os.path.join(root, "pids")):  # v2: one hierarchy, controllers enabled per level
            where = root
            for part in name.split("/"):
                with open(os.path.join(where, "cgroup.subtree_control"), "w") as f:
                    f.write("+pids +memory")
                where = os.path.join(where, part)
                os.makedirs(where, exist_ok=True)
            _write(os.path.join(where, "pids.max"), processes)
            _write(os.path.join(where, "memory.max"), memory)
            return [where], processes > 0
        for controller, knob, value in (("pids", "pids.max", processes),
                                        ("memory", "memory.limit_in_bytes", memory)):
            where = os.path.join(root, controller, name)
            if os.path.isdir(os.path.join(root, controller)) and value > 0:
                os.makedirs(where, exist_ok=True)
                _write(os.path.join(where, knob), value)
                made.append(where)
    except OSError as exc:
        _say(f"worker_launcher: no cgroup for the job's limits ({exc}); rlimits instead")
        return [], False
    return made, any("/pids/" in m for m in made)


def _write(path: str, value: int) -> None:
    if value > 0:
        with open(path, "w") as f:
            f.write(str(value))


def remove_cgroups(groups: Sequence[str]) -> None:
    """The job's cgroups, once empty (a rank of the same node still in one keeps it)."""
    for where in groups:
        with contextlib.suppress(OSError):
            os.rmdir(where)


def _child_hook(sandbox: dict[str, object] | None, groups: Sequence[str] = (),
                nproc: int = 0) -> Callable[[], None] | None:
    """The child's set-up before exec: its cgroups and process limit, the sandbox (if any),
    then the parent-death signal."""
    deathsig = _pdeathsig_hook()
    if sandbox is None:
        return deathsig
    libc = ctypes.CDLL(None, use_errno=True)

    def hook() -> None:
        try:
            for where in groups:
                with open(os.path.join(where, "cgroup.procs"), "w") as f:
                    f.write("0")  # this process, and all it starts
            if nproc > 0:  # per uid: the job's own
                resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
            apply_sandbox(sandbox, libc)
        except BaseException as exc:  # Popen only says "Exception occurred in preexec_fn"
            os.write(2, f"worker_launcher: sandbox: {exc}\n".encode())
            raise
        if deathsig is not None:
            deathsig()

    return hook


def _pdeathsig_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` (run in the child before exec) that makes the kernel SIGKILL the child
    when the launcher dies (at once if it died already); None without prctl (not Linux: the
    adapter's group kill is left). libc is loaded here, in the parent: the hook only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


def write_exit_file(path: str, code: int | str) -> None:
    """Atomically leave ``code`` (or any text) in ``path``: readers see no file or all of it."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".exit.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{code}\n" if isinstance(code, int) else code)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _space(path: str) -> tuple[int, int, int] | None:
    """(free, total, device) of the file system holding ``path`` or its nearest existing
    parent; None when there is none to read."""
    while True:
        try:
            st = os.statvfs(path)
            return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize, os.stat(path).st_dev
        except (FileNotFoundError, NotADirectoryError):
            parent = os.path.dirname(path.rstrip("/")) or "/"
            if parent == path:
                return None
            path = parent
        except OSError:
            return None


def _log_path() -> str | None:
    """The rank's log (our stdout) when it is a regular file."""
    try:
        if stat.S_ISREG(os.fstat(1).st_mode):
            return os.readlink("/proc/self/fd/1")
    except OSError:
        pass
    return None


def _log_says_enospc(log: str | None) -> bool:
    if log is None:
        return False
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - LOG_TAIL_BYTES))
            tail = f.read()
    except OSError:
        return False
    return any(mark in tail for mark in ENOSPC_SAID)


def disk_readings(exit_file: str, env: Mapping[str, str],
                  dirs: Sequence[str] = ()) -> dict[str, object]:
    """What the disks looked like as the rank exited: each file system of the job's
    directories (``dirs``, else as named in its environment ``env``), its log and the exit
    file once (``[path, free, total]``), and whether the log's end says ENOSPC."""
    log = _log_path()
    paths = [*(dirs or map(env.get, JOB_DIRS)), log, os.path.dirname(os.path.abspath(exit_file))]
    space: list[list[object]] = []
    seen: set[int] = set()
    for path in filter(None, paths):
        found = _space(str(path))
        if found is not None and found[2] not in seen:
            seen.add(found[2])
            space.append([str(path), found[0], found[1]])
    return {"space": space, "enospc": _log_says_enospc(log), "at": time.time()}


def launch_fault(exc: BaseException, command: Sequence[str]) -> dict[str, object]:
    """Whose failure a start that raised ``exc`` was (the module's ``PATH.launch``): exec
    refusing ``command[0]`` is the command's; a failure before exec is the platform's (the
    child's set-up raises SubprocessError; an OSError naming no command is ours too)."""
    by = "command" if isinstance(exc, OSError) and exc.errno in COMMAND_ERRNOS \
        and exc.filename == command[0] else "platform"
    return {"by": by, "reason": f"cannot start {command[0]!r}: {exc}"}


def write_disk_file(exit_file: str, readings: dict[str, object], suffix: str = DISK_SUFFIX) -> None:
    """``readings`` at ``exit_file + suffix``, atomically (as the exit file)."""
    write_exit_file(exit_file + suffix, json.dumps(readings))


def patiently(write: Callable[[], None], patience_s: float = WRITE_PATIENCE_S) -> None:
    """``write()``, tried again while the disk has no room for it (up to ``patience_s``)."""
    deadline, delay = time.monotonic() + patience_s, 0.1
    while True:
        try:
            write()
            return
        except OSError as exc:
            if exc.errno not in FULL_ERRNOS or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(2.0, delay * 2)


def exit_code_of(returncode: int) -> int:
    """Popen's returncode (negative for a signal) as a shell-style exit code."""
    return 128 - returncode if returncode < 0 else returncode


class _Relay:
    """Forwards SIGTERM/SIGINT to the child, or to the whole group when we lead it.

    A signal that arrives before the child exists is remembered and sent once it does."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.pending: list[int] = []
        self.leads_group = os.getpgrp() == os.getpid()
        self.asked_to_stop = False

    def install(self) -> None:
        for sig in RELAYED:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.asked_to_stop = True
        if self.child is None:
            self.pending.append(signum)
        else:
            self._send(signum)

    def _send(self, signum: int) -> None:
        assert self.child is not None
        if self.child.poll() is not None:
            return
        if self.leads_group:
            # Ignore it ourselves while it goes to the group, then handle it again.
            signal.signal(signum, signal.SIG_IGN)
            try:
                os.killpg(os.getpgrp(), signum)
            finally:
                signal.signal(signum, self._handle)
        else:
            with contextlib.suppress(ProcessLookupError):
                self.child.send_signal(signum)

    def started(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        for signum in self.pending:
            self._send(signum)
        self.pending.clear()


def read_env_file(path: str) -> dict[str, str]:
    """The job's environment from ``path`` (``env -0``'s format), which is then removed: it
    is the job's, and only its child may hold it."""
    with open(path, "rb") as f:
        data = f.read()
    with contextlib.suppress(OSError):
        os.unlink(path)
    env: dict[str, str] = {}
    for entry in data.split(b"\0"):
        name, sep, value = entry.decode("utf-8", "surrogateescape").partition("=")
        if sep and name:
            env[name] = value
    return env


def run(exit_file: str, command: Sequence[str], *, zero_after_stop: bool = False,
        sandbox: dict[str, object] | None = None, child_env: Mapping[str, str] | None = None) -> int:
    """Run ``command``; its exit code goes to ``exit_file`` and is returned. With
    ``zero_after_stop``, a command asked to stop (SIGTERM/SIGINT) returns 0 here whatever its
    code (the file keeps the real one): under ``srun --kill-on-bad-exit`` a rank that
    checkpointed and left quickly must not kill the ranks still saving theirs, while one
    failing on its own still ends the gang. ``sandbox``: the plan the child runs in (see the
    module); ``child_env``: the command's environment (default: ours)."""
    relay = _Relay()
    relay.install()  # before the child exists: a signal during start-up is kept, not lost
    env = {**(os.environ if child_env is None else child_env),
           TERMINATION_LOG: f"{exit_file}.msg"}  # why it failed
    groups: list[str] = []
    fault: dict[str, object] | None = None  # CMD did not start: whose failure (PATH.launch)
    try:
        for stale in (f"{exit_file}.msg", exit_file + DISK_SUFFIX, exit_file + LAUNCH_SUFFIX):
            with contextlib.suppress(OSError):
                os.unlink(stale)
        if sandbox is not None:  # the job's own file, for it to write
            fd = os.open(f"{exit_file}.msg", os.O_CREAT | os.O_WRONLY, 0o600)
            os.fchown(fd, int(sandbox["uid"]), int(sandbox["gid"]))  # type: ignore[call-overload]
            os.close(fd)
            env.update(HOME=str(sandbox["home"]), USER=f"mtc-{sandbox['uid']}",
                       LOGNAME=f"mtc-{sandbox['uid']}")
        limits = dict(sandbox.get("limits") or {}) if sandbox is not None else {}  # type: ignore[call-overload]
        groups, bounded = make_cgroups(limits) if limits else ([], False)
        nproc = 0 if bounded else int(limits.get("processes") or 0) * int(
            env.get("WORLD_SIZE") or 1)  # the uid's processes: every rank of the job here
        child = subprocess.Popen(list(command), preexec_fn=_child_hook(sandbox, groups, nproc),
                                 env=env)
    except (OSError, subprocess.SubprocessError) as exc:  # the latter: the sandbox's set-up
        fault = launch_fault(exc, command)
        _say(f"worker_launcher: {fault['reason']} ({fault['by']})")
        code = EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_NOT_EXECUTABLE
    else:
        relay.started(child)
        code = exit_code_of(child.wait())
    remove_cgroups(groups)
    with contextlib.suppress(OSError):  # a log on a full disk
        sys.stderr.flush()
    if code not in (0, EXIT_PREEMPTED):  # read now: the disk may have room again soon
        readings = disk_readings(exit_file, env, (sandbox or {}).get("dirs") or ())  # type: ignore[arg-type]
        with contextlib.suppress(OSError):  # evidence is best effort; the exit file is not
            if fault is not None:
                patiently(lambda: write_disk_file(exit_file, fault, LAUNCH_SUFFIX))
            patiently(lambda: write_disk_file(exit_file, readings))
    patiently(lambda: write_exit_file(exit_file, code))
    return 0 if zero_after_stop and relay.asked_to_stop else code


def _say(line: str) -> None:
    with contextlib.suppress(OSError):  # a log on a full disk takes nothing
        print(line, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="worker_launcher", description="Run CMD, relay signals, record its exit code."
    )
    parser.add_argument("--exit-file", required=True, help="where to write the exit code")
    parser.add_argument("--zero-after-stop", action="store_true",
                        help="exit 0 once asked to stop (the exit file keeps the real code)")
    parser.add_argument("--sandbox", help="run CMD in this sandbox plan (JSON file)")
    parser.add_argument("--env-file", help="CMD's environment (env -0's format; removed once read)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    args = parser.parse_args(argv)
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        parser.error("no command given after --")
    sandbox = None
    if args.sandbox:
        with open(args.sandbox) as f:
            sandbox = json.load(f)
    child_env = read_env_file(args.env_file) if args.env_file else None
    return run(args.exit_file, command, zero_after_stop=args.zero_after_stop, sandbox=sandbox,
               child_env=child_env)


if __name__ == "__main__":
    sys.exit(main())
