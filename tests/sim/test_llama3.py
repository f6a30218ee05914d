"""Llama 3 405B at full scale (2,048 nodes x 8 GPUs, 54 days) against the published figures.

Slow: one replication takes about a minute with the proposed provisioning change and about
three minutes without it (docs/simulator.md), so it is marked ``slow``.
"""

from __future__ import annotations

import math

import pytest

from simulator import twin
from simulator.failures import LLAMA3_PLANNED, LLAMA3_UNEXPECTED, LLAMA3_UNEXPECTED_TOTAL
from simulator.scenario import load_scenario


@pytest.mark.slow
def test_llama3_interruptions_and_effective_training_time() -> None:
    result = twin.run(load_scenario(), seed=1)
    counts = dict(result.interruptions)
    planned = counts.pop("planned_maintenance", 0)
    unexpected = sum(counts.values())
    # a Poisson count: within 4 standard deviations, less the few faults that hit an attempt
    # already dead (docs/validation.md)
    sd = math.sqrt(LLAMA3_UNEXPECTED_TOTAL)
    assert LLAMA3_UNEXPECTED_TOTAL - 4 * sd - 20 < unexpected < LLAMA3_UNEXPECTED_TOTAL + 4 * sd
    assert abs(planned - LLAMA3_PLANNED) < 4 * math.sqrt(LLAMA3_PLANNED)
    for cause in ("faulty_gpu", "gpu_hbm3", "software_bug"):
        published = LLAMA3_UNEXPECTED[cause][2]
        assert abs(counts.get(cause, 0) - published) < 4 * math.sqrt(published) + 5
    job = result.job()
    assert job.ettr > 0.88  # published: "more than 90% effective training time"
    assert job.scheduling_goodput > 0.99  # 32 spares were enough
    assert result.dead_letters == 0 and result.bus["gave_up"] == 0
