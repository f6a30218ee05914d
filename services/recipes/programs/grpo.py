"""GRPO-style reinforcement learning with a verifiable reward, on the SFT recipe's generated
tasks (``12+35=`` -> ``47``, ``reverse abc:`` -> ``cba``): the pieces, free of the loop.

For each prompt the policy samples a group of ``G`` completions; each is scored by exact
match of its text (up to EOS) with the task's answer (1 or 0: checkable, no reward model);
the advantage of a completion is its reward minus the group's mean, divided by the group's
std + eps (a group that is all right or all wrong teaches nothing and gets 0); the loss is
the policy gradient on the completion tokens (per-sequence mean log-prob times advantage),
plus, when ``kl_coef`` > 0, the k3 estimate of KL to a frozen reference model. One gradient
step per sampled batch (on-policy, so the PPO ratio is 1 and is left out).

Sampling draws from a ``torch.Generator`` seeded by (seed, step, rank): a resumed run draws
what an uninterrupted one would, with no generator state in the checkpoint.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from services.recipes.programs.lm_data import BOS, EOS, PAD, ByteTokenizer, sft_examples


@dataclass(frozen=True)
class RlSettings:
    """The recipe's ``rl`` section."""

    group_size: int = 8          # G completions per prompt
    prompts_per_step: int = 8    # per rank
    max_new_tokens: int = 6
    temperature: float = 1.0
    kl_coef: float = 0.0         # > 0: KL to the reference (the policy at RL's start)
    sft_steps: int = 0           # warm-up SFT steps first, when starting from random weights
    lr: float = 0.001            # the RL phase's (constant) learning rate
    eval_prompts: int = 64       # held-out prompts, greedy exact match at RL's start and end
    kinds: tuple[int, ...] = (0, 1, 2, 3)  # task kinds: sum, difference, reverse, upper

    @classmethod
    def read(cls, section: Mapping[str, Any] | None) -> RlSettings:
        s = dict(section or {})
        if "kinds" in s:
            s["kinds"] = tuple(int(k) for k in s["kinds"])
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in s.items() if k in known})


def kind_of(prompt: str) -> int:
    """0 sum, 1 difference, 2 reverse, 3 upper (the SFT generator's kinds)."""
    if prompt.startswith("reverse"):
        return 2
    if prompt.startswith("upper"):
        return 3
    return 0 if "+" in prompt else 1


def tasks(count: int, seed: int, kinds: Sequence[int]) -> list[tuple[str, str]]:
    """(prompt, answer) pairs of the given kinds, from the SFT generator."""
    drawn = count * 4 // len(kinds) + 16
    while True:  # the generator's stream grown until it holds ``count`` of these kinds
        out = [(p, a) for p, a in sft_examples(drawn, seed) if kind_of(p) in kinds]
        if len(out) >= count:
            return out[:count]
        drawn *= 2


class PromptStream:
    """A rank's prompts, in an order drawn from (seed, epoch); position as a ``Stateful``."""

    def __init__(self, examples: list[tuple[str, str]], per_step: int, seed: int, rank: int,
                 world_size: int) -> None:
        self.examples, self.per_step, self.seed = examples, per_step, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.index = 0, 0

    def _mine(self) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(self.seed * 104_729 + self.epoch).shuffle(order)
        return order[self.rank :: self.world_size]

    def place(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def next_batch(self) -> list[tuple[str, str]]:
        mine, out = self._mine(), []
        for _ in range(self.per_step):
            if self.index >= len(mine):
                self.epoch, self.index = self.epoch + 1, 0
                mine = self._mine()
            out.append(self.examples[mine[self.index]])
            self.index += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


def prompt_ids(prompt: str) -> list[int]:
    return [BOS, *ByteTokenizer().encode(prompt)]


def completion_text(ids: Sequence[int]) -> tuple[str, bool]:
    """The completion's text up to its EOS, and whether it has one."""
    out: list[int] = []
    for i in ids:
        if i == EOS:
            return ByteTokenizer().decode(out), True
        out.append(int(i))
    return ByteTokenizer().decode(out), False


def reward(ids: Sequence[int], answer: str) -> float:
    """The verifiable reward: 1 when the text up to EOS is exactly the answer, else 0."""
    text, ended = completion_text(ids)
    return 1.0 if ended and text == answer else 0.0


def completion_mask(completions: torch.Tensor) -> torch.Tensor:
    """1 on each completion's tokens up to and including its first EOS, 0 after."""
    is_eos = (completions == EOS).int()
    before = torch.cumsum(is_eos, dim=1) - is_eos  # EOS seen strictly before this token
    return (before == 0).float()


def sample(model: torch.nn.Module, prompt: list[int], group: int, max_new: int,
           temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """``group`` completions of one prompt, shape (group, max_new); PAD after an EOS."""
    return sample_rows(model, [prompt] * group, max_new, temperature, generator)


@torch.no_grad()
def sample_rows(model: torch.nn.Module, rows: list[list[int]], max_new: int,
                temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """A completion of each row (prompts of one length), shape (rows, max_new); PAD after an
    EOS. ``temperature`` 0: greedy."""
    ids = torch.tensor(rows)
    done = torch.zeros(len(rows), dtype=torch.bool)
    out = []
    for _ in range(max_new):
        logits = model(input_ids=ids).logits[:, -1, :].float()
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            nxt = logits.argmax(dim=-1)
        nxt = torch.where(done, torch.full_like(nxt, PAD), nxt)
        out.append(nxt)
        done |= nxt == EOS
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        if bool(done.all()):
            break
    comp = torch.stack(out, dim=1)
    if comp.shape[1] < max_new:
        comp = F.pad(comp, (0, max_new - comp.shape[1]), value=PAD)
    return comp


def advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """Group-relative advantages: (r - mean) / (std + eps); 0 for a uniform group."""
    centred = rewards - rewards.mean()
    return centred / (rewards.std(unbiased=False) + eps)


def token_logprobs(model: torch.nn.Module, prompt: list[int],
                   completions: torch.Tensor) -> torch.Tensor:
    """Log-probs of each completion token under ``model``, shape (group, max_new)."""
    group, n = completions.shape
    ids = torch.cat([torch.tensor([prompt] * group), completions], dim=1)
    logits = model(input_ids=ids).logits[:, len(prompt) - 1 : len(prompt) - 1 + n, :].float()
    return torch.log_softmax(logits, dim=-1).gather(2, completions[:, :, None]).squeeze(2)


def group_loss(model: torch.nn.Module, reference: torch.nn.Module | None, prompt: list[int],
               completions: torch.Tensor, adv: torch.Tensor, kl_coef: float
               ) -> tuple[torch.Tensor, float]:
    """The policy-gradient loss of one group (and its KL to the reference, 0 without one)."""
    mask = completion_mask(completions)
    lengths = mask.sum(dim=1).clamp(min=1.0)
    logp = token_logprobs(model, prompt, completions)
    per_seq = (logp * mask).sum(dim=1) / lengths
    loss = -(adv * per_seq).mean()
    kl_value = 0.0
    if reference is not None and kl_coef > 0:
        with torch.no_grad():
            ref = token_logprobs(reference, prompt, completions)
        delta = ref - logp
        kl = ((torch.exp(delta) - delta - 1.0) * mask).sum(dim=1) / lengths
        loss = loss + kl_coef * kl.mean()
        kl_value = float(kl.mean().detach())
    return loss, kl_value


@torch.no_grad()
def evaluate(model: torch.nn.Module, examples: Sequence[tuple[str, str]], max_new: int,
             temperature: float, samples: int, seed: int) -> float:
    """The mean reward on ``examples``: ``samples`` completions each at ``temperature`` from a
    generator seeded by ``seed`` (the same draws at RL's start and end), or greedy (one
    each) at temperature 0. Prompts of one length are batched together."""
    if not examples:
        return 0.0
    by_len: dict[int, list[tuple[list[int], str]]] = {}
    for p, a in examples:
        ids = prompt_ids(p)
        by_len.setdefault(len(ids), []).append((ids, a))
    gen = torch.Generator().manual_seed(seed)
    each = samples if temperature > 0 else 1
    total = 0.0
    was_training = model.training
    model.eval()
    for length in sorted(by_len):
        items = by_len[length]
        rows = [ids for ids, _ in items for _ in range(each)]
        comps = sample_rows(model, rows, max_new, temperature, gen)
        answers = [a for _, a in items for _ in range(each)]
        total += sum(reward(c.tolist(), a) for c, a in zip(comps, answers, strict=True))
    model.train(was_training)
    return total / (len(examples) * each)


class RewardMeter:
    """The RL phase's figures, saved with the checkpoint: the greedy accuracy at RL's start
    (so a resumed run compares with the same start) and an average of the sampled reward."""

    def __init__(self, alpha: float = 0.1) -> None:
        self.alpha, self.start, self.value, self.count = alpha, -1.0, 0.0, 0
        self.greedy_start = -1.0

    def add(self, mean_reward: float) -> None:
        self.value = mean_reward if self.count == 0 else \
            (1 - self.alpha) * self.value + self.alpha * mean_reward
        self.count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"start": self.start, "value": self.value, "count": self.count,
                "greedy_start": self.greedy_start}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.start, self.value = float(state["start"]), float(state["value"])
        self.count = int(state["count"])
        self.greedy_start = float(state["greedy_start"])
