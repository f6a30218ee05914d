"""Bias of ``mtc sim fit``'s rates: the round-trip scenario over many seeds, the fitted count of
each reported cause against the twin's own (``RunResult.failures``) and against rate x the
fitted exposure. Numbers in docs/simulator.md (``mtc sim fit``).

    .venv/bin/python bench/fit_bias.py --seeds 160     # ~1 min on one core
"""

from __future__ import annotations

import argparse
import copy
import statistics

from simulator import fit as fitting
from simulator import twin
from simulator.scenario import parse_scenario
from tests.sim.test_fit import KNOWN

REPORTED = ("gpu_off_bus", "hbm", "dead_host")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=160)
    args = ap.parse_args()
    rates = {k: v["per_1000_node_days"] / 1000 for k, v in KNOWN["failures"]["causes"].items()}
    fitted: dict[str, list[int]] = {c: [] for c in REPORTED}
    drawn: dict[str, list[int]] = {c: [] for c in REPORTED}
    expected: dict[str, list[float]] = {c: [] for c in REPORTED}
    for seed in range(1, args.seeds + 1):
        result = twin.run(parse_scenario({**copy.deepcopy(KNOWN), "seed": seed}))
        f = fitting.fit(result.rows)
        for c in REPORTED:
            cf = f.cause(c)
            fitted[c].append(cf.count)
            drawn[c].append(result.failures[c])
            expected[c].append(rates[c] * cf.exposure_node_days)
            if cf.count != result.failures[c]:
                print(f"seed {seed}: {c} fitted {cf.count}, the twin drew {result.failures[c]}")
    n = args.seeds
    for c in REPORTED:
        mean, exp = statistics.fmean(fitted[c]), statistics.fmean(expected[c])
        print(f"{c}: fitted {mean:.2f} a run (twin {statistics.fmean(drawn[c]):.2f}), expected "
              f"{exp:.2f}, z {(mean - exp) / (exp / n) ** 0.5:+.2f}, variance "
              f"{statistics.pvariance(fitted[c]):.1f}; seeds 1-8: {fitted[c][:8]}")


if __name__ == "__main__":
    main()
