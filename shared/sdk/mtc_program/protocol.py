"""The worker protocol, defined once: what mtc gives a training program and how the program
answers. Standard library only and free of side effects, so the control plane imports it
too (its adapters set what the program reads here, and read what the program writes).

A program need not import this package to speak the protocol: it is environment variables,
exit codes and file names, all listed below.

**Environment.** The names follow Vertex AI custom training
(https://cloud.google.com/vertex-ai/docs/training/code-requirements) and the
``torch.distributed`` rendezvous (what ``torchrun`` gives), plus mtc's own ``MTC_*``:

* the job and the rank: ``CLOUD_ML_JOB_ID``, ``CLUSTER_SPEC`` (Vertex's distributed-training
  shape: an address list per worker pool and the replica's ``task``), ``TF_CONFIG`` (the
  same, pools named as TensorFlow names them), ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
  ``MASTER_PORT``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``NODE_RANK``,
  ``MTC_NODE_ID``, ``MTC_JOB_ATTEMPT`` (1, 2, ...);
* where to write: ``AIP_CHECKPOINT_DIR``, ``AIP_MODEL_DIR``, ``AIP_TENSORBOARD_LOG_DIR``:
  as on Vertex, ``gs://BUCKET/PATH/checkpoints/`` etc. where the job's
  ``baseOutputDirectory`` is a ``gs://`` URI and the rank sees Cloud Storage at ``/gcs/``
  (Cloud Storage FUSE's layout; ``local_path`` gives the file path), else local paths;
* the control plane's advice (``MTC_ADVICE_FILE``: ``KEY=value`` lines rewritten as the
  job's history grows, e.g. ``MTC_CHECKPOINT_INTERVAL_S``);
* the checkpoint tiers (``MTC_TIER*``, ``MTC_PROGRESS_*``; ``mtc_program.tiers``), the
  recovery that started this attempt (``MTC_RECOVERY_MODE``, ``MTC_RECOVERY_FRESH``), the
  in-process restart (``MTC_RESTART_FILE``, ``MTC_STANDBY``; ``mtc_program.inprocess``);
* a trial of a tuning job (``CLOUD_ML_TRIAL_ID``, ``CLOUD_ML_HP_METRIC_FILE``), the job's API
  credentials (``MTC_JOB_TOKEN_FILE``, ``MTC_JOB_NAME``), a file for one line on why the
  program failed (``MTC_TERMINATION_LOG``).

**Exit codes** (``ExitCode``): 0 done; 75 (``EX_TEMPFAIL`` of BSD ``sysexits.h``) preempted
with a checkpoint saved, run me again; 128+N killed by signal N (the shell's convention), 137
also when a worker vanished without leaving its code; 127/126 command not found / not
executable. **Signals**: SIGTERM means "checkpoint and exit 75 within the grace period";
SIGKILL follows.

**Checkpoints.** An entry of ``AIP_CHECKPOINT_DIR`` named ``ckpt-<step>`` with an optional
extension (``ckpt-00000100.npz``, ``ckpt-100.pt``, a ``ckpt-100`` directory) is a complete
checkpoint of that step (``CHECKPOINT_RE``). It must appear atomically (a temporary name,
fsync, rename), so names starting with ``.`` and the extensions in ``IGNORED_SUFFIXES`` are
never checkpoints. Beside it a program may write ``<name>.save_s``: the seconds the save
blocked training, which the checkpoint advice is computed from. The tiers' entries are
``step-<step:010d>/`` directories (``ENTRY_RE``) with a payload and a manifest written last.

A program that names its checkpoints otherwise is learnt from what it writes: while
``AIP_CHECKPOINT_DIR`` holds no ``ckpt-<step>`` entry, each file or directory directly in it
whose name has a number is a checkpoint of that step (``learnt_step``: the number after
``step`` or ``iter`` where the name has one, else its last number; ``step-000120.pt``,
``epoch=2-step=300.ckpt``, ``checkpoint-500/``, ``global_step120/``), once nothing in it has
changed for ``SETTLE_S`` seconds or its program has ended with 0 or 75. Names that are never
checkpoints: hidden or temporary ones (``.x``, ``x~``, ``tmpXXXX``, a ``tmp`` or ``temp`` word),
``IGNORED_SUFFIXES``, text files (``TEXT_SUFFIXES``) and TensorBoard event files.
"""

from __future__ import annotations

import enum
import re
import signal

# ---------------------------------------------------------------- the environment

# the job and the rank (Vertex AI custom training; torchrun's rendezvous)
JOB_ID = "CLOUD_ML_JOB_ID"
CLUSTER_SPEC = "CLUSTER_SPEC"
TF_CONFIG = "TF_CONFIG"
RANK, WORLD_SIZE = "RANK", "WORLD_SIZE"
MASTER_ADDR, MASTER_PORT = "MASTER_ADDR", "MASTER_PORT"
LOCAL_RANK, LOCAL_WORLD_SIZE = "LOCAL_RANK", "LOCAL_WORLD_SIZE"
GROUP_RANK, NODE_RANK = "GROUP_RANK", "NODE_RANK"
NODE_ID = "MTC_NODE_ID"
JOB_ATTEMPT = "MTC_JOB_ATTEMPT"

# where the program writes
CHECKPOINT_DIR = "AIP_CHECKPOINT_DIR"
MODEL_DIR = "AIP_MODEL_DIR"
TENSORBOARD_LOG_DIR = "AIP_TENSORBOARD_LOG_DIR"
JOB_DIRS = (CHECKPOINT_DIR, MODEL_DIR, TENSORBOARD_LOG_DIR)
# where a rank sees Cloud Storage as files: gs://BUCKET/PATH is /gcs/BUCKET/PATH (Vertex
# mounts it there with Cloud Storage FUSE; mtc's sandbox binds the same objects there)
GCS_SCHEME, GCS_MOUNT = "gs://", "/gcs"


def local_path(value: str) -> str:
    """Where a job's directory variable (``AIP_CHECKPOINT_DIR``, ...) is as a file path:
    ``gs://BUCKET/PATH/`` is ``/gcs/BUCKET/PATH/``, as a Vertex program maps it itself; a
    local path (mtc without the sandbox, Slurm, a run by hand) is itself."""
    if value.startswith(GCS_SCHEME):
        return f"{GCS_MOUNT}/{value[len(GCS_SCHEME):]}"
    return value


# a trial of a hyperparameter tuning job (what cloudml-hypertune reads)
TRIAL_ID = "CLOUD_ML_TRIAL_ID"
HP_METRIC_FILE = "CLOUD_ML_HP_METRIC_FILE"

# mtc's own
ADVICE_FILE = "MTC_ADVICE_FILE"
TERMINATION_LOG = "MTC_TERMINATION_LOG"  # one short line on why the program failed
RECOVERY_MODE = "MTC_RECOVERY_MODE"  # in_place, hot_swap, scale_down, requeue
RECOVERY_FRESH = "MTC_RECOVERY_FRESH"  # 1: this node is new to the job (restore from the peer)
REQUEUE = "requeue"  # RECOVERY_MODE of a later attempt started without a recovery plan
RESTART_FILE = "MTC_RESTART_FILE"  # the in-process restart's control file
STANDBY = "MTC_STANDBY"  # 1 in a warm standby's environment: wait to be given a rank
PROCESSES_PER_NODE = "MTC_PROCESSES_PER_NODE"  # N or gpu: torch.distributed.run per node
RUNTIME = "MTC_RUNTIME"  # a prebuilt image's runtime, as the node set it up
JOB_TOKEN_FILE = "MTC_JOB_TOKEN_FILE"  # a token good for this job's own API calls
JOB_NAME = "MTC_JOB_NAME"  # the job's resource name, for those calls

# The checkpoint tiers (mtc_program.tiers):
# * MTC_TIER1_DIR: this rank's directory in its node's memory (tmpfs: /dev/shm);
# * MTC_TIER2_DIR: where this rank's peer copy goes, on its buddy's node (the node of rank
#   (rank + 1) % world), so one node's loss never takes both copies;
# * MTC_TIER2_SOURCE_DIR: where the previous attempt's peer copy of this rank can be read
#   back (the same as MTC_TIER2_DIR when the placement did not change);
# * MTC_TIER2_URL, MTC_TIER2_SOURCE_URL: the same over the network, where they are given
#   (instead of the two directories): the peer store service of the buddy's node
#   (http://host:port/<job>; mtc_program.peer_store), which keeps the copy in that node's
#   memory; MTC_TIER2_TOKEN: the secret both the ranks and the services were given;
# * MTC_TIER{1,2,3}_EVERY: steps between saves of each tier (the job's own choice);
# * MTC_TIER_KEEP: entries kept per rank on tiers 1 and 2, MTC_TIER3_KEEP on the durable one;
# * MTC_RESTORE_TIMEOUT_S: how long a rank waits for the others' restorable steps;
# * MTC_RESTORE_SKIP: tiers this attempt must not restore from (comma-separated, memory or
#   peer): set by the control plane when restarts from them made no progress, so a bad
#   near-tier entry that passes its checks cannot be read again and again;
# * MTC_PROGRESS_FILE: the rank's heartbeat (JSON; mtc_program.progress says what is in it),
#   rewritten at least every MTC_PROGRESS_INTERVAL_S seconds (default 5).
TIER1_DIR = "MTC_TIER1_DIR"
TIER2_DIR = "MTC_TIER2_DIR"
TIER2_SOURCE_DIR = "MTC_TIER2_SOURCE_DIR"
TIER2_URL = "MTC_TIER2_URL"
TIER2_SOURCE_URL = "MTC_TIER2_SOURCE_URL"
TIER2_TOKEN = "MTC_TIER2_TOKEN"
TIER1_EVERY = "MTC_TIER1_EVERY"
TIER2_EVERY = "MTC_TIER2_EVERY"
TIER3_EVERY = "MTC_TIER3_EVERY"
TIER_KEEP = "MTC_TIER_KEEP"
TIER3_KEEP = "MTC_TIER3_KEEP"
RESTORE_TIMEOUT_S = "MTC_RESTORE_TIMEOUT_S"
RESTORE_SKIP = "MTC_RESTORE_SKIP"
PROGRESS_INTERVAL_S = "MTC_PROGRESS_INTERVAL_S"
PROGRESS_FILE = "MTC_PROGRESS_FILE"
DIR_VARS = (TIER1_DIR, TIER2_DIR, TIER2_SOURCE_DIR, PROGRESS_FILE)  # what an adapter sets

# The keys of the advice file (MTC_ADVICE_FILE)
ADVICE_INTERVAL_S = "MTC_CHECKPOINT_INTERVAL_S"  # the interval the job's failure rate calls for
ADVICE_MTBF_S = "MTC_CHECKPOINT_MTBF_S"
ADVICE_SAVE_S = "MTC_CHECKPOINT_SAVE_S"
ADVICE_INTERRUPTIONS = "MTC_CHECKPOINT_INTERRUPTIONS"
ADVICE_BASIS = "MTC_CHECKPOINT_BASIS"
ADVICE_AT = "MTC_CHECKPOINT_ADVICE_AT"

# Every name above, for tools that list or check them
NAMES = tuple(sorted({v for v in dict(globals()).values()
                      if isinstance(v, str) and re.fullmatch(r"[A-Z][A-Z0-9_]+", v)}))

# ---------------------------------------------------------------- exit codes

OK = 0
PREEMPTED = 75  # EX_TEMPFAIL
SIGNALLED = 128  # + N: killed by signal N


class ExitCode(enum.IntEnum):
    """The exit statuses a program gives and the adapters produce and read."""

    OK = OK
    FAILED = 1  # the program failed on its own (or its attempt could not be submitted)
    CONFIG = 2  # the program refused its configuration (a garbage variable, a bad flag)
    PREEMPTED = PREEMPTED  # checkpoint saved on SIGTERM, run me again
    NOT_EXECUTABLE = 126
    NOT_FOUND = 127
    SIGNALLED = SIGNALLED  # + N: killed by signal N
    KILLED = SIGNALLED + signal.SIGKILL  # 137: SIGKILL, or vanished leaving no code
    TERMINATED = SIGNALLED + signal.SIGTERM  # 143: SIGTERM without a handler

    @classmethod
    def for_signal(cls, signum: int) -> int:
        """The shell's status of a process killed by ``signum``."""
        return int(cls.SIGNALLED) + int(signum)

    @staticmethod
    def signal_of(code: int) -> int | None:
        """The signal that killed a worker with this status, if it was one."""
        return code - SIGNALLED if SIGNALLED < code < SIGNALLED + 65 else None


GRACEFUL = frozenset({OK, PREEMPTED})  # the program ended as asked: done, or saved and stopped

# ---------------------------------------------------------------- checkpoints and files

CHECKPOINT_PREFIX = "ckpt-"
CHECKPOINT_RE = re.compile(r"^ckpt-(\d+)(\.[A-Za-z0-9_]+)?$")
SAVE_S_SUFFIX = ".save_s"  # <checkpoint name>.save_s: the seconds the save blocked
MANIFEST_SUFFIX = ".manifest.json"  # <durable npz>.manifest.json (mtc_program.entries)
IGNORED_SUFFIXES = frozenset({".tmp", ".part", ".partial", SAVE_S_SUFFIX})
DURABLE_RE = re.compile(r"^ckpt-(\d{8,})\.npz$")  # the tiers' durable entries (numpy)

# checkpoints learnt from other names (see the module docstring)
SETTLE_S = 5.0  # an entry unchanged this long is complete (its writer has moved on)
STEP_WORD_RE = re.compile(r"(?:step|iter(?:ation)?)s?[-_=.]?(\d+)", re.IGNORECASE)
NUMBER_RE = re.compile(r"\d+")
EXTENSION_RE = re.compile(r"\.[A-Za-z][A-Za-z0-9_]{0,9}$")  # .pt, .safetensors, .pt2: not a step
TEXT_SUFFIXES = frozenset({".json", ".txt", ".log", ".yaml", ".yml", ".csv", ".md", ".lock",
                           ".env", ".out", ".err", ".py", ".sh"})
# hidden, editor backups, temporary names (tempfile's tmpXXXX; a tmp or temp word, not the
# temp in attempt), TensorBoard's event files
NOT_LEARNT_RE = re.compile(r"^[.~]|~$|^tmp|(?:^|[^a-z])te?mp(?:[^a-z]|$)|tfevents", re.IGNORECASE)

# a tier-1/2 entry: step-<step:010d>/ holding the payload, then the manifest written last
ENTRY_RE = re.compile(r"^step-(\d{10})$")
PAYLOAD, MANIFEST = "payload.npz", "manifest.json"

# The tiers by name, as the control plane's checkpoint events and recovery policy spell them
MEMORY, PEER, DURABLE = "memory", "peer", "durable"
TIERS = (MEMORY, PEER, DURABLE)  # nearest first

# beside AIP_CHECKPOINT_DIR, on the job's storage: the ranks' heartbeats and the advice
PROGRESS_DIR = "mtc-progress"
ADVICE_NAME = "mtc-advice.env"
PROGRESS_NAME = "progress.json"


def checkpoint_name(step: int, suffix: str = "") -> str:
    """The name of the checkpoint of ``step`` (``ckpt-00000100`` and an optional suffix)."""
    return f"{CHECKPOINT_PREFIX}{step:08d}{suffix}"


def learnt_step(name: str) -> int | None:
    """The step of a checkpoint not named ``ckpt-<step>`` (see the module docstring); None
    for a name that is not one. The number after ``step``/``iter`` where there is one: a
    name that also counts epochs (``epoch=2-step=300``) means the step."""
    ext = EXTENSION_RE.search(name)
    if NOT_LEARNT_RE.search(name) or (ext and ext.group().lower() in
                                       TEXT_SUFFIXES | IGNORED_SUFFIXES):
        return None
    stem = name[:ext.start()] if ext else name
    worded = STEP_WORD_RE.findall(stem)
    numbers = worded or NUMBER_RE.findall(stem)
    return int(numbers[-1]) if numbers else None


def entry_name(step: int) -> str:
    """A tier-1/2 entry's directory name (``step-0000000100``)."""
    return f"step-{step:010d}"


def rank_dir(rank: int) -> str:
    """A rank's own entries under its node's memory root (``<root>/<job>/rank-<r>``)."""
    return f"rank-{rank}"


def peer_dir(rank: int) -> str:
    """The peer copies a node holds for the rank whose buddy it is (``<root>/<job>/peer/...``)."""
    return f"peer/rank-{rank}"


def progress_name(rank: int) -> str:
    """A rank's heartbeat file under ``PROGRESS_DIR``."""
    return f"rank-{rank}.json"
