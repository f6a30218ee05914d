"""Jobs never run as root: the plan of a rank's sandbox when the server runs as root.

Mechanism: a private **mount namespace** (``unshare(CLONE_NEWNS)``) and a dropped uid, set up
by ``worker_launcher`` in the rank's child between fork and exec. Chosen because it is what
this machine has: there is no bubblewrap, and ``systemd-run`` needs a running systemd (there
is none); ``unshare`` is in every Linux kernel mtc targets and needs no helper binary.

Inside the namespace:

* a tmpfs (mode 0711: traversable, not listable) covers the state directory (the databases and
  ``api-tokens.json``), the output root (other jobs' outputs), root's home, and every ancestor
  of a path the job needs that others may not traverse (a 0700 directory on the way);
* the job's own paths are bound back at their real paths: its checkpoint, model and log
  directories, its checkpoint-tier directories, its termination-log file and its home (read
  and write); the interpreter, the server's ``PYTHONPATH`` and the absolute paths its
  command names outside what is hidden (read only); pyenv's runtime cache (read-write, the
  uid's own: ``<runtimes>/by-uid/<uid>`` bound at ``<runtimes>``);
* the output root's ``gcs/`` tree is also at ``/gcs/`` (its own ``gs://`` outputs and the
  package files its command names in the buckets its spec names, nothing else: another
  project's bucket is never bound), as Vertex's training containers see Cloud Storage: the
  job's ``AIP_*_DIR`` name them as Vertex does (``gs://B/P/model/``, written at
  ``/gcs/B/P/model/``; ``LocalCompute`` and ``protocol.gcs_uri``), and the plan keeps their
  host paths (``dirs``) for the launcher, which stays outside the namespace;
* the cluster's storage (``MTC_STORAGE_MOUNTS``, ``shared.domain.cluster_storage``) is at the
  paths the job sees: its Filestore share at ``/home``, each Lustre instance at its mount
  point, each bucket at ``/gcs/<bucket>``; each a directory of the output root, shared by the
  cluster's jobs (mode 1777: every job's uid writes, none removes another's files);
* ``/tmp``, ``/var/tmp`` and ``/dev/shm`` are the rank's own (a tmpfs each, gone with its
  namespace): nothing one job leaves there is seen by another, or by the launcher;
* the rank runs as a uid of its own: a configured user (``run_as``), else a uid allocated
  per job (``allocate_uid``) from a registry shared by every deployment on the host
  (``HOST_UIDS``), never reused and needing no passwd entry, so ranks of different jobs,
  of this deployment or another, cannot signal or read each other's processes
  (``/proc/<pid>/environ``) either.

Pure planning here (``plan``); ``prepare`` creates and chowns the paths (as root); the
launcher applies the plan (``worker_launcher.apply_sandbox``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pwd
import sqlite3
import stat
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mtc_program import protocol as p
from shared.adapters.compute.protocol import progress_path, safe_name
from shared.domain.cluster_storage import GCS, HOME, STORAGE_MOUNTS, mount_path
from shared.domain.errors import ValidationError
from shared.ports import WorkerSpec

GCS_MOUNT = p.GCS_MOUNT  # where Vertex's containers see Cloud Storage (Cloud Storage FUSE)
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")  # a private tmpfs each, in every rank's namespace
FIRST_UID = 1_500_000_000  # far above login users and the usual subuid ranges (100000+)
HOST_UIDS = Path("/var/lib/mtc/sandbox-uids.sqlite")  # every deployment's uids on this host
SCHEMA = """
CREATE TABLE IF NOT EXISTS sandbox_uids (
    job_id TEXT PRIMARY KEY, uid INTEGER NOT NULL UNIQUE);
"""
HOST_SCHEMA = "CREATE TABLE IF NOT EXISTS uids (uid INTEGER PRIMARY KEY, owner TEXT NOT NULL)"


@dataclass(frozen=True)
class Bind:
    """``src`` visible at ``dst`` in the namespace; ``write``: read-write, else read-only;
    ``optional``: a source that is gone when the rank starts is left out, not fatal (a node's
    memory, which its repair may wipe between the plan and the start)."""

    src: str
    dst: str
    write: bool
    is_dir: bool = True
    optional: bool = False


@dataclass(frozen=True)
class SandboxPlan:
    uid: int
    gid: int
    covers: tuple[str, ...]  # tmpfs over each, before the binds
    binds: tuple[Bind, ...]
    home: str
    owned: tuple[str, ...] = field(default=())  # paths chowned to uid before the start
    scratch: tuple[str, ...] = SCRATCH  # the rank's own temp directories
    # its node's (processes, memory bytes, cgroup name): worker_launcher.make_cgroups
    limits: tuple[int, int, str] = (0, 0, "")
    # the host's paths of the job's AIP_*_DIR (its environment may name them gs://): where
    # the launcher, outside the namespace, reads their disks at a failed exit
    dirs: tuple[str, ...] = ()
    shared: tuple[str, ...] = ()  # the cluster's storage: made 1777, never chowned

    def to_json(self) -> str:
        processes, memory, cgroup = self.limits
        return json.dumps({"uid": self.uid, "gid": self.gid, "covers": list(self.covers),
                           "home": self.home, "scratch": list(self.scratch),
                           "dirs": list(self.dirs),
                           "limits": {"processes": processes, "memory": memory,
                                      "cgroup": cgroup},
                           "binds": [[b.src, b.dst, b.write, b.is_dir, b.optional]
                                     for b in self.binds]})


def enabled(setting: bool | None) -> bool:
    """On when asked, or by default when this process is root (``MTC_SANDBOX=off`` turns the
    default off, for a root test run of code that is not about the sandbox)."""
    if setting is not None:
        return setting
    return os.geteuid() == 0 and os.environ.get("MTC_SANDBOX", "").lower() != "off"


def user_ids(run_as: str) -> tuple[int, int]:
    """A configured user (a name or a number) as (uid, gid); root is refused."""
    entry = pwd.getpwuid(int(run_as)) if run_as.isdigit() else pwd.getpwnam(run_as)
    if entry.pw_uid == 0:
        raise ValueError(f"run_as {run_as!r} is root: jobs never run as root")
    return entry.pw_uid, entry.pw_gid


def allocate_uid(db: sqlite3.Connection, job_id: str, registry: Path = HOST_UIDS) -> int:
    """The job's own uid: the same for every attempt and rank, a new one per job, and never
    one another deployment on this host gave out (``registry``, shared by all of them)."""
    row = db.execute("SELECT uid FROM sandbox_uids WHERE job_id = ?", (job_id,)).fetchone()
    if row is not None:
        return int(row[0])
    mine = db.execute("SELECT MAX(uid) FROM sandbox_uids").fetchone()[0]
    uid = _host_uid(registry, job_id, 0 if mine is None else int(mine))
    db.execute("INSERT INTO sandbox_uids (job_id, uid) VALUES (?, ?)", (job_id, uid))
    return uid


def _host_uid(registry: Path, owner: str, above: int) -> int:
    """The next uid of the host's registry (and above ``above``: this deployment's uids
    from before it had one), taken under the registry's write lock."""
    registry.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    host = sqlite3.connect(registry, timeout=30.0, isolation_level=None)
    try:
        host.execute(HOST_SCHEMA)
        host.execute("BEGIN IMMEDIATE")
        top = host.execute("SELECT MAX(uid) FROM uids").fetchone()[0]
        uid = max(FIRST_UID, above + 1, 0 if top is None else int(top) + 1)
        host.execute("INSERT INTO uids (uid, owner) VALUES (?, ?)", (uid, owner))
        host.execute("COMMIT")
    finally:
        host.close()
    os.chmod(registry, 0o600)
    return uid


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _closed(path: str) -> bool:
    """Others cannot traverse ``path`` (no o+x): it must be covered to reach below it."""
    try:
        return not stat.S_IMODE(os.stat(path).st_mode) & stat.S_IXOTH
    except OSError:
        return False


# mtc's own code (the directory holding ``shared``: a checkout, or site-packages), which the
# interpreter imports from (an editable install's .pth points here); with the server's own
# directory (a job's relative command resolves there), bound read-only for the job
CODE_ROOT = str(Path(__file__).resolve().parents[4])


def covers_for(hidden: Iterable[str], targets: Iterable[str]) -> tuple[str, ...]:
    """The tmpfs mounts: the hidden paths and each closed ancestor of a target, without those
    already under another (a tmpfs hides what is below it anyway)."""
    wanted = {os.path.abspath(h) for h in hidden}
    for target in targets:
        parts = Path(target).parents
        wanted.update(str(p) for p in parts if str(p) != "/" and _closed(str(p)))
    ordered = sorted(wanted, key=lambda p: (p.count("/"), p))
    kept: list[str] = []
    for path in ordered:
        if not any(_inside(path, k) for k in kept):
            kept.append(path)
    # a hidden path inside a directory that is bound back (mtc's own code, the server's
    # directory) is covered again after that bind (the launcher mounts by depth)
    targets = [os.path.abspath(t) for t in targets]
    kept += [h for h in ordered if h not in kept and h in {os.path.abspath(x) for x in hidden}
             and any(_inside(h, t) and h != t for t in targets)]
    return tuple(kept)


def interpreter_paths(python: str) -> list[str]:
    """What the worker's Python needs to start: its real installation and this one's."""
    real = os.path.realpath(python)
    paths = {os.path.dirname(os.path.dirname(real)), os.path.realpath(sys.base_prefix),
             os.path.realpath(sys.prefix), os.path.dirname(python)}
    return sorted(p for p in paths if p and p != "/")


def command_paths(command: Sequence[str], hidden: Sequence[str], runtimes: str | None,
                  gcs_root: str | None, buckets: Sequence[str] = ()
                  ) -> tuple[list[str], list[str]]:
    """(read-only, read-write) paths a command names: absolute paths that exist, but nothing
    in a hidden directory (a command is the tenant's: naming the state directory must not
    bind it), except pyenv's runtime cache (``--cache``, read-write) and package files in the
    ``gs://`` tree (``--package``, read-only) in one of ``buckets``, the job's own (the
    command cannot name another project's bucket into its job). A package is bound at its
    real path: a symlink planted in a job's own bucket cannot reach outside it."""
    ro: list[str] = []
    rw: list[str] = []
    own = [os.path.realpath(os.path.join(gcs_root, b)) for b in buckets
           if gcs_root and b and b not in (".", "..") and "/" not in b]
    for i, arg in enumerate(command):
        flag = command[i - 1] if i else ""
        if flag == "--cache" and runtimes and os.path.abspath(arg) == runtimes:
            rw.append(runtimes)  # (pyenv makes it: it need not exist yet)
            continue
        if not arg.startswith("/") or not os.path.exists(arg):
            continue
        arg = os.path.abspath(arg)
        if flag == "--package" and gcs_root and _inside(arg, gcs_root):
            real = os.path.realpath(arg)
            if os.path.isfile(real) and any(_inside(real, b) and real != b for b in own):
                ro.append(real)
        elif not any(_inside(arg, h) for h in hidden):
            ro.append(arg)
    return ro, rw


def storage_mounts(env: Mapping[str, str], output_root: str | None) -> dict[str, str]:
    """The cluster's storage from a rank's ``MTC_STORAGE_MOUNTS`` (the service's own
    variable): each path the job sees -> its directory. Only a directory inside the output
    root, at ``/home``, ``/gcs/<bucket>`` or a Lustre mount point, is taken: a value the
    service did not write binds nothing."""
    raw = env.get(STORAGE_MOUNTS)
    if not raw or not output_root:
        return {}
    try:
        asked = json.loads(raw)
    except ValueError:
        return {}
    root = os.path.realpath(output_root)
    out: dict[str, str] = {}
    for dst, src in (asked.items() if isinstance(asked, dict) else ()):
        if not isinstance(dst, str) or not isinstance(src, str):
            continue
        real = os.path.realpath(src)
        if _storage_path(dst) and _inside(real, root) and real != root:
            out[dst] = real
    return out


def _storage_path(dst: str) -> bool:
    """/home, /gcs/<bucket>, or a path a Lustre instance may be mounted at."""
    if dst == HOME or (dst.startswith(GCS + "/") and dst.count("/") == 2):
        return True
    try:
        return mount_path(dst, STORAGE_MOUNTS) == dst
    except ValidationError:
        return False


def seen_in_sandbox(env: Mapping[str, str]) -> dict[str, str]:
    """A sandboxed rank's ``MTC_STORAGE_MOUNTS``: each mount at the path the job sees."""
    try:
        asked = json.loads(env.get(STORAGE_MOUNTS) or "{}")
    except ValueError:
        return {}
    if not isinstance(asked, dict) or not asked:
        return {}
    seen = {k: k for k in asked if isinstance(k, str) and _storage_path(k)}
    return {STORAGE_MOUNTS: json.dumps(seen, sort_keys=True)} if seen else {}


def plan(*, uid: int, gid: int, hidden: Sequence[str], job_dirs: Sequence[str],
         job_files: Sequence[str], read_only: Sequence[str], home: str,
         env: Mapping[str, str], command: Sequence[str], python: str,
         output_root: str | None, buckets: Sequence[str] = (),
         mounts: Mapping[str, str] | None = None) -> SandboxPlan:
    """The rank's sandbox: ``job_dirs``/``job_files`` read-write (and owned by the job),
    ``read_only`` plus what the interpreter, the server's ``PYTHONPATH`` and the command
    need read-only."""
    tiers = [env[k] for k in (p.TIER1_DIR, p.TIER2_DIR, p.TIER2_SOURCE_DIR) if env.get(k)]
    # a tier directory's parent (<node>/shm/<job>) holds the job's ranks and peer copies
    memory = sorted({str(Path(t).parent) for t in tiers})
    rw_dirs = [*job_dirs, *memory, home]
    hide = [*hidden, *([output_root] if output_root else []), GCS_MOUNT,
            os.path.expanduser("~root")]
    gcs_root = os.path.join(output_root, "gcs") if output_root else None
    runtimes = os.path.join(os.path.dirname(output_root), "runtimes") if output_root else None
    cmd_ro, cmd_rw = command_paths(command, hide, runtimes, gcs_root, buckets)
    # pyenv's runtime cache is the uid's own (a job must not build what another runs):
    # <runtimes>/by-uid/<uid> is bound at <runtimes>
    private = [Bind(os.path.join(d, "by-uid", str(uid)), d, True) for d in cmd_rw]
    rw_dirs += [b.src for b in private]
    # the interpreter and the server's PYTHONPATH are the server's own: bound wherever they
    # are (the env's PYTHONPATH is not: a job's spec may set it)
    ro = [*read_only, *interpreter_paths(python), *cmd_ro, CODE_ROOT, os.getcwd(),
          *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    ro = [p for p in dict.fromkeys(os.path.abspath(p) for p in ro) if os.path.exists(p)]
    binds = [Bind(d, d, True, optional=d in memory) for d in dict.fromkeys(rw_dirs)
             if d not in {b.src for b in private}] + private
    binds += [Bind(f, f, True, False) for f in job_files]
    base = os.path.dirname(job_dirs[0]) if job_dirs else None  # the job's output directory
    hidden_base = base is not None and base != gcs_root and (
        any(_inside(base, h) and base != h for h in hide)
        or any(_closed(str(p)) for p in Path(base).parents if str(p) != "/"))
    if base and hidden_base:
        binds.insert(0, Bind(base, base, False))  # the advice file, read-only: the server's
    binds += [Bind(p, p, False, os.path.isdir(p)) for p in ro
              if not any(_inside(p, b.dst) for b in binds)]
    if gcs_root:
        binds += [Bind(b.src, GCS_MOUNT + b.src[len(gcs_root):], b.write, b.is_dir)
                  for b in list(binds) if _inside(b.src, gcs_root) and b.src != gcs_root]
    shared = [Bind(src, dst, True) for dst, src in (mounts or {}).items()]
    binds += shared
    covers = covers_for(hide, [b.dst for b in binds])
    # a read-only path outside every tmpfs is already there as it is: not bound (a bind
    # would make it read-only for the job where its own permissions allow a write)
    binds = [b for b in binds if b.write or any(_inside(b.dst, c) for c in (*covers, *SCRATCH))]
    return SandboxPlan(uid, gid, covers, tuple(binds), home, owned=tuple(dict.fromkeys(rw_dirs)),
                       shared=tuple(b.src for b in shared))


def prepare(sandbox: SandboxPlan) -> None:
    """As root, before the start: the job's directories exist and are the job's (files a
    previous attempt or another user left are taken over), ``/gcs`` exists to mount on (the
    launcher creates the job's files, its termination log)."""
    os.makedirs(GCS_MOUNT, mode=0o755, exist_ok=True)
    volatile = {b.src for b in sandbox.binds if b.optional}
    for path in sandbox.owned:
        try:
            os.makedirs(path, exist_ok=True)
            _chown_tree(path, sandbox.uid, sandbox.gid)
        except FileNotFoundError:
            if path not in volatile:
                raise  # (a node's memory wiped meanwhile: the launcher starts without it)
    for bind in sandbox.binds:
        if bind.write and bind.is_dir and not os.path.exists(bind.src):
            os.makedirs(bind.src, exist_ok=True)
    for path in sandbox.shared:
        os.makedirs(path, exist_ok=True)
        os.chmod(path, 0o1777)  # like /tmp: every job's uid writes, none removes another's


def _chown_tree(path: str, uid: int, gid: int) -> None:
    """``path`` and what is below it become the job's; a symbolic link is never followed (a
    job that put one where its directory was must not get root to hand it the target)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise PermissionError(f"{path} is a symbolic link: a job's directory must not be one")
    if st.st_uid == uid:
        return  # already the job's (the common case on a restart): no walk
    os.chown(path, uid, gid, follow_symlinks=False)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, gid, follow_symlinks=False)


def metric_dir(spec: WorkerSpec, env: Mapping[str, str]) -> list[str]:
    """A trial's hypertune metric file's directory (``CLOUD_ML_HP_METRIC_FILE``, which the
    tuning service puts in the job's output directory), read-write for the job; a path
    anywhere else is not bound (the job's environment never opens a hidden directory)."""
    raw = env.get(p.HP_METRIC_FILE, "")
    if not raw.startswith("/"):
        return []
    # resolved: a link the job made inside its own directory must not lead outside it
    where = os.path.realpath(os.path.dirname(raw))
    base = os.path.realpath(os.path.dirname(str(Path(spec.checkpoint_dir).absolute())))
    return [where] if _inside(where, base) and where != base else []


def plan_file(db: sqlite3.Connection, spec: WorkerSpec, env: Mapping[str, str], exit_file: Path,
              *, run_as: str | None, hidden: Sequence[str], python: str,
              output_root: str | None, own_dirs: Sequence[str] = (),
              read_only: Sequence[str] = (), uid_registry: Path = HOST_UIDS,
              mounts: Mapping[str, str] | None = None) -> Path:
    """The rank's sandbox planned and prepared, in a file beside its exit file (only root
    reads it): the launcher's ``--sandbox``. ``own_dirs``: more directories of the job's own
    (read-write, its uid's), e.g. its control file's and its logs'; ``read_only``: more
    paths it reads (its credential's directory)."""
    uid, gid = user_ids(run_as) if run_as else (allocate_uid(db, spec.job_id, uid_registry),) * 2
    made = plan(uid=uid, gid=gid, hidden=hidden,
                job_dirs=[str(Path(d).absolute()) for d in
                          (spec.checkpoint_dir, spec.model_dir, spec.tensorboard_dir,
                           str(progress_path(spec.checkpoint_dir, spec.rank).parent),
                           *metric_dir(spec, env), *own_dirs)],
                job_files=[f"{exit_file}.msg"], read_only=read_only,
                home=str(exit_file.parent / "home"), env=env, command=spec.command,
                python=python, output_root=output_root, buckets=spec.buckets,
                mounts=mounts)
    # a cgroup per deployment (its state directory: exit files are in <state>/run/<job>/),
    # job, attempt and node: the last launcher of an attempt removes its cgroup once empty,
    # which raced the next attempt's launch on the same node when they shared one
    deployment = hashlib.sha256(str(exit_file.parent.parent.parent).encode()).hexdigest()[:12]
    made = dataclasses.replace(made, limits=(*spec.limits, f"mtc/{deployment}/"
                                             f"{safe_name(spec.job_id)}-a{spec.attempt}-"
                                             f"{safe_name(spec.node_id)}"),
                               dirs=tuple(str(Path(d).absolute()) for d in
                                          (spec.checkpoint_dir, spec.model_dir,
                                           spec.tensorboard_dir)))
    prepare(made)
    path = exit_file.with_suffix(".sandbox.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(made.to_json())
    return path
