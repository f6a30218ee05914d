"""Keyed random streams: numpy Generators seeded by what they are for (the run's seed, a
domain, a name, indexes), so common random numbers survive changes of fleet size, spares and
repair times.

A stream's PCG64 starts from numpy ``SeedSequence``'s state for its entropy words, bit for
bit: one at a time through :class:`_SeedSequence` (numpy's pool, the output hash computed
here), or, for many names at once (a fleet's bring-up asks for two streams per node), the
whole of SeedSequence's hashing done in one vectorized pass over the names
(:meth:`Streams.seed_many`), each stream then built from its row of states.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.random.bit_generator import ISeedSequence

# stream domains: each kind of randomness has its own keyed family of streams
FAILURES_DOMAIN = 1  # per node: lemon draw, fault arrivals, causes, variants, true fixes
REPAIR_DOMAIN = 2  # per (node, repair attempt): duration, mechanical failure
DETECT_DOMAIN = 3  # per (node, fault number): detection delay
PROVISION_DOMAIN = 4  # per node: boot time (or the replacement's lead time)
RECOVERY_DOMAIN = 5  # per (job, attempt): a recovery's fallback, a software fault's recurrence


_Generator, _PCG64 = np.random.Generator, np.random.PCG64
_WORD = 0xFFFF_FFFF


def _hash_consts() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """SeedSequence's output hash constants for 8 words: before and after each multiply."""
    before, after, h = [], [], 0x8B51F9DD  # numpy's INIT_B
    for _ in range(8):
        before.append(h)
        h = (h * 0x58F38DED) & _WORD  # MULT_B
        after.append(h)
    return tuple(before), tuple(after)


_H, _H2 = _hash_consts()


class _SeedSequence(np.random.SeedSequence):
    """numpy's SeedSequence, with the one state PCG64 asks for (4 x uint64 from a pool of 4)
    computed here: the same bits (a test checks them against numpy's), without the
    ``np.errstate`` context, the zeroed array and the three dtype conversions around
    numpy's 8-step loop, which cost half of a stream's setup (5,000 streams a run)."""

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        pool = self.pool
        if n_words != 4 or dtype is not np.uint64 or len(pool) != 4:
            return super().generate_state(n_words, dtype)
        p0, p1, p2, p3 = pool.tolist()
        h, h2 = _H, _H2
        # word i: (pool[i % 4] ^ h[i]) * h2[i], then xor its high half into its low half
        # (unrolled: a loop costs as much as numpy's own overhead)
        w0 = ((p0 ^ h[0]) * h2[0]) & _WORD
        w1 = ((p1 ^ h[1]) * h2[1]) & _WORD
        w2 = ((p2 ^ h[2]) * h2[2]) & _WORD
        w3 = ((p3 ^ h[3]) * h2[3]) & _WORD
        w4 = ((p0 ^ h[4]) * h2[4]) & _WORD
        w5 = ((p1 ^ h[5]) * h2[5]) & _WORD
        w6 = ((p2 ^ h[6]) * h2[6]) & _WORD
        w7 = ((p3 ^ h[7]) * h2[7]) & _WORD
        return np.array(((w0 ^ w0 >> 16) | (w1 ^ w1 >> 16) << 32,
                         (w2 ^ w2 >> 16) | (w3 ^ w3 >> 16) << 32,
                         (w4 ^ w4 >> 16) | (w5 ^ w5 >> 16) << 32,
                         (w6 ^ w6 >> 16) | (w7 ^ w7 >> 16) << 32), dtype=np.uint64)


def stable_key(text: str) -> int:
    """A 32-bit key for a name, the same in every process (``hash()`` is salted)."""
    return zlib.crc32(text.encode("utf-8"))


class Streams:
    """Random streams keyed by what they are for, so common random numbers survive changes
    of fleet size, spares and repair times: node ``n``'s faults come from the stream keyed
    (seed, node id) whatever other nodes exist, and the duration of its ``k``-th repair from
    the stream keyed (seed, node id, k), whatever was drawn before (numpy ``SeedSequence``
    entropy lists: independent streams for distinct keys)."""

    def __init__(self, base: int) -> None:
        self.base = base
        # the base as SeedSequence reads an int: 32-bit words, least significant first
        words, rest = [], base
        while True:
            words.append(rest & _WORD)
            rest >>= 32
            if not rest:
                break
        self._words = tuple(words)
        # (domain, name) -> the PCG64 seed words ``seed_many`` computed, until ``rng`` takes
        # them (each once: a stream asked for again is seeded again, to the same state)
        self._seeded: dict[tuple[int, str], np.ndarray] = {}

    @classmethod
    def from_rng(cls, rng: np.random.Generator) -> Streams:
        return cls(int(rng.integers(2**63)))

    def rng(self, domain: int, name: str, *index: int) -> np.random.Generator:
        # what ``default_rng([base, domain, key, *index])`` builds, with the entropy handed
        # over as the uint32 words SeedSequence would make of that list (the same numbers,
        # a quarter cheaper: two streams per node)
        if not index and self._seeded:
            row = self._seeded.pop((domain, name), None)
            if row is not None:  # (numpy takes any ISeedSequence; its stubs say SeedSequence)
                return _Generator(_PCG64(_Seeded(row)))  # type: ignore[arg-type]
        key = stable_key(name)
        if domain > _WORD or any(not 0 <= i <= _WORD for i in index):
            return _Generator(_PCG64(_SeedSequence([self.base, domain, key, *index])))
        words = np.array((*self._words, domain, key, *index), dtype=np.uint32)
        return _Generator(_PCG64(_SeedSequence(words)))

    def seed_many(self, domain: int, names: Sequence[str]) -> None:
        """Compute the seeds of the streams ``(domain, name)`` for every name in one
        vectorized pass (``rng`` then builds each from its seed), not one SeedSequence per
        stream: a bring-up seeds 4,000 streams."""
        if not names or domain > _WORD:
            return
        keys = np.fromiter(map(stable_key, names), dtype=np.uint32, count=len(names))
        seeds = pcg64_seeds((*self._words, domain), keys)
        self._seeded.update(zip(((domain, name) for name in names), seeds, strict=True))


class _Seeded(ISeedSequence):
    """A seed computed beforehand (``Streams.seed_many``): what PCG64 asks its seed sequence
    for, handed over as it is."""

    __slots__ = ("_words",)

    def __init__(self, words: np.ndarray) -> None:
        self._words = words

    def generate_state(self, n_words: int, dtype: Any = np.uint32) -> np.ndarray:
        if n_words != 4 or dtype is not np.uint64:
            raise ValueError("a precomputed seed answers PCG64's request only")
        return self._words


# numpy SeedSequence's hashing constants (numpy/random/bit_generator.pyx)
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_POOL = 4


def pcg64_seeds(prefix: Sequence[int], keys: np.ndarray) -> np.ndarray:
    """The 4 x uint64 seed words numpy's ``SeedSequence(entropy)`` gives PCG64, for each
    entropy ``(*prefix, key)`` with ``key`` from ``keys`` (uint32): SeedSequence's entropy
    mixing and output hash, each step applied to every key at once (uint32 arithmetic wraps
    as numpy's C code does). Returns an (n, 4) uint64 array."""
    n = len(keys)
    u32 = np.uint32

    def const(value: int) -> np.ndarray:
        return np.full(n, value, dtype=u32)

    entropy = [const(w) for w in prefix] + [keys.astype(u32)]
    hash_const = _INIT_A

    def hashmix(value: np.ndarray) -> np.ndarray:
        nonlocal hash_const
        value = value ^ u32(hash_const)
        hash_const = (hash_const * _MULT_A) & _WORD
        value = value * u32(hash_const)
        return value ^ (value >> u32(16))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        result: np.ndarray = x * u32(_MIX_MULT_L) - y * u32(_MIX_MULT_R)
        mixed: np.ndarray = result ^ (result >> u32(16))
        return mixed

    pool = [hashmix(entropy[i] if i < len(entropy) else const(0)) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(_POOL, len(entropy)):
        for dst in range(_POOL):
            pool[dst] = mix(pool[dst], hashmix(entropy[src]))
    # generate_state(4, uint64): 8 words hashed out of the pool, paired low then high
    out = np.empty((n, 4), dtype=np.uint64)
    h = _INIT_B
    words = []
    for i in range(8):
        value = pool[i % _POOL] ^ u32(h)
        h = (h * _MULT_B) & _WORD
        value = value * u32(h)
        words.append((value ^ (value >> u32(16))).astype(np.uint64))
    for i in range(4):
        out[:, i] = words[2 * i] | (words[2 * i + 1] << np.uint64(32))
    return out
