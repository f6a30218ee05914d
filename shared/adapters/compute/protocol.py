"""The worker protocol: what a training program is given and how it answers.

One definition for every Compute adapter (local subprocesses, Slurm, the simulator), so a
program written for one runs unchanged on the others and the control plane reads its answers
the same way everywhere (see ``examples/train.py``):

* **Environment** (``managed_env``): what a managed training service gives a replica. The
  names follow Vertex AI custom training (``CLOUD_ML_JOB_ID``, ``CLUSTER_SPEC``,
  ``AIP_CHECKPOINT_DIR``, ``AIP_MODEL_DIR``, ``AIP_TENSORBOARD_LOG_DIR``:
  https://cloud.google.com/vertex-ai/docs/training/code-requirements) plus the
  ``torch.distributed`` rendezvous (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).
  ``CLUSTER_SPEC`` has Vertex's distributed-training shape: a list of addresses per worker
  pool (``workerpool0``, ``workerpool1``, ...) and the replica's ``task`` as its pool and its
  index within it (https://cloud.google.com/vertex-ai/docs/training/distributed-training);
  ``RANK`` counts across the pools, pool after pool. ``torch_env`` adds the rest of what
  ``torchrun`` gives (``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``/``NODE_RANK``) and
  Vertex's ``TF_CONFIG``; a node that runs several processes runs ``torch.distributed.run``
  (``torch_node``), which gives each process its own (see docs/pytorch.md).
* **Exit codes** (``ExitCode``): 0 done; 75 (``EX_TEMPFAIL`` of BSD ``sysexits.h``) preempted
  with a checkpoint saved; 128+N killed by signal N (the shell's convention); 137 also when a
  worker vanished without leaving its code; 127/126 command not found / not executable. An
  attempt's code is that of the rank whose failure ended the gang (``attempt_exit``), else
  the first non-zero code by rank.
* **Gangs**: the ranks of an attempt live and die together: when one exits non-zero or is
  killed before the attempt was signalled, the others get SIGTERM, then SIGKILL after the
  grace period.
* **Checkpoints** (``checkpoint_steps``): an entry of ``AIP_CHECKPOINT_DIR`` named
  ``ckpt-<step>`` with an optional extension (``ckpt-00000100.npz``, ``ckpt-100.pt``, a
  ``ckpt-100`` directory) is a complete checkpoint of that step. It must appear atomically
  (write a temp file, fsync, rename), so names starting with ``.`` and extensions ``.tmp``,
  ``.part``, ``.partial`` are ignored; an ``.npz`` must also be a readable zip. A program
  that times its saves may write, beside a checkpoint, ``<checkpoint name>.save_s``: the
  seconds the save blocked training (a number); it is reported with the checkpoint
  (``save_cost``) and the checkpoint advice is computed from it.
* **Advice** (``MTC_ADVICE_FILE``, ``$AIP_CHECKPOINT_DIR/../mtc-advice.env``): ``KEY=value``
  lines the control plane rewrites as the job's history grows, e.g.
  ``MTC_CHECKPOINT_INTERVAL_S``, the checkpoint interval its failure rate calls for.
* **Tiers** (``tier_env``; the program side is ``shared.program.tiers``): each rank gets a
  directory in its node's memory (``MTC_TIER1_DIR``), one on its buddy's node for its peer
  copy (``MTC_TIER2_DIR``; the buddy is the node of rank ``(rank + 1) % world``), the peer
  copy of the previous attempt to read back (``MTC_TIER2_SOURCE_DIR``) and a heartbeat file
  on the job's storage (``MTC_PROGRESS_FILE``); names in ``shared.program.names``.
* **In-process restart** (``MTC_RESTART_FILE``, the local compute only; the program side is
  ``shared.program.inprocess``): a program that declares it is held instead of SIGTERMed and
  the next in-place, hot-swap or scale-down attempt takes its process (``local.inprocess``).
* **Termination message** (``MTC_TERMINATION_LOG``): a file where a failing program may
  leave one short line on why; the attempt's detail (the job's error) carries it.
* **Signals**: SIGTERM means "checkpoint and exit 75 within the grace period"; SIGKILL follows.
"""

from __future__ import annotations

import enum
import json
import re
import signal
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from shared.adapters.advice_file import advice_path
from shared.domain import exits
from shared.ports import RecoveryPlan, WorkerSpec
from shared.program import names as tier_names

LAUNCHER = Path(__file__).with_name("worker_launcher.py")
# below Linux's ephemeral range (32768-60999): a port there can be any outgoing connection's,
# and torchrun's store then fails with EADDRINUSE (seen: 50010 in a test run)
MASTER_PORT_BASE, MASTER_PORT_SPAN = 20000, 12000
CHECKPOINT_RE = re.compile(r"^ckpt-(\d+)(\.[A-Za-z0-9_]+)?$")
IGNORED_SUFFIXES = frozenset({".tmp", ".part", ".partial", ".save_s"})  # .save_s: a save time


class ExitCode(enum.IntEnum):
    """The exit statuses adapters produce and read. What they mean to the control plane
    (finish, fail, restart) is the domain's (``shared.domain.exits``), whose numbers these are."""

    OK = exits.OK
    FAILED = 1  # the program failed on its own (or its attempt could not be submitted)
    PREEMPTED = exits.PREEMPTED  # 75, EX_TEMPFAIL: checkpoint saved on SIGTERM, run me again
    NOT_EXECUTABLE = 126
    NOT_FOUND = 127
    SIGNALLED = exits.SIGNALLED  # + N: killed by signal N
    KILLED = exits.SIGNALLED + signal.SIGKILL  # 137: SIGKILL, or vanished leaving no code
    TERMINATED = exits.SIGNALLED + signal.SIGTERM  # 143: SIGTERM without a handler

    @classmethod
    def for_signal(cls, signum: int) -> int:
        """The shell's status of a process killed by ``signum``."""
        return int(cls.SIGNALLED) + int(signum)

    @staticmethod
    def signal_of(code: int) -> int | None:
        """The signal that killed a worker with this status, if it was one."""
        return code - exits.SIGNALLED if exits.SIGNALLED < code < exits.SIGNALLED + 65 else None


EXIT_KILLED = int(ExitCode.KILLED)


def attempt_exit(codes: Mapping[int, int | None], first_failed: int | None = None) -> tuple[int, str]:
    """An attempt's exit code and the detail every adapter reports (``exit codes rank 0: 75,
    rank 1: 137``). The code is that of ``first_failed``, the rank whose failure ended the
    gang (the others were stopped because of it, so their codes say nothing of the cause),
    else the first non-zero by rank; a rank with no code was killed."""
    final = {r: EXIT_KILLED if c is None else c for r, c in sorted(codes.items())}
    detail = "exit codes " + ", ".join(f"rank {r}: {c}" for r, c in final.items())
    if first_failed is not None and final.get(first_failed, 0) != 0:
        return final[first_failed], f"{detail}; rank {first_failed} failed first, the gang ended with it"
    worst = next((c for c in final.values() if c != 0), 0)
    return worst, detail


def master_port(job_id: str, attempt: int, salt: str = "") -> int:
    """A port derived from the job and attempt, so every rank computes the same one.
    ``salt``: the deployment's own (its state directory) where several deployments share one
    host's ports, as local and test clusters do: two servers' job ``t1`` then differ."""
    key = f"{salt}/{job_id}/{attempt}" if salt else f"{job_id}/{attempt}"
    return MASTER_PORT_BASE + zlib.crc32(key.encode()) % MASTER_PORT_SPAN


def pool_of(rank: int, pools: Sequence[int]) -> tuple[int, int]:
    """``rank``'s worker pool and its index within that pool (ranks run pool after pool)."""
    first = 0
    for pool, count in enumerate(pools):
        if rank < first + count:
            return pool, rank - first
        first += count
    raise ValueError(f"rank {rank} is outside the pools {list(pools)}")


def recovery_env(plan: RecoveryPlan | None, attempt: int, node_id: str) -> dict[str, str]:
    """How this attempt was started, for the program (``shared.policies.recovery``):
    ``MTC_RECOVERY_MODE`` in_place / hot_swap / scale_down, ``requeue`` for a later attempt
    started without a plan (absent on the first); ``MTC_RECOVERY_FRESH`` 1 on a node new to
    the job (its ranks restore from the peer tier), 0 on the others (from memory)."""
    if plan is None:
        return {"MTC_RECOVERY_MODE": "requeue"} if attempt > 1 else {}
    return {"MTC_RECOVERY_MODE": plan.mode,
            "MTC_RECOVERY_FRESH": "1" if node_id in plan.fresh_node_ids else "0"}


def managed_env(spec: WorkerSpec, master_addr: str = "127.0.0.1",
                pools: Sequence[int] = (), tiers: Mapping[str, str] | None = None,
                recovery: RecoveryPlan | None = None, port_salt: str = "") -> dict[str, str]:
    """What a managed service adds to a replica's environment (the spec's env cannot
    override the service's own variables). ``pools``: the replica count of each worker pool
    (none: one pool), so ``CLUSTER_SPEC`` has Vertex's shape: one address list per pool and
    the task's index within its pool; ``RANK`` stays global, as torch needs it. ``tiers``:
    the rank's checkpoint tier variables (``tier_env``); none: durable only. ``port_salt``:
    see ``master_port``."""
    port = master_port(spec.job_id, spec.attempt, port_salt)
    counts = tuple(pools) or (spec.world_size,)
    if sum(counts) != spec.world_size:
        raise ValueError(f"pools {list(counts)} do not add up to world size {spec.world_size}")
    pool, index = pool_of(spec.rank, counts)
    cluster: dict[str, list[str]] = {}
    first = 0
    for i, count in enumerate(counts):
        cluster[f"workerpool{i}"] = [f"{master_addr}:{port + r}" for r in range(first, first + count)]
        first += count
    cluster_spec = {
        "cluster": cluster,
        "environment": "cloud",
        "task": {"type": f"workerpool{pool}", "index": index, "node_id": spec.node_id},
        "job": {
            "job_id": spec.job_id,
            "attempt": spec.attempt,
            "world_size": spec.world_size,
            "base_output_directory": str(Path(spec.model_dir).parent),
        },
    }
    env = {"PYTHONUNBUFFERED": "1", **dict(spec.env)}
    env.update(
        CLOUD_ML_JOB_ID=spec.job_id,
        CLUSTER_SPEC=json.dumps(cluster_spec),
        RANK=str(spec.rank),
        WORLD_SIZE=str(spec.world_size),
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(port),
        AIP_CHECKPOINT_DIR=str(spec.checkpoint_dir),
        AIP_MODEL_DIR=str(spec.model_dir),
        AIP_TENSORBOARD_LOG_DIR=str(spec.tensorboard_dir),
        MTC_NODE_ID=spec.node_id,
        MTC_JOB_ATTEMPT=str(spec.attempt),
        MTC_ADVICE_FILE=str(advice_path(spec.checkpoint_dir)),
    )
    env.update(torch_env(spec.rank, cluster_spec))
    env.update(tiers or {})
    env.update(recovery_env(recovery, spec.attempt, spec.node_id))
    return env


def progress_path(checkpoint_dir: str | Path, rank: int) -> Path:
    """A rank's heartbeat file (``MTC_PROGRESS_FILE``): beside the checkpoints, on the job's
    storage, so the adapter reads it wherever the rank runs."""
    return Path(checkpoint_dir).parent / "mtc-progress" / f"rank-{rank}.json"


def tier_progress(checkpoint_dir: str | Path, attempt: int,
                  world_size: int) -> list[tuple[str, int, str, float]]:
    """From the ranks' heartbeats: for the memory and peer tiers, the newest step every rank
    of ``attempt`` holds, where rank 0's entry of it is, and the longest time a rank's save
    of it blocked (0.0: not known). Nothing for a tier until every rank has reported."""
    beats = []
    for rank in range(world_size):
        try:
            beat = json.loads(progress_path(checkpoint_dir, rank).read_text())
        except (OSError, ValueError):
            return []
        if not isinstance(beat, dict) or beat.get("attempt") != attempt:
            return []
        beats.append(beat)
    out: list[tuple[str, int, str, float]] = []
    for tier in (tier_names.MEMORY, tier_names.PEER):
        steps = [s for b in beats if isinstance(s := (b.get("newest") or {}).get(tier), int) and s > 0]
        if not steps or len(steps) < len(beats):
            continue
        step = min(steps)
        where = str((beats[0].get("dirs") or {}).get(tier, ""))
        blocked = [float(last.get("blocking_s", 0.0)) for b in beats
                   if isinstance(last := b.get("last_save"), dict) and last.get("step") == step
                   and tier in (last.get("tiers") or ())]
        out.append((tier, step, f"{where}/step-{step:010d}" if where else tier,
                    max(blocked, default=0.0)))
    return out


def tier_env(job_id: str, rank: int, node_ids: Sequence[str], memory_root: Callable[[str], Path],
             checkpoint_dir: str | Path,
             previous_node_ids: Sequence[str] | None = None) -> dict[str, str]:
    """Rank ``rank``'s tier variables when ``node_ids[r]`` runs rank ``r``. ``memory_root``:
    a node's memory directory (local: a directory per simulated node; Slurm:
    ``/dev/shm/mtc``). Tier 1 is ``<root of my node>/<job>/rank-<r>``; the peer copy of rank
    ``r`` is ``<root of its buddy's node>/<job>/peer/rank-<r>``, the buddy being rank
    ``(r + 1) % world``; the copy to read back is where the previous attempt's buddy held it
    (``previous_node_ids``: that attempt's placement; none or too short: this one's)."""
    world, job = len(node_ids), safe_name(job_id)
    before = previous_node_ids if previous_node_ids and len(previous_node_ids) > rank else node_ids
    return {
        tier_names.TIER1_DIR: str(memory_root(node_ids[rank]) / job / tier_names.rank_dir(rank)),
        tier_names.TIER2_DIR: str(memory_root(node_ids[(rank + 1) % world]) / job
                                  / tier_names.peer_dir(rank)),
        tier_names.TIER2_SOURCE_DIR: str(memory_root(before[(rank + 1) % len(before)]) / job
                                         / tier_names.peer_dir(rank)),
        tier_names.PROGRESS_FILE: str(progress_path(checkpoint_dir, rank)),
    }


TF_TASK_TYPES = ("chief", "worker", "ps", "evaluator")  # Vertex: workerpool0..3 in TF_CONFIG


def torch_env(node_rank: int, cluster_spec: Mapping[str, object]) -> dict[str, str]:
    """What ``torchrun`` gives a single-process node (one process per replica; a node that
    runs several processes gets them from ``torch.distributed.run`` itself, which overrides
    these) and Vertex's ``TF_CONFIG``: ``CLUSTER_SPEC`` with the pools named as TensorFlow
    names them (``workerpool0`` is ``chief``, ``workerpool1`` ``worker``, ...)."""
    cluster = cluster_spec["cluster"]
    task = cluster_spec["task"]
    assert isinstance(cluster, dict) and isinstance(task, dict)

    def tf_name(pool: str) -> str:
        i = int(pool.removeprefix("workerpool"))
        return TF_TASK_TYPES[i] if i < len(TF_TASK_TYPES) else pool

    tf_config = {**cluster_spec, "cluster": {tf_name(k): v for k, v in cluster.items()},
                 "task": {**task, "type": tf_name(str(task["type"]))}}
    return {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(node_rank),
            "NODE_RANK": str(node_rank), "TF_CONFIG": json.dumps(tf_config)}


def checkpoint_name(step: int) -> str:
    """The name a program gives the checkpoint of ``step`` (what ``checkpoint_steps`` finds)."""
    return f"ckpt-{step:08d}"


def checkpoint_steps(directory: Path) -> dict[int, Path]:
    """Complete checkpoints in ``directory`` by step (see the module docstring)."""
    found: dict[int, Path] = {}
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return found
    for entry in entries:
        m = CHECKPOINT_RE.match(entry.name)
        if not m or (m.group(2) or "").lower() in IGNORED_SUFFIXES:
            continue
        if entry.suffix == ".npz" and not (entry.is_file() and zipfile.is_zipfile(entry)):
            continue
        found.setdefault(int(m.group(1)), entry)
    return found


MAX_SAVE_S = 7 * 86_400.0  # a larger figure in a .save_s file is not a save time


def save_cost(checkpoint: Path) -> float:
    """The save time the program wrote beside ``checkpoint`` (0.0: none, or not a number)."""
    try:
        text = checkpoint.with_name(checkpoint.name + ".save_s").read_text()[:32].strip()
        value = float(text)
    except (OSError, ValueError):
        return 0.0
    return value if 0.0 < value <= MAX_SAVE_S else 0.0


def read_exit_file(path: Path) -> int | None:
    """The code ``worker_launcher`` left for a rank, or None while it runs."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        return int(text)
    except ValueError:
        return int(ExitCode.FAILED)  # impossible with an atomic writer: a failure, not success


MESSAGE_SUFFIX, MAX_MESSAGE = ".msg", 2000


def termination_message(exit_file: Path | str) -> str:
    """What a rank left in ``$MTC_TERMINATION_LOG`` (``<exit file>.msg``, as Kubernetes'
    termination log) to say why it failed, e.g. pip's last lines; '' when nothing."""
    try:
        text = Path(str(exit_file) + MESSAGE_SUFFIX).read_text(errors="replace")
    except OSError:
        return ""
    return " ".join(text.split())[:MAX_MESSAGE]


def with_message(note: str, exit_files: Mapping[int, Path | str], rank: int | None) -> str:
    """``note`` and the message of ``rank`` (the rank that failed first), if it left one."""
    message = termination_message(exit_files[rank]) if rank is not None and rank in exit_files \
        else ""
    return f"{note}; rank {rank}: {message}" if message else note


def safe_name(name: str) -> str:
    """A job or node id as one path component."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"
