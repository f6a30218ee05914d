"""A small, deterministic training program on mtc's in-job SDK (``mtc_program``): a
two-layer MLP (tanh, dropout, Adam) on a synthetic regression problem, numpy only, that
behaves as mtc expects a training program to:

* it reads the managed environment and exits 2 naming a garbage variable;
* rank 0 saves ``ckpt-<step:08d>.npz`` every ``--checkpoint-every`` steps (atomically, its
  save time beside it) and points ``LATEST`` at it; where mtc gives checkpoint tiers
  (``MTC_TIER1_DIR``) every rank also saves to its node's memory and a peer node in between;
* on SIGTERM it finishes the step, saves and exits 75 ("saved, run me again"); on start it
  resumes from the newest checkpoint that loads (with tiers: the newest step every rank
  holds, nearest tier first) and logs ``resumed from step N``;
* at the end rank 0 writes ``AIP_MODEL_DIR/model.npz``; rank 0 writes TensorBoard scalars,
  one curve across attempts;
* under mtc it restarts in process (``MTC_RESTART_FILE``): asked to hold, it saves and waits;
  told to restart, it takes the next attempt's environment and log and restores without a
  new process; started as a warm standby, it waits to be given a rank.
"""

from __future__ import annotations

import os

# One BLAS thread: the same reductions in the same order on every run and every rank.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from numpy.typing import NDArray  # noqa: E402

# the SDK from this checkout (installed, `pip install ./shared/sdk`, it needs no path)
if (_sdk := Path(__file__).resolve().parents[1] / "shared" / "sdk").is_dir():
    sys.path.insert(0, str(_sdk))

from mtc_program import entries  # noqa: E402
from mtc_program.cut import barrier  # noqa: E402
from mtc_program.env import ConfigError  # noqa: E402
from mtc_program.env import ManagedEnv as Env  # noqa: E402
from mtc_program.inprocess import RESTART, InProcessRestart, Order  # noqa: E402
from mtc_program.protocol import DURABLE, MEMORY, STANDBY, TIERS, ExitCode, checkpoint_name  # noqa: E402
from mtc_program.scalars import Scalars  # noqa: E402
from mtc_program.signals import Preemption  # noqa: E402
from mtc_program.tiers import TieredCheckpointer, TierSettings  # noqa: E402

LATEST = "LATEST"  # a hint for tools and people; the resume scans the checkpoints themselves
PARAMS = ("w1", "b1", "w2", "b2")
# The synthetic problem. Fixed: a checkpoint is only meaningful for the problem it came from.
N_SAMPLES, N_FEATURES, HIDDEN, BATCH, DROPOUT = 512, 8, 16, 64, 0.1
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8

Array = NDArray[np.float64]


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
    params = {"w1": g.standard_normal((N_FEATURES, HIDDEN)) / np.sqrt(N_FEATURES),
              "b1": np.zeros(HIDDEN), "w2": g.standard_normal((HIDDEN, 1)) / np.sqrt(HIDDEN),
              "b2": np.zeros(1)}
    return State(step=0, params=params, m={k: np.zeros_like(p) for k, p in params.items()},
                 v={k: np.zeros_like(p) for k, p in params.items()},
                 rng=np.random.default_rng([seed, 3]))


def train_step(state: State, x: Array, y: Array, lr: float, seed: int) -> float:
    """One Adam step on a minibatch chosen by the step number alone; returns the loss."""
    batch = np.random.default_rng([seed, 4, state.step]).choice(N_SAMPLES, BATCH, replace=False)
    xb, yb, p = x[batch], y[batch], state.params
    h = np.tanh(xb @ p["w1"] + p["b1"])
    mask = (state.rng.random(h.shape) >= DROPOUT) / (1.0 - DROPOUT)
    hd = h * mask
    err = hd @ p["w2"] + p["b2"] - yb
    loss = float(np.mean(err**2))
    d_out = 2.0 * err / BATCH
    d_pre = (d_out @ p["w2"].T) * mask * (1.0 - h**2)
    grads = {"w2": hd.T @ d_out, "b2": d_out.sum(axis=0), "w1": xb.T @ d_pre,
             "b1": d_pre.sum(axis=0)}
    t = state.step + 1
    for k in PARAMS:
        state.m[k] = ADAM_B1 * state.m[k] + (1 - ADAM_B1) * grads[k]
        state.v[k] = ADAM_B2 * state.v[k] + (1 - ADAM_B2) * grads[k] ** 2
        m_hat, v_hat = state.m[k] / (1 - ADAM_B1**t), state.v[k] / (1 - ADAM_B2**t)
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


def state_arrays(state: State, args: argparse.Namespace) -> dict[str, Any]:
    """What a checkpoint holds, by name (the npz members; the tiers' payload too)."""
    arrays: dict[str, Any] = {f"{kind}_{k}": getattr(state, attr)[k] for kind, attr in
                              (("param", "params"), ("m", "m"), ("v", "v")) for k in PARAMS}
    arrays["step"] = np.array(state.step, dtype=np.int64)
    arrays["rng_state"] = np.array(json.dumps(state.rng.bit_generator.state))
    arrays["config"] = np.array(json.dumps({"lr": args.lr, "seed": args.seed, "hidden": HIDDEN}))
    return arrays


def state_from_arrays(arrays: Any, step_named: int, seed: int) -> State:
    """A state from a checkpoint's arrays; raises on anything partial or inconsistent."""
    step, config = int(arrays["step"]), json.loads(str(arrays["config"]))
    if step != step_named:
        raise ValueError(f"holds step {step}, not the step in its name")
    if config.get("seed") != seed or config.get("hidden") != HIDDEN:
        raise ValueError(f"written for another problem ({config}); refusing to resume")
    got = {kind: {k: np.array(arrays[f"{kind}_{k}"], dtype=np.float64) for k in PARAMS}
           for kind in ("param", "m", "v")}
    expected = initial_state(seed).params
    for kind, values in got.items():
        for k, value in values.items():
            if value.shape != expected[k].shape:
                raise ValueError(f"{kind}_{k} has shape {value.shape}")
    rng = np.random.default_rng()
    rng.bit_generator.state = json.loads(str(arrays["rng_state"]))
    return State(step=step, params=got["param"], m=got["m"], v=got["v"], rng=rng)


def open_tiers(args: argparse.Namespace, env: Env, log: Any) -> TieredCheckpointer:
    """Durable checkpoints every ``--checkpoint-every`` steps (rank 0's: the state is
    replicated) and, where the managed environment names tiers, every rank's memory and peer
    copies in between."""
    try:
        settings = TierSettings.from_env(os.environ, durable_dir=env.checkpoint_dir, rank=env.rank,
                                         world_size=env.world_size,
                                         tier3_every=args.checkpoint_every, replicated=True)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if settings.tiered:
        log(f"checkpoint tiers: memory every {settings.tier1_every}, peer every "
            f"{settings.tier2_every}, durable every {settings.tier3_every} steps")
    return TieredCheckpointer(settings, log)


def restore(tiers: TieredCheckpointer, env: Env, seed: int, log: Any) -> State | None:
    """With tiers: the newest step every rank holds, from the nearest tier. Without: the
    newest durable checkpoint that loads (a torn or foreign one is skipped)."""
    if tiers.settings.tiered:
        if (restored := tiers.restore()) is None:
            return None
        log(f"restoring step {restored.step} from the {restored.tier} tier ({restored.path})")
        return state_from_arrays(restored.state, restored.step, seed)
    for entry in entries.list_durable(env.checkpoint_dir, env.rank, env.world_size):
        try:
            return state_from_arrays(entries.decode(entry.path), entry.step, seed)
        except Exception as exc:  # any way a file can be broken: skip it, try the next
            log(f"skipping checkpoint {entry.path.name}: {type(exc).__name__}: {exc}")
    return None


def save(tiers: TieredCheckpointer, state: State, args: argparse.Namespace,
         which: tuple[str, ...], log: Any) -> None:
    """Save to the tiers ``which``; a durable save also points ``LATEST`` at its file."""
    report = tiers.save(state.step, state_arrays(state, args), which)
    if DURABLE in report.tiers:
        name = checkpoint_name(state.step, ".npz")
        entries.atomic_file(tiers.settings.durable_dir / LATEST, f"{name}\n".encode())
        log(f"checkpoint saved: {name}")
    if tiers.settings.tiered:
        log(f"tiers {'+'.join(report.tiers)} saving step {state.step}: blocked "
            f"{report.blocking_s * 1000:.2f} ms")


# ---------------------------------------------------------------- the attempt


def train(args: argparse.Namespace, env: Env, preemption: Preemption,
          restart: InProcessRestart | None) -> int | Order:
    """One attempt: its exit code, or the order to go on, in this process, as the next one."""
    def log(msg: str) -> None:
        print(f"[{env.job_id} rank {env.rank}/{env.world_size}] {msg}", flush=True)

    where = f"{env.master_addr}:{env.master_port}" if env.master_port else env.master_addr
    log(f"starting: steps={args.steps} lr={args.lr} master={where} ckpt={env.checkpoint_dir}")
    x, y = dataset(args.seed)
    tiers = open_tiers(args, env, log)
    state = restore(tiers, env, args.seed, log)
    if state is None:
        state = initial_state(args.seed)
        log("no checkpoint found: starting from step 0")
    else:
        log(f"resumed from step {state.step}")
    saved = state.step if state.step > 0 else -1
    metrics = Scalars(env.tensorboard_dir, env.attempt, log, enabled=env.chief, live=True)
    orders: list[Order] = []

    def ordered() -> bool:  # the adapter asked this rank to hold (or to restart)
        if restart is not None and not orders and (order := restart.poll()) is not None:
            orders.append(order)
        return bool(orders)

    def checkpoint(which: tuple[str, ...]) -> None:
        nonlocal saved
        if DURABLE in which:
            metrics.close()  # the scalars reach the checkpoint's step before it exists
            saved = state.step
        save(tiers, state, args, which, log)

    def last_checkpoint() -> None:  # durable, and the near tiers not saved at this step yet
        if saved != state.step:
            done = tiers.due(state.step)
            checkpoint(tuple(t for t in TIERS if t == DURABLE or t not in done))
        tiers.close()  # the memory and peer copies are written before the exit

    try:
        every_log = max(1, args.steps // 10)
        while state.step < args.steps:
            loss = train_step(state, x, y, args.lr, args.seed)
            metrics.add(state.step, {"loss": loss})
            if state.step % every_log == 0:
                log(f"step {state.step} loss {loss:.6f}")
            if due := tiers.due(state.step):
                checkpoint(due)
                if MEMORY in due:  # in step, as data-parallel ranks are
                    barrier(env.checkpoint_dir, env.rank, env.world_size, env.attempt,
                            state.step, lambda: preemption.requested or ordered())
            else:
                tiers.step_done(state.step)
            preemption.sleep(args.step_time, ordered)
            if (preemption.requested or ordered()) and state.step < args.steps:
                if orders and orders[0].action == RESTART:
                    return orders[0]  # (not held first: drop the step, go on as told)
                last_checkpoint()
                if restart is not None and not preemption.requested:  # held: wait
                    restart.held(orders[0])
                    log(f"held at step {state.step}: waiting to restart in process")
                    order = restart.wait(orders[0], lambda: preemption.requested)
                    if order is not None:
                        log(f"restarting in process (order {order.generation})")
                        return order
                why = f"{preemption.name()} received" if preemption.requested else "the hold expired"
                log(f"{why}: preempted at step {state.step}, exiting {ExitCode.PREEMPTED:d}")
                return ExitCode.PREEMPTED
    finally:
        metrics.close()
    last_checkpoint()
    if env.chief:
        env.model_dir.mkdir(parents=True, exist_ok=True)
        model = {k: state.params[k] for k in PARAMS} | {"step": np.array(state.step, dtype=np.int64)}
        entries.atomic_file(env.model_dir / "model.npz", entries.encode(model))
        log(f"model saved: {env.model_dir / 'model.npz'}")
    log(f"done at step {state.step}: weights sha256 {weights_digest(state.params)}")
    return ExitCode.OK


def read_env() -> Env:
    return Env.read(os.environ, Path(os.environ.get("MTC_TRAIN_OUTPUT", "train-output")))


def main(argv: list[str] | None = None) -> int:
    preemption = Preemption().install()  # first, so a signal during start-up is not lost
    args = parse_args(argv)
    try:
        env = read_env()
        restart = InProcessRestart.from_env()  # where mtc offers it: restart in this process
        if restart is not None:
            restart.declare()
            if os.environ.pop(STANDBY, ""):  # a warm standby: wait to be given a rank
                print(f"[{env.job_id} standby] ready: waiting to be given a rank", flush=True)
                if (order := restart.standby(lambda: preemption.requested)) is None:
                    return ExitCode.PREEMPTED
                restart.apply(order)
                env = read_env()
        while not isinstance(result := train(args, env, preemption, restart), int):
            assert restart is not None
            restart.apply(result)  # the next attempt's environment and log
            env = read_env()
        return result
    except ConfigError as exc:
        print(f"train.py: configuration error: {exc}", file=sys.stderr, flush=True)
        return ExitCode.CONFIG


if __name__ == "__main__":
    sys.exit(main())
