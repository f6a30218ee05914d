"""The recipes' training program: a tiny Llama- or Gemma-shaped causal LM, pretrained on the
standard library's sources or fine-tuned on generated tasks, under torch.distributed.

``python -m services.recipes.programs.lm --config '<json>'`` (``mtc recipe run`` writes the JSON: a
recipe with its ``--set`` overrides applied, see ``services/recipes``). It runs unchanged
under mtc, ``torchrun`` or Vertex (``mtc_program.torch_runtime.Env``): data parallel over gloo
on CPU or NCCL on GPUs (``average_gradients``: one all-reduce per parameter, in a fixed
order), checkpoints with ``torch.distributed.checkpoint`` every ``checkpoint.every`` steps
and on SIGTERM (then exit 75), resume from the newest complete one, TensorBoard scalars
continuous across attempts, hypertune when it is a trial. At the end rank 0 writes the model
(``save_pretrained``: config.json and safetensors) and ``metrics.json`` (the final loss, the
tokens per second) into ``AIP_MODEL_DIR``.

Config keys: ``task`` (pretrain | sft; rl is ``python -m services.recipes.programs.rl``, its own loop),
``model`` (``family``: llama | gemma, and the architecture's config fields), ``data``
(``seq_len``, ``corpus_bytes`` or ``examples``),
``hyperparameters`` (``steps``, ``batch_size``, ``lr``, ``warmup``, ``weight_decay``,
``seed``, ``step_sleep_s``), ``checkpoint`` (``every``), ``init_from`` (a model directory
or a ``ckpt-<step>`` checkpoint an earlier run wrote: continued pretraining, SFT from a
pretrained model).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mtc_program.progress import RankProgress
from mtc_program.scalars import Scalars
from mtc_program.torch_checkpoint import (
    EXIT_OK,
    EXIT_PREEMPTED,
    METADATA,
    Checkpointer,
    Preemption,
    deterministic,
    load_model_weights,
)
from mtc_program.torch_inprocess import Call, InProcess
from mtc_program.torch_runtime import Env, Hypertune, exit_now
from mtc_program.torch_tiers import TorchTiers
from services.recipes.programs.lm_data import VOCAB_SIZE, SftStream, TokenStream, stdlib_corpus

FAMILIES = ("llama", "gemma")


MODEL_CONFIG = "model-config.json"  # beside the checkpoints: the architecture they hold


def build_model(spec: Mapping[str, Any], init_from: str | None = None) -> torch.nn.Module:
    """A causal LM from a config (random weights), or from what an earlier run left on this
    machine (never a hub download): a model directory (``save_pretrained``), or a durable
    checkpoint ``ckpt-<step>/`` (its weights, the architecture from ``model-config.json``
    beside it)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    path = Path(init_from) if init_from else None
    if path is not None and (path / METADATA).is_file():
        saved = json.loads((path.parent / MODEL_CONFIG).read_text())
        model = build_model(saved)
        load_model_weights(model, path)
        return model
    family = spec.get("family", "llama")
    fields = {k: v for k, v in spec.items() if k != "family"}
    fields.setdefault("vocab_size", VOCAB_SIZE)
    if family == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cls: Any = LlamaForCausalLM
        config: Any = LlamaConfig(**fields)
    elif family == "gemma":
        from transformers import GemmaConfig, GemmaForCausalLM

        cls, config = GemmaForCausalLM, GemmaConfig(**fields)
    else:
        raise ValueError(f"model.family must be one of {FAMILIES}, not {family!r}")
    if path is not None:
        if not (path / "config.json").is_file():
            raise ValueError(f"init_from {init_from}: no saved model there (config.json)")
        return cls.from_pretrained(str(path), local_files_only=True)  # type: ignore[no-any-return]
    return cls(config)  # type: ignore[no-any-return]


def model_spec(model: torch.nn.Module) -> dict[str, Any]:
    """The recipe-shaped ``model`` section that rebuilds ``model``'s architecture."""
    config = model.config.to_dict()  # type: ignore[operator,union-attr]
    family = "gemma" if config.get("model_type") == "gemma" else "llama"
    keep = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings", "vocab_size")
    return {"family": family, **{k: config[k] for k in keep if config.get(k) is not None}}


def lr_lambda(warmup: int, steps: int) -> Any:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


class LossMeter:
    """An exponential average of the loss, saved with the checkpoint (so a resumed run's
    final loss is the one an uninterrupted run reports)."""

    def __init__(self, alpha: float = 0.1) -> None:
        self.alpha, self.value, self.count = alpha, 0.0, 0

    def add(self, loss: float) -> None:
        self.value = loss if self.count == 0 else (1 - self.alpha) * self.value + self.alpha * loss
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "count": self.count}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.value, self.count = float(state["value"]), int(state["count"])


def average_gradients(model: torch.nn.Module, world_size: int,
                      progress: RankProgress | None = None) -> None:
    """Data parallelism without DDP's buckets: one all-reduce per parameter, in the model's
    order. Why: DDP lays its buckets out in parameter order on the first iteration and in
    gradient-ready order from the second on, and gloo's ring all-reduce adds a tensor's
    elements in an order that depends on where they sit in the bucket; with more than two
    ranks a run resumed mid-way (whose first iteration is not step 1) then differs from an
    uninterrupted one in the last bits. Per parameter the order depends only on its size.
    ``progress``: the rank's progress report sees the all-reduces as one collective."""
    with progress.collective("all_reduce_grads") if progress else contextlib.nullcontext():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(world_size)
                dist.all_reduce(p.grad)


def make_stream(config: Mapping[str, Any], env: Env) -> TokenStream | SftStream:
    data, hp = config.get("data", {}), config.get("hyperparameters", {})
    seq_len, batch, seed = int(data.get("seq_len", 64)), int(hp.get("batch_size", 8)), int(
        hp.get("seed", 0))
    if config.get("task", "pretrain") == "sft":
        return SftStream(int(data.get("examples", 2000)), seq_len, batch, seed, env.rank,
                         env.world_size)
    corpus = stdlib_corpus(int(data.get("corpus_bytes", 1_000_000)))
    return TokenStream(corpus, seq_len, batch, seed, env.rank, env.world_size)


def next_token_backward(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One step's next-token loss (labels -100 are masked) and its gradients, fresh."""
    logits = model(input_ids=ids).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                           labels.reshape(-1), ignore_index=-100)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()  # type: ignore[no-untyped-call]
    return loss


class Setup:
    """What a process keeps across in-process restarts (``torch_inprocess``): the model and
    optimizer stay allocated, the data built; a warm standby builds it before it has a rank."""

    def __init__(self, config: Mapping[str, Any], env: Env) -> None:
        hp = config.get("hyperparameters", {})
        steps, seed = int(hp.get("steps", 100)), int(hp.get("seed", 0))
        deterministic(seed)
        torch.manual_seed(seed)  # the same initial weights on every rank
        self.device = env.device()
        self.model = build_model(config.get("model", {}), config.get("init_from")).to(self.device)
        self.model.config.use_cache = False  # type: ignore[union-attr]
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=float(hp.get("lr", 3e-3)),
                                           weight_decay=float(hp.get("weight_decay", 0.0)))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(int(hp.get("warmup", 10)), steps))
        self.stream = make_stream(config, env)
        self.meter = LossMeter()


def train(config: Mapping[str, Any], env: Env, preemption: Preemption,
          call: Call | None = None, kept: dict[str, Setup] | None = None) -> int:
    """One attempt. ``call``: the in-process restart's (``main``); ``kept``: the ``Setup``
    of an earlier call in this process, reused (and replaced when the ranks restore nothing:
    its weights trained on)."""
    if config.get("task", "pretrain") not in ("pretrain", "sft"):
        raise ValueError(f"task {config.get('task')!r}: this loop runs pretrain and sft "
                         "(rl: python -m services.recipes.programs.rl)")

    def log(msg: str) -> None:
        print(f"[lm rank {env.rank}/{env.world_size}] {msg}", flush=True)

    hp = config.get("hyperparameters", {})
    steps, seed = int(hp.get("steps", 100)), int(hp.get("seed", 0))
    kept = {} if kept is None else kept
    distributed = env.init()
    if "setup" not in kept:
        kept["setup"] = Setup(config, env)
    setup = kept["setup"]
    setup.stream.place(env.rank, env.world_size)
    model, optimizer, scheduler = setup.model, setup.optimizer, setup.scheduler
    if env.rank == 0:  # the architecture beside the checkpoints (continued pretraining reads it)
        env.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        tmp = env.checkpoint_dir / f".{MODEL_CONFIG}.tmp"
        tmp.write_text(json.dumps(model_spec(model)))
        os.replace(tmp, env.checkpoint_dir / MODEL_CONFIG)
    policy = config.get("checkpoint", {})
    every = int(policy.get("every", 0))
    tiers = TorchTiers.from_env(os.environ, durable_dir=env.checkpoint_dir, rank=env.rank,
                                world_size=env.world_size, log=log,
                                memory_every=int(policy.get("memory_every", 10)),
                                own=call.own if call is not None else None)

    def checkpointer(s: Setup) -> Checkpointer:
        return Checkpointer(env.checkpoint_dir, s.model, s.optimizer, every=every, log=log,
                            extra={"scheduler": s.scheduler, "loader": s.stream,
                                   "loss": s.meter},
                            preemption=preemption, tiers=tiers,
                            held=call.held if call is not None else None)

    ckpt = checkpointer(setup)
    torch.manual_seed(seed + 1 + env.rank)  # this rank's dropout draws
    step = ckpt.restore()
    if step == 0 and call is not None and call.iteration:  # nothing saved: start over
        setup = kept["setup"] = Setup(config, env)
        setup.stream.place(env.rank, env.world_size)
        model, optimizer, scheduler = setup.model, setup.optimizer, setup.scheduler
        ckpt = checkpointer(setup)
        torch.manual_seed(seed + 1 + env.rank)
    wrapped: torch.nn.Module = model
    stream, meter, device = setup.stream, setup.meter, setup.device
    log(f"{'resumed at' if step else 'starting from'} step {step} of {steps}; "
        f"{sum(p.numel() for p in model.parameters())} parameters on {device}"
        + (f" (in-process restart {call.iteration})" if call is not None and call.iteration
           else ""))
    scalars = Scalars(env.tensorboard_dir, env.attempt, enabled=env.rank == 0)
    sleep_s = float(hp.get("step_sleep_s", 0.0))
    tokens, started = 0, time.perf_counter()
    progress = RankProgress.from_env(os.environ, env.rank)  # per-rank progress (hangs)
    if tiers is not None:  # one heartbeat file, one writer: the tiers' carries the progress
        progress.link(tiers.tiers)
    progress.begin_step()
    try:
        while step < steps:
            ids, labels = (t.to(device) for t in stream.next_batch())
            loss = next_token_backward(wrapped, optimizer, ids, labels)
            if distributed:
                average_gradients(model, env.world_size, progress)
            torch.nn.utils.clip_grad_norm_(wrapped.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            tokens += ids.numel()
            value = loss.detach().clone()
            if distributed:
                with progress.collective("all_reduce_loss"):
                    dist.all_reduce(value)
                value /= env.world_size
            progress.step_done(step)
            meter.add(float(value))
            scalars.add(step, {"loss": float(value), "lr": float(scheduler.get_last_lr()[0])})
            if step % max(1, steps // 10) == 0:
                log(f"step {step} loss {float(value):.4f}")
            if sleep_s:
                time.sleep(sleep_s)
            # the scalars reach the checkpoint's step before it exists (no gap on resume)
            if ckpt.after_step(step, steps, before_save=scalars.close,
                               before_near_save=scalars.flush) == EXIT_PREEMPTED:
                return EXIT_PREEMPTED
    finally:
        scalars.close()
        progress.close()
        ckpt.close()
    elapsed = time.perf_counter() - started
    tokens_per_s = tokens * env.world_size / elapsed if elapsed > 0 and tokens else 0.0
    Hypertune(env.trial_id, str(config.get("metric", "loss"))).report(meter.value, step)
    if env.rank == 0:
        env.model_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(env.model_dir))  # type: ignore[operator]
        metrics = {"final_loss": meter.value, "steps": step, "tokens_per_s": tokens_per_s,
                   "parameters": sum(p.numel() for p in model.parameters()),
                   "recipe": config.get("name"), "version": config.get("version")}
        (env.model_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
        log(f"model saved: {env.model_dir}")
        log(f"done at step {step}: loss {meter.value:.6f}, {tokens_per_s:.0f} tokens/s")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return EXIT_OK


def main(argv: list[str] | None = None, loop: Any = None, setup: Any = None,
         prog: str = "python -m services.recipes.programs.lm") -> int:
    """The entry point, under ``torch_inprocess``; ``loop`` and ``setup``: another training
    loop with ``train``'s signature and the class of what it keeps across calls (RL's)."""
    preemption = Preemption().install()  # first, so a signal during start-up is not lost
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--config", required=True, help="the recipe as JSON (or @file)")
    args = p.parse_args(argv)
    text = args.config
    if text.startswith("@"):
        text = Path(text[1:]).read_text()
    config = json.loads(text)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never a download
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    run, make = loop or train, setup or Setup
    kept: dict[str, Any] = {}

    def warm() -> None:  # a warm standby: the model and the data, before it has a rank
        kept["setup"] = make(config, Env.read())

    return InProcess(lambda call: int(run(config, call.env, preemption, call, kept)),
                     preemption=preemption, warm=warm).run()


if __name__ == "__main__":
    exit_now(main())  # not sys.exit: gloo's teardown can hang at interpreter exit
