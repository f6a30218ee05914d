"""A tiny data-parallel torch program that reports its progress per rank
(``shared.program.progress``): each step computes for ``--step-time`` seconds (a real matrix
product loop), then all-reduces a tensor over gloo inside ``progress.collective``.

It is the hang and straggler tests' program: SIGSTOP one rank and the others wait in the
all-reduce it never enters; ``--slow-rank R --slow-factor 1.3`` makes rank R compute 30%
longer each step (a stand-in for a CPU-throttled worker: this machine has no per-process
CPU quota to turn down). Rank 0 writes ``ckpt-<step>.npz`` every ``--checkpoint-every``
steps and every rank resumes from the newest; SIGTERM: save and exit 75.

    python examples/torch_allreduce.py --steps 200 --step-time 0.05
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shared.program import names
from shared.program.progress import RankProgress

EXIT_PREEMPTED = 75


def newest_checkpoint(where: Path) -> tuple[int, np.ndarray] | None:
    found = sorted(where.glob("ckpt-*.npz"))
    for path in reversed(found):
        try:
            with np.load(path) as data:
                return int(data["step"]), np.array(data["weights"])
        except (OSError, ValueError, KeyError):
            continue
    return None


def save(where: Path, step: int, weights: np.ndarray) -> None:
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / f".ckpt-{step:08d}.tmp.npz"
    np.savez(tmp, step=step, weights=weights)
    os.replace(tmp, where / f"ckpt-{step:08d}.npz")


def busy(seconds: float, a: torch.Tensor) -> None:
    """Real CPU work for ``seconds`` (a matrix product loop), not a sleep."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a) * 0.5


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-factor", type=float, default=1.0)
    p.add_argument("--beat-every", type=float, default=0.5, help="heartbeat seconds, unless "
                   f"{names.PROGRESS_INTERVAL_S} says")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    ckpt_dir = Path(os.environ.get("AIP_CHECKPOINT_DIR", "checkpoints"))
    os.environ.setdefault(names.PROGRESS_INTERVAL_S, str(args.beat_every))
    progress = RankProgress.from_env(os.environ, rank)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    found = newest_checkpoint(ckpt_dir)
    step, weights = found if found else (0, np.zeros(16, dtype=np.float32))
    print(f"rank {rank}/{world}: {'resumed from step ' + str(step) if found else 'fresh'}",
          flush=True)
    a = torch.rand(32, 32)
    factor = args.slow_factor if rank == args.slow_rank else 1.0
    progress.begin_step()
    while step < args.steps:
        busy(args.step_time * factor, a)
        grad = torch.full((16,), float(rank + 1))
        with progress.collective("all_reduce"):
            dist.all_reduce(grad)
        weights = weights - 0.001 * grad.numpy()
        step += 1
        progress.step_done(step)
        if rank == 0 and (step % args.checkpoint_every == 0 or stop["now"]):
            save(ckpt_dir, step, weights)
        if stop["now"]:
            progress.close()
            return EXIT_PREEMPTED
    if rank == 0:
        save(ckpt_dir, step, weights)
    progress.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
