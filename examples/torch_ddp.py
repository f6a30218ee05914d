"""A small plain ``torch.distributed`` program: DDP over a tiny MLP, well-mannered as a managed job.

It reads only what ``torchrun`` and Vertex AI give a process (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``; ``AIP_CHECKPOINT_DIR``, ``AIP_MODEL_DIR``),
so it runs unchanged under plain ``torchrun``, under mtc and on Vertex:

    torchrun --nproc-per-node 2 examples/torch_ddp.py --steps 40

* backend: NCCL when CUDA is available (one GPU per local rank), gloo on CPU;
* deterministic: seeded data and weights, ``torch.use_deterministic_algorithms``, one thread;
* rank 0 saves ``AIP_CHECKPOINT_DIR/ckpt-<step:08d>.pt`` every ``--checkpoint-every`` steps
  atomically (temp file, fsync, ``os.replace``); every rank resumes from the newest one;
* on SIGTERM it finishes the step, saves (rank 0) and exits 75 (EX_TEMPFAIL: run me again);
* at the end rank 0 writes ``AIP_MODEL_DIR/model.pt``.

A ``gs://BUCKET/...`` directory (Vertex's, and mtc's where the job's sandbox mounts the
bucket) is written at ``/gcs/BUCKET/...``. Without ``AIP_CHECKPOINT_DIR`` it neither saves
nor resumes; without ``AIP_MODEL_DIR`` it writes no model.
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

EXIT_PREEMPTED = 75
CKPT_RE = re.compile(r"^ckpt-(\d+)\.pt$")
_stop = False


def _on_term(signum: int, frame: FrameType | None) -> None:
    global _stop
    _stop = True


def _local(value: str) -> str:
    """A job directory as a file path: Vertex (and mtc's sandbox) name it ``gs://BUCKET/...``
    and mount Cloud Storage at ``/gcs/`` (Cloud Storage FUSE); a local path is itself."""
    return "/gcs/" + value[len("gs://"):] if value.startswith("gs://") else value


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        sys.exit(f"torch_ddp: {name} is not an integer: {value!r}")


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def _batch(step: int, rank: int, world: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s shard of step ``step``'s batch: the same numbers on every run."""
    g = torch.Generator().manual_seed(1_000_003 * step + 7)
    x = torch.randn(size * world, 8, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return x[rank::world], y[rank::world]


def _newest(directory: Path) -> tuple[int, Path] | None:
    found = [(int(m.group(1)), p) for p in directory.glob("ckpt-*.pt")
             if (m := CKPT_RE.match(p.name))]
    return max(found) if found else None


def _save_atomic(obj: object, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _leave_group() -> None:
    """Wait for every rank, then destroy the process group. Call it once the DDP wrapper is
    gone: a DDP reducer that outlives the group frees the group's last reference while holding
    the GIL, and gloo's destructor then waits for a worker thread that needs the GIL to free a
    barrier's tensors: the process would hang at exit with its work done."""
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16, help="samples per rank per step")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step-time", type=float, default=0.0, help="sleep per step (s)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)

    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)

    model = _model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    ckpt_dir = Path(_local(os.environ["AIP_CHECKPOINT_DIR"])) \
        if os.environ.get("AIP_CHECKPOINT_DIR") else None
    start = 0
    if ckpt_dir is not None and (newest := _newest(ckpt_dir)) is not None:
        state = torch.load(newest[1], map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
        print(f"rank {rank}: resumed from step {start}", flush=True)
    ddp = DistributedDataParallel(model)

    def save(step: int) -> None:
        if ckpt_dir is not None and rank == 0:
            ckpt_dir.mkdir(parents=True, exist_ok=True)
            _save_atomic({"model": model.state_dict(), "optimizer": opt.state_dict(),
                          "step": step}, ckpt_dir / f"ckpt-{step:08d}.pt")

    step, loss = start, torch.zeros(())
    while step < args.steps:
        x, y = _batch(step, rank, world, args.batch)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        step += 1
        if args.step_time:
            time.sleep(args.step_time)
        # every rank must agree to stop at the same step: a SIGTERM reaches ranks at
        # slightly different times, so the decision is reduced across the gang
        flag = torch.tensor([1.0 if _stop else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        if flag.item() > 0:
            save(step)
            del ddp
            _leave_group()
            print(f"rank {rank}: stopped at step {step}, checkpoint saved", flush=True)
            return EXIT_PREEMPTED
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            save(step)
    if rank == 0 and os.environ.get("AIP_MODEL_DIR"):
        model_dir = Path(_local(os.environ["AIP_MODEL_DIR"]))
        model_dir.mkdir(parents=True, exist_ok=True)
        _save_atomic(model.state_dict(), model_dir / "model.pt")
    del ddp
    _leave_group()
    print(f"rank {rank}: done at step {step}, loss {loss.item():.6f}", flush=True)
    return 0


if __name__ == "__main__":
    # os._exit once everything is written and flushed: a rank that destroyed its process
    # group can still wait in a futex at interpreter exit (gloo on CPU), holding its gang
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
