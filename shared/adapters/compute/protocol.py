"""The worker protocol as the adapters speak it: the managed environment they give a replica
and the answers they read back, the same for every Compute adapter (local subprocesses,
Slurm, the simulator), so a program written for one runs unchanged on the others.

The protocol itself (every environment name, exit code, checkpoint name and file layout) is
defined once, in the in-job SDK (``mtc_program.protocol``); this module builds on it:

* **Environment** (``managed_env``): what a managed training service gives a replica, in
  Vertex AI custom training's names plus the ``torch.distributed`` rendezvous.
  ``CLUSTER_SPEC`` has Vertex's distributed-training shape: a list of addresses per worker
  pool (``workerpool0``, ``workerpool1``, ...) and the replica's ``task`` as its pool and its
  index within it (https://cloud.google.com/vertex-ai/docs/training/distributed-training);
  ``RANK`` counts across the pools, pool after pool. ``torch_env`` adds the rest of what
  ``torchrun`` gives and Vertex's ``TF_CONFIG``; a node that runs several processes runs
  ``torch.distributed.run`` (``shared.launch.torch_node``), which gives each process its own
  (see docs/pytorch.md).
* **Exit codes** (``ExitCode``): an attempt's code is that of the rank whose failure ended
  the gang (``attempt_exit``), else the first non-zero code by rank.
* **Gangs**: the ranks of an attempt live and die together: when one exits non-zero or is
  killed before the attempt was signalled, the others get SIGTERM, then SIGKILL after the
  grace period.
* **Checkpoints** (``checkpoint_steps``): complete ``ckpt-<step>`` entries of
  ``AIP_CHECKPOINT_DIR`` by step (an ``.npz`` must also be a readable zip); in a directory
  without them, the checkpoints learnt from the program's own names once they settled
  (``learnt_steps``); ``save_cost`` reads the ``.save_s`` a program wrote beside one.
* **Advice** (``MTC_ADVICE_FILE``, ``shared.adapters.advice_file``).
* **Tiers** (``tier_env``; the program side is ``mtc_program.tiers``): each rank's directory
  in its node's memory, one on its buddy's node for its peer copy, the previous attempt's
  peer copy to read back, and a heartbeat file on the job's storage (``progress_path``).
* **In-process restart** (``MTC_RESTART_FILE``, the local compute and Slurm's with warm
  processes; the program side is ``mtc_program.inprocess``): a program that declares it is
  held instead of SIGTERMed and the next in-place, hot-swap or scale-down attempt takes its
  process (``local.inprocess``, ``slurm.warm``; the orders: ``warm_orders``).
* **Termination message** (``MTC_TERMINATION_LOG``): the line a failing rank left; the
  attempt's detail (the job's error) carries it (``with_message``).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import zipfile
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from mtc_program import protocol as p
from mtc_program.protocol import CHECKPOINT_RE, IGNORED_SUFFIXES, ExitCode, checkpoint_name
from shared.adapters.advice_file import advice_path
from shared.ports import RecoveryPlan, WorkerSpec

__all__ = ["CHECKPOINT_RE", "EXIT_KILLED", "IGNORED_SUFFIXES", "ExitCode", "attempt_exit",
           "checkpoint_name", "checkpoint_steps", "gcs_uri", "host_dir", "managed_env",
           "master_port", "pool_of", "progress_path", "read_exit_file", "recovery_env",
           "safe_name", "save_cost", "termination_message", "tier_env", "tier_progress",
           "torch_env", "with_message"]

LAUNCHER = Path(__file__).with_name("worker_launcher.py")
# below Linux's ephemeral range (32768-60999): a port there can be any outgoing connection's,
# and torchrun's store then fails with EADDRINUSE (seen: 50010 in a test run)
MASTER_PORT_BASE, MASTER_PORT_SPAN = 20000, 12000
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
        return {p.RECOVERY_MODE: p.REQUEUE} if attempt > 1 else {}
    return {p.RECOVERY_MODE: plan.mode,
            p.RECOVERY_FRESH: "1" if node_id in plan.fresh_node_ids else "0"}


def managed_env(spec: WorkerSpec, master_addr: str = "127.0.0.1",
                pools: Sequence[int] = (), tiers: Mapping[str, str] | None = None,
                recovery: RecoveryPlan | None = None, port_salt: str = "",
                gcs_root: str | None = None) -> dict[str, str]:
    """What a managed service adds to a replica's environment (the spec's env cannot
    override the service's own variables). ``pools``: the replica count of each worker pool
    (none: one pool), so ``CLUSTER_SPEC`` has Vertex's shape: one address list per pool and
    the task's index within its pool; ``RANK`` stays global, as torch needs it. ``tiers``:
    the rank's checkpoint tier variables (``tier_env``); none: durable only. ``port_salt``:
    see ``master_port``. ``gcs_root``: the host's directory of the ``gs://`` tree where the
    rank sees it at ``/gcs/`` (the local sandbox): the job's directories under it are named
    as Vertex names them, ``gs://BUCKET/PATH/model/`` (``gcs_uri``); None: local paths."""
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
            "base_output_directory": gcs_uri(str(Path(spec.model_dir).parent), gcs_root),
        },
    }
    env = {"PYTHONUNBUFFERED": "1", **dict(spec.env)}
    env.update({
        p.JOB_ID: spec.job_id,
        p.CLUSTER_SPEC: json.dumps(cluster_spec),
        p.RANK: str(spec.rank),
        p.WORLD_SIZE: str(spec.world_size),
        p.MASTER_ADDR: master_addr,
        p.MASTER_PORT: str(port),
        p.CHECKPOINT_DIR: gcs_uri(str(spec.checkpoint_dir), gcs_root),
        p.MODEL_DIR: gcs_uri(str(spec.model_dir), gcs_root),
        p.TENSORBOARD_LOG_DIR: gcs_uri(str(spec.tensorboard_dir), gcs_root),
        p.NODE_ID: spec.node_id,
        p.JOB_ATTEMPT: str(spec.attempt),
        p.ADVICE_FILE: str(advice_path(spec.checkpoint_dir)),
    })
    env.update(torch_env(spec.rank, cluster_spec))
    env.update(tiers or {})
    env.update(recovery_env(recovery, spec.attempt, spec.node_id))
    return env


def gcs_uri(path: str, gcs_root: str | None) -> str:
    """A job's directory as the rank is told it: one under ``gcs_root`` (the host's ``gs://``
    tree, ``<output root>/gcs``) is ``gs://BUCKET/PATH/``, with the trailing ``/`` Vertex
    gives its ``AIP_*_DIR``; any other path, or no ``gcs_root``, is the path itself."""
    if not gcs_root:
        return path
    root, where = os.path.abspath(gcs_root), os.path.abspath(path)
    rel = os.path.relpath(where, root)
    if rel in (".", "..") or rel.startswith("../"):
        return path  # outside the tree (or the tree itself: no bucket)
    return f"{p.GCS_SCHEME}{rel}/"


def host_dir(value: str, gcs_root: str | None) -> str:
    """The host's path of a job's directory as the rank was told it (``gcs_uri`` undone):
    the control plane never reads a rank's ``gs://`` value as a path."""
    if gcs_root and value.startswith(p.GCS_SCHEME):
        return os.path.join(gcs_root, value[len(p.GCS_SCHEME):].rstrip("/"))
    return value


def progress_path(checkpoint_dir: str | Path, rank: int) -> Path:
    """A rank's heartbeat file (``MTC_PROGRESS_FILE``): beside the checkpoints, on the job's
    storage, so the adapter reads it wherever the rank runs."""
    return Path(checkpoint_dir).parent / p.PROGRESS_DIR / p.progress_name(rank)


def tier_progress(checkpoint_dir: str | Path, attempt: int, world_size: int
                  ) -> list[tuple[str, int, str, float, float | None]]:
    """From the ranks' heartbeats: for the memory and peer tiers, the newest step every rank
    of ``attempt`` holds, where rank 0's entry of it is, the longest time a rank's save of
    it blocked (0.0: not known), and when the last rank wrote it, by the ranks' own clocks
    (``newest_at``; else the newest heartbeat's ``time``, written after it; None: neither).
    Nothing for a tier until every rank has reported."""
    beats = []
    for rank in range(world_size):
        try:
            beat = json.loads(progress_path(checkpoint_dir, rank).read_text())
        except (OSError, ValueError):
            return []
        if not isinstance(beat, dict) or beat.get("attempt") != attempt:
            return []
        beats.append(beat)
    out: list[tuple[str, int, str, float, float | None]] = []
    for tier in (p.MEMORY, p.PEER):
        steps = [s for b in beats if isinstance(s := (b.get("newest") or {}).get(tier), int) and s > 0]
        if not steps or len(steps) < len(beats):
            continue
        step = min(steps)
        where = str((beats[0].get("dirs") or {}).get(tier, ""))
        blocked = [float(last.get("blocking_s", 0.0)) for b in beats
                   if isinstance(last := b.get("last_save"), dict) and last.get("step") == step
                   and tier in (last.get("tiers") or ())]
        out.append((tier, step, f"{where}/{p.entry_name(step)}" if where else tier,
                    max(blocked, default=0.0), _written_at(beats, tier, step)))
    return out


def _written_at(beats: Sequence[dict[str, Any]], tier: str, step: int) -> float | None:
    """When ``step`` was whole on ``tier`` at every rank: the latest write of it among the
    ranks whose newest entry it is (those ahead wrote it before their newer one); the
    newest heartbeat's ``time`` for a program that does not say."""
    written = [at for b in beats if (b.get("newest") or {}).get(tier) == step
               and isinstance(at := (b.get("newest_at") or {}).get(tier), int | float)]
    if written:
        return float(max(written))
    times = [t for b in beats if isinstance(t := b.get("time"), int | float)]
    return float(max(times)) if times else None


def tier_env(job_id: str, rank: int, node_ids: Sequence[str], memory_root: Callable[[str], Path],
             checkpoint_dir: str | Path,
             previous_node_ids: Sequence[str] | None = None,
             peer_store: Callable[[str], str] | None = None, token: str = "") -> dict[str, str]:
    """Rank ``rank``'s tier variables when ``node_ids[r]`` runs rank ``r``. ``memory_root``:
    a node's memory directory (local: a directory per simulated node; Slurm:
    ``/dev/shm/mtc/<deployment>/<node>``). Tier 1 is ``<root of my node>/<job>/rank-<r>``;
    the peer copy of rank ``r`` is ``<root of its buddy's node>/<job>/peer/rank-<r>``, the buddy being rank
    ``(r + 1) % world``; the copy to read back is where the previous attempt's buddy held it
    (``previous_node_ids``: that attempt's placement; none or too short: this one's).
    ``peer_store``: a node's peer store service (``http://host:port``), where the nodes run
    one: the peer copy then goes over the network to the buddy's (``MTC_TIER2_URL``, read
    back from ``MTC_TIER2_SOURCE_URL``, with ``token``) instead of into its directory."""
    world, job = len(node_ids), safe_name(job_id)
    before = previous_node_ids if previous_node_ids and len(previous_node_ids) > rank else node_ids
    buddy, prev_buddy = node_ids[(rank + 1) % world], before[(rank + 1) % len(before)]
    if peer_store is not None:
        return {
            p.TIER1_DIR: str(memory_root(node_ids[rank]) / job / p.rank_dir(rank)),
            p.TIER2_URL: f"{peer_store(buddy)}/{job}",
            p.TIER2_SOURCE_URL: f"{peer_store(prev_buddy)}/{job}",
            p.TIER2_TOKEN: token,
            p.PROGRESS_FILE: str(progress_path(checkpoint_dir, rank)),
        }
    return {
        p.TIER1_DIR: str(memory_root(node_ids[rank]) / job / p.rank_dir(rank)),
        p.TIER2_DIR: str(memory_root(buddy) / job / p.peer_dir(rank)),
        p.TIER2_SOURCE_DIR: str(memory_root(prev_buddy) / job / p.peer_dir(rank)),
        p.PROGRESS_FILE: str(progress_path(checkpoint_dir, rank)),
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
    return {p.LOCAL_RANK: "0", p.LOCAL_WORLD_SIZE: "1", p.GROUP_RANK: str(node_rank),
            p.NODE_RANK: str(node_rank), p.TF_CONFIG: json.dumps(tf_config)}


def checkpoint_steps(directory: Path, seen: Collection[int] = (),
                     complete_before: float | None = None) -> dict[int, Path]:
    """Complete checkpoints in ``directory`` by step (see the module docstring): the
    ``ckpt-<step>`` entries; while there are none, the entries learnt from other names
    (``learnt_steps``). ``seen``: steps already known, not looked at again;
    ``complete_before``: see ``learnt_steps``."""
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
    if found or any(_protocol_name(e.name) for e in entries):
        return found  # the program uses the protocol's names (a save of one may be under way)
    return learnt_steps(entries, seen, complete_before)


def _protocol_name(name: str) -> bool:
    """``ckpt-<digits>...``, hidden or not: a checkpoint, or one being saved (``.ckpt-9.tmp``)."""
    rest = name.lstrip(".").removeprefix(p.CHECKPOINT_PREFIX)
    return len(rest) < len(name.lstrip(".")) and rest[:1].isdigit()


MAX_WALK = 10_000  # entries read of one checkpoint directory to see whether it settled


def learnt_steps(entries: Sequence[Path], seen: Collection[int] = (),
                 complete_before: float | None = None) -> dict[int, Path]:
    """Checkpoints of a program that names them its own way (``p.learnt_step``): each entry
    whose name has a step, once nothing in it was modified after ``complete_before`` (a
    wall-clock time; None: ``p.SETTLE_S`` ago, as a file being written keeps changing; an
    attempt whose ranks all ended 0 or 75 passes infinity: their writes are over). A symlink
    is never one (it points at what may be elsewhere)."""
    cutoff = time.time() - p.SETTLE_S if complete_before is None else complete_before
    found: dict[int, Path] = {}
    for entry in entries:
        step = p.learnt_step(entry.name)
        if step is None or step in seen or step in found or entry.is_symlink():
            continue
        if math.isinf(cutoff) or _last_change(entry) <= cutoff:
            found[step] = entry
    return found


def _last_change(entry: Path) -> float:
    """The newest modification time of ``entry`` and, for a directory, of what it holds
    (the first ``MAX_WALK`` entries); infinity when it cannot be read (not settled)."""
    try:
        newest = entry.lstat().st_mtime
        if not entry.is_dir():
            return newest
        count = 0
        for root, dirs, files in os.walk(entry):
            for name in (*dirs, *files):
                newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
                count += 1
                if count >= MAX_WALK:
                    return newest
    except OSError:
        return math.inf
    return newest


MAX_SAVE_S = 7 * 86_400.0  # a larger figure in a .save_s file is not a save time


def save_cost(checkpoint: Path) -> float:
    """The save time the program wrote beside ``checkpoint`` (0.0: none, or not a number)."""
    try:
        text = checkpoint.with_name(checkpoint.name + p.SAVE_S_SUFFIX).read_text()[:32].strip()
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
