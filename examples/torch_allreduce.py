"""A tiny data-parallel torch program that reports its progress per rank
(``mtc_program.progress``): each step computes for ``--step-time`` seconds (a real matrix
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
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

# the in-job SDK from this checkout (installed, `pip install ./shared/sdk`, it needs no path)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "shared" / "sdk"))

from mtc_program import entries
from mtc_program import protocol as p
from mtc_program.progress import RankProgress
from mtc_program.signals import Preemption


def newest_checkpoint(where: Path) -> tuple[int, np.ndarray] | None:
    for entry in entries.list_durable(where, 0, 1):  # newest first
        try:
            data = entries.decode(entry.path)
            return int(np.asarray(data["step"])), np.array(data["weights"])
        except (OSError, ValueError, KeyError):
            continue
    return None


def save(where: Path, step: int, weights: np.ndarray) -> None:
    where.mkdir(parents=True, exist_ok=True)
    entries.atomic_file(where / p.checkpoint_name(step, ".npz"),
                        entries.encode({"step": np.array(step), "weights": weights}))


def busy(seconds: float, a: torch.Tensor) -> None:
    """Real CPU work for ``seconds`` (a matrix product loop), not a sleep."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a) * 0.5


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-time", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-factor", type=float, default=1.0)
    parser.add_argument("--beat-every", type=float, default=0.5, help="heartbeat seconds, "
                        f"unless {p.PROGRESS_INTERVAL_S} says")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rank, world = int(os.environ.get(p.RANK, "0")), int(os.environ.get(p.WORLD_SIZE, "1"))
    ckpt_dir = Path(p.local_path(os.environ.get(p.CHECKPOINT_DIR, "checkpoints")))
    os.environ.setdefault(p.PROGRESS_INTERVAL_S, str(args.beat_every))
    progress = RankProgress.from_env(os.environ, rank)
    preemption = Preemption().install()
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
        if rank == 0 and (step % args.checkpoint_every == 0 or preemption.requested):
            save(ckpt_dir, step, weights)
        if preemption.requested:
            progress.close()
            return p.ExitCode.PREEMPTED
    if rank == 0:
        save(ckpt_dir, step, weights)
    progress.close()
    dist.destroy_process_group()
    return p.ExitCode.OK


if __name__ == "__main__":
    raise SystemExit(main())
