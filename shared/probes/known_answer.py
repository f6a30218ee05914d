"""A known-answer compute test: a fixed matrix product whose checksum is known in advance.

Silent data corruption (a GPU or CPU that computes wrong numbers without an error) is found
only by computing something whose answer is known: CoreWeave runs such a test on idle nodes
every hour. The inputs are small integers, so the float32 product is exact on any correct
machine and its weighted checksum is one number, ``EXPECTED``; a different number is
corruption, whatever the speed. The time taken, against the node type's baseline, is the
slowness half of the test.

Here it runs on the CPU (torch when installed, else numpy): the stand-in for the same test on
a GPU, which would run the product on each device. ``corrupt_by`` adds to one product entry:
the fault-injection hook that tests and demos use to play a node that computes wrong.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.domain.health import Condition, ConditionType
from shared.probes.conditions import healthy, problem

CTYPE = ConditionType.KNOWN_ANSWER_MISMATCH.value
SIZE, SEED = 128, 20261203
EXPECTED = 3381761  # the checksum of the product below on a correct machine


@dataclass(frozen=True)
class KnownAnswer:
    checksum: int
    elapsed_s: float

    @property
    def correct(self) -> bool:
        return self.checksum == EXPECTED


def compute(corrupt_by: int = 0, repeats: int = 3) -> KnownAnswer:
    """Run the product ``repeats`` times (the best time counts; every checksum must match)."""
    import numpy as np  # here: every process that wires a node imports this module

    rng = np.random.default_rng(SEED)
    a = rng.integers(-8, 9, (SIZE, SIZE)).astype(np.float32)
    b = rng.integers(-8, 9, (SIZE, SIZE)).astype(np.float32)
    weights = (np.arange(SIZE * SIZE, dtype=np.int64).reshape(SIZE, SIZE) % 997) + 1
    best, checksum = float("inf"), EXPECTED
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        product = np.matmul(a, b)
        best = min(best, time.perf_counter() - start)
        exact = product.astype(np.int64)
        exact[0, 0] += corrupt_by
        value = int((exact * weights).sum())
        if value != EXPECTED:
            checksum = value
    return KnownAnswer(checksum, best)


def condition(result: KnownAnswer, now: float, *, baseline_s: float | None = None,
              min_ratio: float = 0.5, extra: Mapping[str, Any] | None = None) -> Condition:
    """TRUE with ``corrupt`` on a wrong answer; TRUE with ``slow`` when slower than
    ``min_ratio`` of the baseline; FALSE otherwise (no baseline: correctness only)."""
    ratio = round(baseline_s / result.elapsed_s, 3) if baseline_s and result.elapsed_s > 0 \
        else None
    details: dict[str, Any] = {**(extra or {}), "checksum": result.checksum, "expected": EXPECTED,
                               "elapsed_s": result.elapsed_s, "ratio_to_baseline": ratio,
                               "corrupt": not result.correct,
                               "slow": ratio is not None and ratio < min_ratio}
    if not result.correct:
        return problem(CTYPE, now, f"known-answer test: checksum {result.checksum} != "
                       f"{EXPECTED} (silent data corruption)", details)
    if details["slow"]:
        return problem(CTYPE, now, f"known-answer test at {ratio:.2f}x of baseline speed",
                       details)
    return healthy(CTYPE, now, "known-answer test correct", details)
