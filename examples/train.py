"""A small, deterministic training program that behaves like a well-mannered managed job.

It trains a two-layer MLP (tanh hidden layer with dropout, Adam) on a synthetic regression
data set, numpy only, and shows the contract mtc expects from a training program:

* it reads the environment a managed service gives (``CLOUD_ML_JOB_ID``, ``CLUSTER_SPEC``,
  ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``AIP_CHECKPOINT_DIR``,
  ``AIP_MODEL_DIR``, ``AIP_TENSORBOARD_LOG_DIR``) and names the variable when one is garbage;
* rank 0 writes checkpoints atomically every ``--checkpoint-every`` steps as
  ``ckpt-<step:08d>.npz`` (temp file in the same directory, fsync, ``os.replace``) and then
  replaces a ``LATEST`` marker holding that file name the same way;
* on SIGTERM (or SIGINT) it finishes the current step, saves a checkpoint and exits with
  ``EXIT_PREEMPTED`` (75, EX_TEMPFAIL): "preempted, checkpoint saved, run me again";
* on start it resumes from the newest checkpoint that loads (temp and corrupt files are
  skipped) and logs ``resumed from step N``;
* at the end rank 0 writes ``AIP_MODEL_DIR/model.npz`` and every rank exits 0;
* rank 0 writes TensorBoard scalars (tensorboardX) into ``AIP_TENSORBOARD_LOG_DIR/attempt-<n>/``
  (``n``: ``MTC_JOB_ATTEMPT``, else the next free), one run per attempt. An attempt writes only
  steps above the highest step earlier attempts' event files hold (steps recomputed after a
  resume never appear twice), and drains its writer to disk before each checkpoint (so the
  files reach the resume step: no gap). Without tensorboardX it warns and trains on; it
  imports tensorboardX without torch (``import_tensorboardx``), which it never needs;
* under mtc it restarts in process (``MTC_RESTART_FILE``, ``shared.program.inprocess``):
  asked to hold, it saves as on SIGTERM and waits; told to restart, it takes the next
  attempt's environment and log and restores from its tiers without a new process.
"""

from __future__ import annotations

import os

# One BLAS thread: the same reductions in the same order on every run and every rank.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from types import FrameType  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from numpy.typing import NDArray  # noqa: E402

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_CONFIG = 2
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: stopped on request after saving a checkpoint

CHECKPOINT_RE = re.compile(r"^ckpt-(\d{8,})\.npz$")
LATEST = "LATEST"
PARAMS = ("w1", "b1", "w2", "b2")

# The synthetic problem. Fixed: a checkpoint is only meaningful for the problem it came from.
N_SAMPLES = 512
N_FEATURES = 8
HIDDEN = 16
BATCH = 64
DROPOUT = 0.1
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8

Array = NDArray[np.float64]


class ConfigError(Exception):
    """Bad configuration (environment or flags): exit 2 with the variable's name."""


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class Env:
    job_id: str
    rank: int
    world_size: int
    master_addr: str
    master_port: int | None
    cluster_spec: dict[str, Any] | None
    checkpoint_dir: Path
    model_dir: Path
    tensorboard_dir: Path | None
    attempt: int | None  # MTC_JOB_ATTEMPT: names the TensorBoard run


def _int_var(env: dict[str, str], name: str, default: int, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {raw!r}")
    return value


def read_env(env: dict[str, str]) -> Env:
    """Read and check what the managed service put in the environment."""
    spec: dict[str, Any] | None = None
    raw_spec = env.get("CLUSTER_SPEC", "").strip()
    if raw_spec:
        try:
            parsed = json.loads(raw_spec)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"CLUSTER_SPEC is not valid JSON: {exc}") from None
        if not isinstance(parsed, dict):
            raise ConfigError("CLUSTER_SPEC must be a JSON object")
        spec = parsed
    spec_rank: int | None = None
    if spec is not None and "task" in spec:
        task = spec["task"]
        index = task.get("index") if isinstance(task, dict) else None
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ConfigError(f"CLUSTER_SPEC task.index must be an integer >= 0, got {index!r}")
        # the index is within the task's pool; RANK counts the pools before it too
        pool = re.fullmatch(r"workerpool(\d+)", str(task.get("type", "workerpool0")))
        cluster = spec.get("cluster")
        pools: dict[str, Any] = cluster if isinstance(cluster, dict) else {}
        before = [pools.get(f"workerpool{i}") for i in range(int(pool[1]) if pool else 0)]
        offset: int = sum(len(p) for p in before if isinstance(p, list))
        spec_rank = index + offset
    rank = _int_var(env, "RANK", spec_rank if spec_rank is not None else 0, 0)
    if spec_rank is not None and rank != spec_rank:
        raise ConfigError(f"RANK={rank} disagrees with CLUSTER_SPEC task.index={spec_rank}")
    world_size = _int_var(env, "WORLD_SIZE", 1, 1)
    if rank >= world_size:
        raise ConfigError(f"RANK={rank} must be smaller than WORLD_SIZE={world_size}")
    port_raw = env.get("MASTER_PORT", "").strip()
    master_port = _int_var(env, "MASTER_PORT", 0, 1) if port_raw else None
    if master_port is not None and master_port > 65535:
        raise ConfigError(f"MASTER_PORT must be a port number (1-65535), got {port_raw!r}")
    out = Path(env.get("MTC_TRAIN_OUTPUT", "train-output"))
    tb = env.get("AIP_TENSORBOARD_LOG_DIR", "").strip()
    attempt = _int_var(env, "MTC_JOB_ATTEMPT", 0, 1) if env.get("MTC_JOB_ATTEMPT", "").strip() else None
    return Env(
        job_id=env.get("CLOUD_ML_JOB_ID", "local") or "local",
        rank=rank,
        world_size=world_size,
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=master_port,
        cluster_spec=spec,
        checkpoint_dir=Path(env.get("AIP_CHECKPOINT_DIR", "").strip() or out / "checkpoints"),
        model_dir=Path(env.get("AIP_MODEL_DIR", "").strip() or out / "model"),
        tensorboard_dir=Path(tb) if tb else None,
        attempt=attempt,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=200, help="total optimizer steps")
    p.add_argument("--checkpoint-every", type=int, default=50, help="0: only on exit")
    p.add_argument("--step-time", type=float, default=0.0, help="seconds to sleep per step")
    p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0, help="data, init and dropout seed")
    args = p.parse_args(argv)
    if args.steps < 0 or args.checkpoint_every < 0 or args.step_time < 0 or args.lr <= 0:
        p.error("--steps, --checkpoint-every and --step-time must be >= 0 and --lr > 0")
    return args


# ---------------------------------------------------------------- the model


@dataclass
class State:
    """Everything the next step depends on; exactly what a checkpoint holds."""

    step: int
    params: dict[str, Array]
    m: dict[str, Array]
    v: dict[str, Array]
    rng: np.random.Generator  # dropout masks; its state is saved with the weights


def dataset(seed: int) -> tuple[Array, Array]:
    """A fixed synthetic regression problem: a noisy nonlinear function of 8 features."""
    g = np.random.default_rng([seed, 1])
    x = g.standard_normal((N_SAMPLES, N_FEATURES))
    w = g.standard_normal((N_FEATURES, 1))
    y = np.sin(x @ w) + 0.1 * x[:, :1] ** 2 + 0.05 * g.standard_normal((N_SAMPLES, 1))
    return x, y


def initial_state(seed: int) -> State:
    g = np.random.default_rng([seed, 2])
    params = {
        "w1": g.standard_normal((N_FEATURES, HIDDEN)) / np.sqrt(N_FEATURES),
        "b1": np.zeros(HIDDEN),
        "w2": g.standard_normal((HIDDEN, 1)) / np.sqrt(HIDDEN),
        "b2": np.zeros(1),
    }
    zeros = {k: np.zeros_like(p) for k, p in params.items()}
    return State(
        step=0,
        params=params,
        m=zeros,
        v={k: z.copy() for k, z in zeros.items()},
        rng=np.random.default_rng([seed, 3]),
    )


def train_step(state: State, x: Array, y: Array, lr: float, seed: int) -> float:
    """One Adam step on a minibatch chosen by the step number alone; returns the loss."""
    batch = np.random.default_rng([seed, 4, state.step]).choice(N_SAMPLES, BATCH, replace=False)
    xb, yb = x[batch], y[batch]
    p = state.params
    pre = xb @ p["w1"] + p["b1"]
    h = np.tanh(pre)
    mask = (state.rng.random(h.shape) >= DROPOUT) / (1.0 - DROPOUT)
    hd = h * mask
    out = hd @ p["w2"] + p["b2"]
    err = out - yb
    loss = float(np.mean(err**2))
    d_out = 2.0 * err / BATCH
    grads = {"w2": hd.T @ d_out, "b2": d_out.sum(axis=0)}
    d_pre = (d_out @ p["w2"].T) * mask * (1.0 - h**2)
    grads["w1"] = xb.T @ d_pre
    grads["b1"] = d_pre.sum(axis=0)
    t = state.step + 1
    for k in PARAMS:
        state.m[k] = ADAM_B1 * state.m[k] + (1 - ADAM_B1) * grads[k]
        state.v[k] = ADAM_B2 * state.v[k] + (1 - ADAM_B2) * grads[k] ** 2
        m_hat = state.m[k] / (1 - ADAM_B1**t)
        v_hat = state.v[k] / (1 - ADAM_B2**t)
        p[k] = p[k] - lr * m_hat / (np.sqrt(v_hat) + ADAM_EPS)
    state.step = t
    return loss


def weights_digest(params: dict[str, Array]) -> str:
    """A short hash of the raw weight bytes: ranks and runs compare it in their logs."""
    h = hashlib.sha256()
    for k in PARAMS:
        h.update(np.ascontiguousarray(params[k]).tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- checkpoints


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some file systems cannot fsync a directory
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: Path, write: Any, before_rename: Any = None) -> None:
    """Write through ``write(file)`` into a temp file beside ``path``, fsync, rename over it
    (``before_rename()`` runs just before the rename: the file is complete, not yet visible)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}.npz"


def state_arrays(state: State, lr: float, seed: int) -> dict[str, Any]:
    """What a checkpoint holds, by name (the npz members; the tiers' payload too)."""
    arrays: dict[str, Any] = {f"param_{k}": state.params[k] for k in PARAMS}
    arrays.update({f"m_{k}": state.m[k] for k in PARAMS})
    arrays.update({f"v_{k}": state.v[k] for k in PARAMS})
    arrays["step"] = np.array(state.step, dtype=np.int64)
    arrays["rng_state"] = np.array(json.dumps(state.rng.bit_generator.state))
    arrays["config"] = np.array(json.dumps({"lr": lr, "seed": seed, "hidden": HIDDEN}))
    return arrays


def save_checkpoint(directory: Path, state: State, lr: float, seed: int) -> Path:
    """Atomically write ``ckpt-<step>.npz``, then point ``LATEST`` at it."""
    directory.mkdir(parents=True, exist_ok=True)
    arrays = state_arrays(state, lr, seed)
    path = directory / checkpoint_name(state.step)
    began = time.monotonic()

    def timed() -> None:  # the save's cost, beside it before it appears (mtc's checkpoint advice)
        cost = max(time.monotonic() - began, 1e-6)
        atomic_write(path.with_name(path.name + ".save_s"), lambda f: f.write(f"{cost:.6f}\n".encode()))

    atomic_write(path, lambda f: np.savez(f, **arrays), timed)
    atomic_write(directory / LATEST, lambda f: f.write(f"{path.name}\n".encode()))
    return path


def load_checkpoint(path: Path, seed: int) -> State:
    """Load and check one checkpoint; raises on anything partial or inconsistent."""
    match = CHECKPOINT_RE.match(path.name)
    if not match:
        raise ValueError("not a checkpoint file name")
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return state_from_arrays(arrays, int(match.group(1)), seed)


def state_from_arrays(arrays: Any, step_named: int, seed: int) -> State:
    """A state from a checkpoint's arrays; raises on anything partial or inconsistent."""
    step = int(arrays["step"])
    config = json.loads(str(arrays["config"]))
    params = {k: np.array(arrays[f"param_{k}"], dtype=np.float64) for k in PARAMS}
    m = {k: np.array(arrays[f"m_{k}"], dtype=np.float64) for k in PARAMS}
    v = {k: np.array(arrays[f"v_{k}"], dtype=np.float64) for k in PARAMS}
    rng_state = json.loads(str(arrays["rng_state"]))
    if step != step_named:
        raise ValueError(f"holds step {step}, not the step in its name")
    if config.get("seed") != seed or config.get("hidden") != HIDDEN:
        raise ValueError(f"written for another problem ({config}); refusing to resume")
    expected = initial_state(seed)
    for k in PARAMS:
        for name, got in (("param", params[k]), ("m", m[k]), ("v", v[k])):
            if got.shape != expected.params[k].shape:
                raise ValueError(f"{name}_{k} has shape {got.shape}")
    rng = np.random.default_rng()
    rng.bit_generator.state = rng_state
    return State(step=step, params=params, m=m, v=v, rng=rng)


def newest_checkpoint(directory: Path, seed: int, log: Any) -> State | None:
    """The newest checkpoint that loads. Temp files never match the name; corrupt ones are
    skipped with a log line. The scan is authoritative: LATEST is a hint for tools and
    people, and may lag one rename behind after a crash."""
    if not directory.is_dir():
        return None
    found = sorted(
        ((int(m.group(1)), p) for p in directory.iterdir() if (m := CHECKPOINT_RE.match(p.name))),
        reverse=True,
    )
    for _, path in found:
        try:
            return load_checkpoint(path, seed)
        except Exception as exc:  # any way a file can be broken: skip it, try the next
            log(f"skipping checkpoint {path.name}: {type(exc).__name__}: {exc}")
    return None


def save_model(directory: Path, state: State) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.npz"
    arrays: dict[str, Any] = {k: state.params[k] for k in PARAMS}
    arrays["step"] = np.array(state.step, dtype=np.int64)
    atomic_write(path, lambda f: np.savez(f, **arrays))
    return path


# ---------------------------------------------------------------- TensorBoard

ATTEMPT_RE = re.compile(r"^attempt-(\d+)$")


def last_written_step(root: Path, event_cls: Any) -> int:
    """The highest step of a summary in the event files under ``root/attempt-*/``; a torn
    record at a file's end (a killed writer) ends that file."""
    best = 0
    for path in sorted(root.glob("attempt-*/events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos + 12 <= len(data):  # TFRecord: u64 length, u32 crc, data, u32 crc
            (length,) = struct.unpack_from("<Q", data, pos)
            if (end := pos + 16 + length) > len(data):
                break
            event = event_cls()
            try:
                event.ParseFromString(data[pos + 12 : end - 4])
            except Exception:  # a garbled record: nothing after it is trusted
                break
            best = max(best, int(event.step)) if event.summary.value else best
            pos = end
    return best


def import_tensorboardx() -> tuple[Any, Any]:
    """tensorboardX's writer and event classes, without torch: tensorboardX imports torch
    when it is installed (only to accept tensors, which this numpy program never passes),
    and that import was most of the chief's start (2-3 s idle, 9-14 s on a loaded machine).
    ``sys.modules["torch"] = None`` makes its guarded ``import torch`` fail fast; the entry
    is put back as it was, so a later ``import torch`` elsewhere still works."""
    had = "torch" in sys.modules
    saved = sys.modules.get("torch")
    if not had:
        sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        from tensorboardX import SummaryWriter
        from tensorboardX.proto.event_pb2 import Event
    finally:
        if not had:
            sys.modules.pop("torch", None)
        elif saved is not None:
            sys.modules["torch"] = saved
    return SummaryWriter, Event


class Scalars:
    """TensorBoard scalars of one attempt (see the module docstring for the rule)."""

    def __init__(self, root: Path, attempt: int | None, log: Any) -> None:
        self._writer: Any = None
        self._cls: Any = None
        try:
            SummaryWriter, Event = import_tensorboardx()
        except ImportError as exc:
            print(f"train.py: warning: no TensorBoard scalars: {exc}", file=sys.stderr, flush=True)
            self.written = 0
            return
        self._cls = SummaryWriter
        root.mkdir(parents=True, exist_ok=True)
        if attempt is None:
            seen = [int(m.group(1)) for p in root.iterdir() if (m := ATTEMPT_RE.match(p.name))]
            attempt = max(seen, default=0) + 1
        self.run_dir = root / f"attempt-{attempt}"
        self.written = last_written_step(root, Event)
        if self.written:
            log(f"tensorboard: {self.run_dir} gets steps after {self.written}")

    def add(self, step: int, values: dict[str, float]) -> None:
        if self._cls is None or step <= self.written:
            return
        if self._writer is None:  # one event file per stretch between checkpoints
            self._writer = self._cls(logdir=str(self.run_dir), flush_secs=5,
                                     filename_suffix=f".from-{step:08d}")
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()  # what the writer's thread has written: TensorBoard shows it live
        self.written = step

    def close(self) -> None:
        """Drain the writer's queue to disk (before a checkpoint, and at exit)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None


# ---------------------------------------------------------------- main


class Preemption:
    """Turns SIGTERM/SIGINT into a flag the loop reads between steps."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum

    def sleep(self, seconds: float, wake: Any = None) -> None:
        """Sleep, but wake up soon after a signal (or when ``wake()`` says so: an order to
        hold) so preemption is prompt."""
        deadline = time.monotonic() + seconds
        while self.signum is None and (left := deadline - time.monotonic()) > 0:
            if wake is not None and wake():
                return
            time.sleep(min(left, 0.02))


def run(args: argparse.Namespace, env: Env, preemption: Preemption) -> int:
    """Train; where mtc restarts this process in place (``MTC_RESTART_FILE``), go on as the
    next attempt's rank when told, without a new process (``open_restart``)."""
    restart = open_restart()
    if restart is not None and os.environ.pop("MTC_STANDBY", ""):  # a warm standby: wait
        print(f"[{env.job_id} standby] ready: waiting to be given a rank", flush=True)
        order = restart.standby(lambda: preemption.signum is not None)
        if order is None:
            return EXIT_PREEMPTED
        restart.apply(order)
        env = read_env(dict(os.environ))
    while True:
        result = train(args, env, preemption, restart)
        if isinstance(result, int):
            return result
        restart.apply(result)  # the new attempt's environment and log
        try:
            env = read_env(dict(os.environ))
        except ConfigError as exc:
            print(f"train.py: configuration error: {exc}", file=sys.stderr, flush=True)
            return EXIT_CONFIG


def train(args: argparse.Namespace, env: Env, preemption: Preemption, restart: Any) -> Any:
    """One attempt: its exit code, or the order to restart in process as the next one."""
    def log(msg: str) -> None:
        print(f"[{env.job_id} rank {env.rank}/{env.world_size}] {msg}", flush=True)

    chief = env.rank == 0
    where = f"{env.master_addr}:{env.master_port}" if env.master_port else env.master_addr
    log(f"starting: steps={args.steps} lr={args.lr} master={where} ckpt={env.checkpoint_dir}")
    x, y = dataset(args.seed)
    tiers = open_tiers(args, env, log)
    state = restore_tiered(tiers, args.seed, log) if tiers else newest_checkpoint(
        env.checkpoint_dir, args.seed, log)
    if state is None:
        state = initial_state(args.seed)
        log("no checkpoint found: starting from step 0")
    else:
        log(f"resumed from step {state.step}")
    saved_step = state.step if state.step > 0 else -1
    metrics = None
    if chief and env.tensorboard_dir is not None:
        metrics = Scalars(env.tensorboard_dir, env.attempt, log)

    orders: list[Any] = []

    def ordered() -> bool:  # the adapter asked this rank to hold (or to restart)
        if restart is not None and not orders and (order := restart.poll()) is not None:
            orders.append(order)
        return bool(orders)

    def checkpoint() -> Path:
        if metrics is not None:
            metrics.close()  # the scalars reach the checkpoint's step before it exists
        if tiers is None:
            return save_checkpoint(env.checkpoint_dir, state, args.lr, args.seed)
        done = tiers.due(state.step)  # saved at this step already
        which = tuple(t for t in TIER_NAMES if t == "durable" or t not in done)
        return save_tiered(tiers, state, args, env.checkpoint_dir, which, log)

    try:
        every_log = max(1, args.steps // 10)
        while state.step < args.steps:
            loss = train_step(state, x, y, args.lr, args.seed)
            if metrics is not None:
                metrics.add(state.step, {"loss": loss})
            if state.step % every_log == 0:
                log(f"step {state.step} loss {loss:.6f}")
            if tiers is not None:
                due = tiers.due(state.step)
                if "durable" in due and metrics is not None:
                    metrics.close()
                if due:
                    save_tiered(tiers, state, args, env.checkpoint_dir, due, log)
                    saved_step = state.step if "durable" in due else saved_step
                    if "memory" in due:  # in step, as data-parallel ranks are
                        barrier(env, state.step, lambda: preemption.signum is not None
                                or ordered())
                else:
                    tiers.step_done(state.step)
            elif chief and args.checkpoint_every and state.step % args.checkpoint_every == 0:
                path = checkpoint()
                saved_step = state.step
                log(f"checkpoint saved: {path.name}")
            preemption.sleep(args.step_time, ordered)
            if (preemption.signum is not None or ordered()) and state.step < args.steps:
                if orders and orders[0].action == "restart":
                    return orders[0]  # (not held first: drop the step, go on as told)
                if (chief or tiers is not None) and saved_step != state.step:
                    path = checkpoint()
                    if tiers is None:
                        log(f"checkpoint saved: {path.name}")
                if tiers is not None:
                    tiers.close()  # the memory and peer copies are written before the exit
                if preemption.signum is None:  # held: wait to be taken by the next attempt
                    restart.held(orders[0])
                    log(f"held at step {state.step}: waiting to restart in process")
                    order = restart.wait(orders[0], lambda: preemption.signum is not None)
                    if order is not None:
                        log(f"restarting in process (order {order.generation})")
                        return order
                name = "the hold expired" if preemption.signum is None else \
                    f"{signal.Signals(preemption.signum).name} received"
                log(f"{name}: preempted at step {state.step}, exiting {EXIT_PREEMPTED}")
                return EXIT_PREEMPTED
    finally:
        if metrics is not None:
            metrics.close()
    if (chief or tiers is not None) and saved_step != state.step:
        path = checkpoint()
        if tiers is None:
            log(f"checkpoint saved: {path.name}")
    if tiers is not None:
        tiers.close()
    if chief:
        log(f"model saved: {save_model(env.model_dir, state)}")
    log(f"done at step {state.step}: weights sha256 {weights_digest(state.params)}")
    return EXIT_OK


# ---------------------------------------------------------------- checkpoint tiers


def barrier(env: Env, step: int, stop: Any, poll_s: float = 0.002) -> bool:
    """Wait until every rank of this attempt has reached ``step`` (a file per rank in the
    checkpoint directory: the cheapest collective a numpy program has), so the ranks' tier
    entries share their steps as a data-parallel job's do. True when all arrived; False
    when ``stop()`` (a SIGTERM, an order to hold) came first: a dead peer never deadlocks."""
    if env.world_size <= 1:
        return True
    where = env.checkpoint_dir / "mtc-barrier" / f"attempt-{env.attempt or 0}"
    where.mkdir(parents=True, exist_ok=True)
    mine = where / f"rank-{env.rank}"
    tmp = where / f".rank-{env.rank}.{os.getpid()}.tmp"
    tmp.write_text(str(step))  # no fsync: a barrier outlives no crash of the node
    os.replace(tmp, mine)  # whole or not at all

    def arrived(rank: int) -> bool:
        try:
            return int((where / f"rank-{rank}").read_text() or -1) >= step
        except (OSError, ValueError):
            return False

    waiting = [r for r in range(env.world_size) if r != env.rank]
    while waiting:
        waiting = [r for r in waiting if not arrived(r)]
        if waiting and stop():
            return False
        if waiting:
            time.sleep(poll_s)
    return True

TIER_NAMES = ("memory", "peer", "durable")


def mtc_library() -> None:
    """Import mtc's program library from this checkout first (it is beside this file)."""
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "shared" / "program" / "tiers.py").is_file() and str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))


def open_restart() -> Any:
    """Declare that this program restarts in process (``shared.program.inprocess``) when
    the managed environment offers it (``MTC_RESTART_FILE``); else None: today's restart."""
    if not os.environ.get("MTC_RESTART_FILE", "").strip():
        return None
    mtc_library()
    from shared.program.inprocess import InProcessRestart
    restart = InProcessRestart.from_env()
    if restart is not None:
        restart.declare()
    return restart


def open_tiers(args: argparse.Namespace, env: Env, log: Any) -> Any:
    """mtc's checkpoint tiers (``shared.program.tiers``) when the managed environment names
    them (``MTC_TIER1_DIR``), else None: durable checkpoints only, as before. Every rank
    saves its own memory and peer copies; rank 0 the durable one (the state is replicated)."""
    if not os.environ.get("MTC_TIER1_DIR", "").strip():
        return None
    mtc_library()
    from shared.program.tiers import TieredCheckpointer, TierSettings
    try:
        settings = TierSettings.from_env(
            dict(os.environ), durable_dir=env.checkpoint_dir, rank=env.rank,
            world_size=env.world_size, tier3_every=args.checkpoint_every, replicated=True)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    log(f"checkpoint tiers: memory every {settings.tier1_every}, peer every "
        f"{settings.tier2_every}, durable every {settings.tier3_every} steps")
    return TieredCheckpointer(settings, log)


def restore_tiered(tiers: Any, seed: int, log: Any) -> State | None:
    """The newest step every rank can restore, from the nearest tier that holds it."""
    restored = tiers.restore()
    if restored is None:
        return None
    log(f"restoring step {restored.step} from the {restored.tier} tier ({restored.path})")
    return state_from_arrays(restored.state, restored.step, seed)


def save_tiered(tiers: Any, state: State, args: argparse.Namespace, directory: Path,
                which: tuple[str, ...], log: Any) -> Path:
    """Save to the tiers ``which``; the durable one also points ``LATEST`` at its file."""
    report = tiers.save(state.step, state_arrays(state, args.lr, args.seed), which)
    path = directory / checkpoint_name(state.step)
    if "durable" in report.tiers:
        atomic_write(directory / LATEST, lambda f: f.write(f"{path.name}\n".encode()))
        log(f"checkpoint saved: {path.name}")
    log(f"tiers {'+'.join(report.tiers)} saving step {state.step}: blocked "
        f"{report.blocking_s * 1000:.2f} ms")
    return path


def main(argv: list[str] | None = None) -> int:
    preemption = Preemption()
    preemption.install()  # first, so a signal during start-up is not lost
    args = parse_args(argv)
    try:
        env = read_env(dict(os.environ))
    except ConfigError as exc:
        print(f"train.py: configuration error: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    return run(args, env, preemption)


if __name__ == "__main__":
    sys.exit(main())
