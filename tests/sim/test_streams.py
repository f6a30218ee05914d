"""The twin's random numbers are numpy's: its keyed streams seed PCG64 with numpy's own bits
(the state the twin computes for it is numpy SeedSequence's, word for word, and the draws that
follow are the same), and the bus's block draws are the draws one at a time."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.readers import Dist
from simulator.streams import Streams, _SeedSequence, pcg64_seeds, stable_key

words = st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=8)


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(entropy=words)
def test_the_state_is_numpys(entropy: list[int]) -> None:
    mine, numpys = _SeedSequence(np.array(entropy, dtype=np.uint32)), np.random.SeedSequence(
        np.array(entropy, dtype=np.uint32))
    assert mine.generate_state(4, np.uint64).tolist() == numpys.generate_state(
        4, np.uint64).tolist()
    draws = np.random.Generator(np.random.PCG64(mine)).random(4)
    assert draws.tolist() == np.random.Generator(np.random.PCG64(numpys)).random(4).tolist()


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(base=st.integers(0, 2**63 - 1), domain=st.integers(0, 2**32 - 1),
       names=st.lists(st.text(max_size=12), min_size=1, max_size=20, unique=True))
def test_streams_seeded_many_at_once_are_the_streams_seeded_one_by_one(
        base: int, domain: int, names: list[str]) -> None:
    """``Streams.seed_many`` (SeedSequence's hashing for every name in one vectorized pass)
    gives each stream numpy's own seed for its entropy, so the same draws as ``rng`` alone."""
    seeds = pcg64_seeds((*Streams(base)._words, domain),
                        np.array([stable_key(n) for n in names], dtype=np.uint32))
    for name, seed in zip(names, seeds, strict=True):
        numpys = np.random.SeedSequence([base, domain, stable_key(name)])
        assert seed.tolist() == numpys.generate_state(4, np.uint64).tolist()
    many, one = Streams(base), Streams(base)
    many.seed_many(domain, names)
    for name in names:
        assert many.rng(domain, name).random(3).tolist() == one.rng(domain, name).random(3).tolist()
    assert many.rng(domain, names[0]).random(3).tolist() == one.rng(domain, names[0]).random(
        3).tolist()  # asked for again: seeded again, to the same state


@pytest.mark.slow
@given(entropy=words, n_words=st.integers(1, 9))
def test_any_other_request_is_numpys_own(entropy: list[int], n_words: int) -> None:
    mine, numpys = _SeedSequence(entropy), np.random.SeedSequence(entropy)
    for dtype in (np.uint32, np.uint64):
        assert mine.generate_state(n_words, dtype).tolist() == numpys.generate_state(
            n_words, dtype).tolist()


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["fixed", "lognormal", "uniform", "exponential"]),
       st.floats(0.001, 100.0), st.floats(0.0, 3.0), st.integers(0, 2**32 - 1),
       st.integers(1, 1200), st.integers(1, 64))
def test_block_draws_are_the_draws_one_at_a_time(kind: str, a: float, b: float, seed: int,
                                                 n: int, block: int) -> None:
    """The bus draws its latencies a block at a time (``Dist.draws``): the same numbers, in
    the same order, as ``Dist.sample`` called once per event on the same stream."""
    dist = Dist(kind, a, a + b if kind == "uniform" else b)
    one_by_one = np.random.default_rng(seed)
    expected = [dist.sample(one_by_one) for _ in range(n)]
    draws = dist.draws(np.random.default_rng(seed), block)
    assert [next(draws) for _ in range(n)] == expected
