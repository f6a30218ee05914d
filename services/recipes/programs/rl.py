"""The RL recipe's loop (``task: rl``; ``python -m services.recipes.programs.rl --config
'<json>'``, the same entry point as ``lm``'s): GRPO-style training (``grpo``) of the same tiny
causal LM, healed like the others.

Where the policy starts: ``init_from`` (an SFT model's directory from the registry, or a
durable ``ckpt-<step>``), or, from random weights, ``rl.sft_steps`` steps of SFT on the
generated tasks first, in the same run (a tiny model trained in place). Then
``hyperparameters.steps`` RL steps, each: ``rl.prompts_per_step`` prompts per rank, a group
of ``rl.group_size`` sampled completions each, the exact-match reward, group-relative
advantages, one AdamW step at ``rl.lr`` on the gradients averaged over the ranks (gloo, as
``lm.average_gradients``). The step count, the checkpoints (the same ``Checkpointer``: durable
and tiers; the reference model and the reward meter ride in it), SIGTERM and exit 75 are the
pretrain loop's. At the end rank 0 saves the model and ``metrics.json`` with the greedy
exact-match rate on held-out prompts at RL's start and end (``reward_start``,
``reward_end``), and logs ``rl reward start X end Y``, which ``mtc recipe run`` checks
against the recipe's ``expected_reward``.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from mtc_program.progress import RankProgress
from mtc_program.scalars import Scalars
from mtc_program.torch_checkpoint import (
    EXIT_OK,
    EXIT_PREEMPTED,
    Checkpointer,
    Preemption,
    deterministic,
)
from mtc_program.torch_inprocess import Call
from mtc_program.torch_runtime import Env, Hypertune, exit_now
from mtc_program.torch_tiers import TorchTiers
from services.recipes.programs import grpo, lm
from services.recipes.programs.lm import (
    MODEL_CONFIG,
    LossMeter,
    average_gradients,
    build_model,
    lr_lambda,
    model_spec,
)
from services.recipes.programs.lm_data import SftStream, encode_example

EVAL_SEED = 99_991  # held-out prompts: a generator seed the training prompts never use


class RlSetup:
    """What a process keeps across in-process restarts (``torch_inprocess``), as ``lm.Setup``:
    the policy, its reference, the optimizer and the data stay allocated; a warm standby
    builds them before it has a rank."""

    def __init__(self, config: Mapping[str, Any], env: Env) -> None:
        hp, data = config.get("hyperparameters", {}), config.get("data", {})
        self.rl = rl = grpo.RlSettings.read(config.get("rl"))
        seed = int(hp.get("seed", 0))
        self.warmup_steps = warmup_steps = 0 if config.get("init_from") else rl.sft_steps
        self.total = warmup_steps + int(hp.get("steps", 50))
        deterministic(seed)
        torch.manual_seed(seed)
        self.model = model = build_model(config.get("model", {}), config.get("init_from"))
        model.config.use_cache = False  # type: ignore[union-attr]
        model.train()
        self.reference = copy.deepcopy(model).requires_grad_(False) if rl.kl_coef > 0 else None
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=float(hp.get("lr", 3e-3)),
                                           weight_decay=float(hp.get("weight_decay", 0.0)))
        sft_factor = lr_lambda(int(hp.get("warmup", 5)), max(1, warmup_steps))
        rl_factor = rl.lr / float(hp.get("lr", 3e-3))
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: sft_factor(s) if s < warmup_steps else rl_factor)
        self.sft = SftStream(int(data.get("examples", 2000)), int(data.get("seq_len", 24)),
                             int(hp.get("batch_size", 16)), seed, env.rank, env.world_size)
        examples = grpo.tasks(int(data.get("examples", 2000)), seed, rl.kinds)
        self.sft.examples = [encode_example(p, a, int(data.get("seq_len", 24)))
                             for p, a in examples]
        self.prompts = grpo.PromptStream(examples, rl.prompts_per_step, seed, env.rank,
                                         env.world_size)
        self.held_out = grpo.tasks(rl.eval_prompts, seed + EVAL_SEED, rl.kinds)
        self.loss_meter, self.meter = LossMeter(), grpo.RewardMeter()

    def place(self, rank: int, world_size: int) -> None:
        self.sft.place(rank, world_size)
        self.prompts.place(rank, world_size)

    def extra(self) -> dict[str, Any]:
        """What rides in the checkpoint beside the model and optimizer."""
        out: dict[str, Any] = {"scheduler": self.scheduler, "loader": self.sft,
                               "prompts": self.prompts, "loss": self.loss_meter,
                               "reward": self.meter}
        if self.reference is not None:
            out["reference"] = self.reference
        return out


def train(config: Mapping[str, Any], env: Env, preemption: Preemption,
          call: Call | None = None, kept: dict[str, Any] | None = None) -> int:
    """One attempt, as ``lm.train``: ``call``, the in-process restart's; ``kept``, the
    ``RlSetup`` of an earlier call in this process, reused (rebuilt when the ranks restore
    nothing: its weights trained on)."""
    def log(msg: str) -> None:
        print(f"[rl rank {env.rank}/{env.world_size}] {msg}", flush=True)

    seed = int(config.get("hyperparameters", {}).get("seed", 0))
    kept = {} if kept is None else kept
    distributed = env.init()
    if "setup" not in kept:
        kept["setup"] = RlSetup(config, env)
    setup: RlSetup = kept["setup"]
    setup.place(env.rank, env.world_size)
    if env.rank == 0:
        env.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        tmp = env.checkpoint_dir / f".{MODEL_CONFIG}.tmp"
        tmp.write_text(json.dumps(model_spec(setup.model)))
        os.replace(tmp, env.checkpoint_dir / MODEL_CONFIG)
    policy = config.get("checkpoint", {})
    tiers = TorchTiers.from_env(os.environ, durable_dir=env.checkpoint_dir, rank=env.rank,
                                world_size=env.world_size, log=log,
                                memory_every=int(policy.get("memory_every", 10)),
                                own=call.own if call is not None else None)

    def checkpointer(s: RlSetup) -> Checkpointer:
        return Checkpointer(env.checkpoint_dir, s.model, s.optimizer,
                            every=int(policy.get("every", 0)), extra=s.extra(),
                            preemption=preemption, tiers=tiers,
                            held=call.held if call is not None else None)

    ckpt = checkpointer(setup)
    step = ckpt.restore()
    if step == 0 and call is not None and call.iteration:  # nothing saved: start over
        setup = kept["setup"] = RlSetup(config, env)
        setup.place(env.rank, env.world_size)
        ckpt = checkpointer(setup)
    model, reference, optimizer, scheduler = (setup.model, setup.reference, setup.optimizer,
                                              setup.scheduler)
    rl, warmup_steps, total = setup.rl, setup.warmup_steps, setup.total
    sft, prompts, loss_meter, meter = setup.sft, setup.prompts, setup.loss_meter, setup.meter
    log(f"{'resumed at' if step else 'starting from'} step {step} of {total} "
        f"({warmup_steps} SFT warm-up, then RL)"
        + (f" (in-process restart {call.iteration})" if call is not None and call.iteration
           else ""))
    scalars = Scalars(env.tensorboard_dir, env.attempt, enabled=env.rank == 0)
    progress = RankProgress.from_env(os.environ, env.rank)
    if tiers is not None:
        progress.link(tiers.tiers)
    progress.begin_step()
    started, samples = time.perf_counter(), 0

    def score(m: torch.nn.Module) -> float:
        return grpo.evaluate(m, setup.held_out, rl.max_new_tokens, rl.temperature,
                             rl.group_size, seed + EVAL_SEED)

    def all_mean(value: float, name: str) -> float:
        if not distributed:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        with progress.collective(name):
            dist.all_reduce(t)
        return float(t.item()) / env.world_size

    try:
        while step < total:
            values: dict[str, float]
            if step < warmup_steps:
                ids, labels = sft.next_batch()
                loss = lm.next_token_backward(model, optimizer, ids, labels)
                values = {"sft_loss": float(loss.detach())}
            else:
                if meter.start < 0:  # RL begins: the start figure and the reference
                    meter.start = score(model)
                    meter.greedy_start = grpo.evaluate(model, setup.held_out,
                                                       rl.max_new_tokens, 0.0, 1, 0)
                    if reference is not None:
                        reference.load_state_dict(model.state_dict())
                    optimizer.state.clear()  # the SFT phase's moments do not fit RL's scale
                    log(f"rl begins at step {step}: held-out reward {meter.start:.3f} (greedy "
                        f"{meter.greedy_start:.3f})")
                values = rl_step(model, reference, prompts, rl, seed, step, env.rank, optimizer)
                samples += rl.prompts_per_step * rl.group_size
            if distributed:
                average_gradients(model, env.world_size, progress)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            step += 1
            values = {k: all_mean(v, f"all_reduce_{k}") for k, v in values.items()}
            progress.step_done(step)
            if "reward" in values:
                meter.add(values["reward"])
            else:
                loss_meter.add(values["sft_loss"])
            scalars.add(step, {**values, "lr": float(scheduler.get_last_lr()[0])})
            if step % max(1, total // 10) == 0:
                log(f"step {step} " + " ".join(f"{k} {v:.4f}" for k, v in values.items()))
            if ckpt.after_step(step, total, before_save=scalars.close,
                               before_near_save=scalars.flush) == EXIT_PREEMPTED:
                return EXIT_PREEMPTED
    finally:
        scalars.close()
        progress.close()
        ckpt.close()
    end = score(model)
    greedy_end = grpo.evaluate(model, setup.held_out, rl.max_new_tokens, 0.0, 1, 0)
    elapsed = time.perf_counter() - started
    Hypertune(env.trial_id, str(config.get("metric", "reward"))).report(end, step)
    if env.rank == 0:
        env.model_dir.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(env.model_dir))  # type: ignore[operator]
        metrics = {"reward_start": meter.start, "reward_end": end,
                   "greedy_start": meter.greedy_start, "greedy_end": greedy_end,
                   "train_reward": meter.value, "sft_loss": loss_meter.value, "steps": step,
                   "samples_per_s": samples * env.world_size / elapsed if elapsed > 0 else 0.0,
                   "parameters": sum(p.numel() for p in model.parameters()),
                   "recipe": config.get("name"), "version": config.get("version")}
        (env.model_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
        log(f"model saved: {env.model_dir}")
        log(f"rl reward start {meter.start:.6f} end {end:.6f}")
        log(f"done at step {step}: loss {-end:.6f}, reward {end:.6f}")
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return EXIT_OK


def rl_step(model: torch.nn.Module, reference: torch.nn.Module | None,
            prompts: grpo.PromptStream, rl: grpo.RlSettings, seed: int, step: int, rank: int,
            optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """Sample, score, and accumulate this rank's policy gradient (the caller steps)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    batch = prompts.next_batch()
    optimizer.zero_grad(set_to_none=True)
    rewards_all, kls, loss_sum = [], [], 0.0
    for prompt, answer in batch:
        ids = grpo.prompt_ids(prompt)
        model.eval()
        comps = grpo.sample(model, ids, rl.group_size, rl.max_new_tokens, rl.temperature, gen)
        model.train()
        rewards = torch.tensor([grpo.reward(c.tolist(), answer) for c in comps])
        rewards_all.append(rewards)
        adv = grpo.advantages(rewards)
        loss, kl = grpo.group_loss(model, reference, ids, comps, adv, rl.kl_coef)
        (loss / len(batch)).backward()  # type: ignore[no-untyped-call]
        loss_sum += float(loss.detach())
        kls.append(kl)
    out = {"reward": float(torch.cat(rewards_all).mean()), "pg_loss": loss_sum / len(batch)}
    if rl.kl_coef > 0:
        out["kl"] = sum(kls) / len(kls)
    return out


def main(argv: list[str] | None = None) -> int:
    return lm.main(argv, loop=train, setup=RlSetup, prog="python -m services.recipes.programs.rl")


if __name__ == "__main__":
    exit_now(main())  # not sys.exit: gloo's teardown can hang at interpreter exit
