"""A plain ``torch.distributed`` program that restarts in its process under mtc.

Data parallel over a tiny MLP (gloo on CPU, NCCL on GPUs: one all-reduce per parameter),
checkpoints with ``mtc_program.torch_checkpoint`` (dcp every ``--checkpoint-every`` steps,
the memory and peer tiers every ``MTC_TIER1_EVERY`` where mtc gives them), and
``mtc_program.torch_inprocess.InProcess`` around the training function: when another rank
crashes, this rank drops its step, leaves the process group, waits for the next attempt,
joins its group and restores the consistent cut, in the same process, the model and the
optimizer still allocated. Under ``torchrun`` or Vertex it runs once, as any program.

    torchrun --nproc-per-node 2 examples/torch_inprocess.py --steps 40

At the end rank 0 prints the weights' sha256 and writes ``AIP_MODEL_DIR/model.pt``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

# the SDK from this checkout (installed, `pip install ./shared/sdk[torch]`, it needs no path)
if (_sdk := Path(__file__).resolve().parents[1] / "shared" / "sdk").is_dir():
    sys.path.insert(0, str(_sdk))

from mtc_program import protocol
from mtc_program.torch_checkpoint import (
    EXIT_OK,
    Checkpointer,
    Preemption,
    deterministic,
)
from mtc_program.torch_inprocess import Call, InProcess
from mtc_program.torch_runtime import Env, exit_now
from mtc_program.torch_tiers import TorchTiers


def batch(step: int, rank: int, world: int, device: torch.device
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s shard of step ``step``'s batch: the same numbers on every run."""
    g = torch.Generator().manual_seed(1_000_003 * step + 7)
    x = torch.randn(16 * world, 8, generator=g)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return x[rank::world].to(device), y[rank::world].to(device)


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def main(argv: list[str] | None = None) -> int:
    preemption = Preemption().install()  # first, so a signal during start-up is not lost
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--checkpoint-every", type=int, default=0, help="durable; 0: at stops only")
    p.add_argument("--memory-every", type=int, default=5)
    p.add_argument("--step-time", type=float, default=0.0, help="sleep per step (s)")
    args = p.parse_args(argv)
    deterministic(0)
    device = Env.read().device()  # this rank's GPU (LOCAL_RANK), else the CPU
    # built once, outside the function: an in-process restart keeps them allocated
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    initial = {k: v.clone() for k, v in model.state_dict().items()}

    def train(call: Call) -> int:
        env = call.env

        def log(msg: str) -> None:
            print(f"[torch_inprocess rank {env.rank}/{env.world_size} pid {os.getpid()}] {msg}",
                  flush=True)

        tiers = TorchTiers.from_env(os.environ, durable_dir=env.checkpoint_dir, rank=env.rank,
                                    world_size=env.world_size, memory_every=args.memory_every,
                                    log=log, own=call.own)
        ckpt = Checkpointer(env.checkpoint_dir, model, optimizer, every=args.checkpoint_every,
                            preemption=preemption, log=log, tiers=tiers, held=call.held)
        step = ckpt.restore()
        if step == 0 and call.iteration:  # nothing saved yet: the trained weights go back
            model.load_state_dict(initial)
            optimizer.state.clear()
        log(f"call {call.iteration}: step {step} of {args.steps}, group of "
            f"{dist.get_world_size() if dist.is_initialized() else 1} on port {env.master_port}")
        try:
            while step < args.steps:
                x, y = batch(step, env.rank, env.world_size, device)
                optimizer.zero_grad(set_to_none=True)
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()  # type: ignore[no-untyped-call]
                if env.world_size > 1:
                    for param in model.parameters():
                        assert param.grad is not None
                        param.grad.div_(env.world_size)
                        dist.all_reduce(param.grad)
                optimizer.step()
                step += 1
                if args.step_time:
                    preemption.sleep(args.step_time, call.held)
                if (code := ckpt.after_step(step, args.steps)) is not None:
                    return code
        finally:
            ckpt.close()
        if env.rank == 0 and os.environ.get(protocol.MODEL_DIR):  # none: no model written
            env.model_dir.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), env.model_dir / "model.pt")
        log(f"done at step {step}: weights sha256 {digest(model)}")
        return EXIT_OK

    return InProcess(train, preemption=preemption).run()


if __name__ == "__main__":
    exit_now(main())  # not sys.exit: gloo's teardown can hang at interpreter exit
