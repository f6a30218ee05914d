"""Data the recipes build on the machine, with no download: a byte-level tokenizer, a corpus
of the Python standard library's own sources, and generated instruction tasks with checkable
answers.

* ``ByteTokenizer``: ids 0-255 are bytes, then PAD, BOS, EOS (vocabulary 259): defined
  locally, nothing to train or fetch, and it round-trips any text.
* ``stdlib_corpus``: the ``.py`` files under the standard library's directory (sorted, so the
  same install gives the same bytes), up to ``max_bytes``.
* ``TokenStream``: a rank's loader over the corpus in fixed windows, in an order drawn from
  ``seed`` and the epoch; its position (epoch, index) is a ``Stateful`` the checkpoint saves.
* ``sft_examples``: arithmetic and string tasks (``12+35=`` -> ``47``, ``reverse abc`` ->
  ``cba``) as (prompt, answer); ``SftStream`` batches them with labels masked (-100) to the
  answer tokens, so the loss is the answers' alone.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

PAD, BOS, EOS = 256, 257, 258
VOCAB_SIZE = 259
IGNORE = -100  # the label torch's cross-entropy skips


class ByteTokenizer:
    vocab_size = VOCAB_SIZE
    pad_id, bos_id, eos_id = PAD, BOS, EOS

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def stdlib_corpus(max_bytes: int) -> bytes:
    """The standard library's .py sources, in sorted path order, cut at ``max_bytes``."""
    root = Path(os.__file__).resolve().parent
    parts: list[bytes] = []
    size = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        parts.append(data)
        size += len(data)
        if size >= max_bytes:
            break
    return b"".join(parts)[:max_bytes]


class TokenStream:
    """Windows of ``seq_len + 1`` tokens for one rank: epoch ``e``'s order is a permutation
    drawn from ``(seed, e)``, and rank ``r`` of ``w`` takes every ``w``-th window."""

    def __init__(self, corpus: bytes, seq_len: int, batch_size: int, seed: int, rank: int,
                 world_size: int) -> None:
        self.data = torch.frombuffer(bytearray(corpus), dtype=torch.uint8).long()
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.rank, self.world_size = rank, world_size
        self.windows = (len(self.data) - 1) // seq_len
        if self.windows < batch_size * world_size:
            raise ValueError(f"corpus of {len(self.data)} tokens is too small for "
                             f"{batch_size * world_size} windows of {seq_len}")
        self.epoch, self.index = 0, 0
        self._order: list[int] = []
        self._order_epoch = -1

    def _mine(self) -> list[int]:
        if self._order_epoch != self.epoch:
            order = list(range(self.windows))
            random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
            self._order = order[self.rank :: self.world_size]
            self._order_epoch = self.epoch
        return self._order

    def place(self, rank: int, world_size: int) -> None:
        """Take rank ``rank``'s share from now on (an in-process restart's new rank)."""
        self.rank, self.world_size, self._order_epoch = rank, world_size, -1

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(input ids, labels) of shape (batch, seq_len)."""
        rows = []
        for _ in range(self.batch_size):
            mine = self._mine()
            if self.index >= len(mine):
                self.epoch, self.index = self.epoch + 1, 0
                mine = self._mine()
            start = mine[self.index] * self.seq_len
            rows.append(self.data[start : start + self.seq_len + 1])
            self.index += 1
        block = torch.stack(rows)
        return block[:, :-1].contiguous(), block[:, 1:].contiguous()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])


def sft_examples(count: int, seed: int) -> list[tuple[str, str]]:
    """Generated tasks with checkable answers: sums, differences, reversals, upper-casing."""
    rng = random.Random(seed)
    letters = "abcdefghij"
    out: list[tuple[str, str]] = []
    for _ in range(count):
        kind = rng.randrange(4)
        if kind == 0:
            a, b = rng.randrange(50), rng.randrange(50)
            out.append((f"{a}+{b}=", str(a + b)))
        elif kind == 1:
            a, b = rng.randrange(50, 100), rng.randrange(50)
            out.append((f"{a}-{b}=", str(a - b)))
        else:
            word = "".join(rng.choice(letters) for _ in range(rng.randrange(3, 6)))
            if kind == 2:
                out.append((f"reverse {word}:", word[::-1]))
            else:
                out.append((f"upper {word}:", word.upper()))
    return out


def encode_example(prompt: str, answer: str, seq_len: int) -> tuple[list[int], list[int]]:
    """Ids and labels (next-token, -100 outside the answer and its EOS), padded to seq_len."""
    tok = ByteTokenizer()
    p, a = [BOS, *tok.encode(prompt)], [*tok.encode(answer), EOS]
    ids = (p + a)[: seq_len + 1]
    target = ([IGNORE] * len(p) + a)[: seq_len + 1]
    ids += [PAD] * (seq_len + 1 - len(ids))
    target += [IGNORE] * (seq_len + 1 - len(target))
    return ids[:-1], target[1:]


class SftStream:
    """Batches of generated tasks for one rank, position as a ``Stateful`` (like TokenStream)."""

    def __init__(self, count: int, seq_len: int, batch_size: int, seed: int, rank: int,
                 world_size: int) -> None:
        self.examples = [encode_example(p, a, seq_len) for p, a in sft_examples(count, seed)]
        self.batch_size, self.seed, self.rank, self.world_size = batch_size, seed, rank, world_size
        self.epoch, self.index = 0, 0

    def _mine(self) -> list[int]:
        order = list(range(len(self.examples)))
        random.Random(self.seed * 7_919 + self.epoch).shuffle(order)
        return order[self.rank :: self.world_size]

    def place(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        ids, labels = [], []
        mine = self._mine()
        for _ in range(self.batch_size):
            if self.index >= len(mine):
                self.epoch, self.index = self.epoch + 1, 0
                mine = self._mine()
            i, t = self.examples[mine[self.index]]
            ids.append(i)
            labels.append(t)
            self.index += 1
        return torch.tensor(ids), torch.tensor(labels)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
