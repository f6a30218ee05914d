"""What each checkpoint tier costs a training step, measured on this machine: the seconds a
save blocks the step (tier 1/2: the snapshot copy; durable: the whole write), the seconds
the background thread then takes to write memory and peer entries, and the restore.

    .venv/bin/python bench/tiers_bench.py [--mib 64] [--repeat 3] [--dir /dev/shm/mtc-bench]

Tier 1 goes under ``--dir`` (tmpfs by default, as on a node), tier 2 and durable under a
temporary directory on the working disk (a stand-in for the buddy's memory over the network
and for object storage: their real bandwidth is the twin's business, docs/simulator.md).
docs/recovery.md records a run.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from mtc_program.tiers import TieredCheckpointer, TierSettings


def measure(mib: int, repeat: int, memory: Path) -> dict[str, float]:
    n = mib * 2**20 // 8
    state = {"w": np.random.default_rng(0).standard_normal(n), "step": np.array(0)}
    disk = Path(tempfile.mkdtemp(prefix="mtc-tiers-bench-"))
    out: dict[str, list[float]] = {k: [] for k in ("snapshot", "background", "durable", "restore")}
    try:
        for i in range(repeat):
            settings = TierSettings(rank=0, world_size=1, durable_dir=disk / "durable",
                                    tier1_dir=memory / f"r{i}" / "rank-0",
                                    tier2_dir=disk / f"r{i}" / "peer" / "rank-0",
                                    tier1_every=1, tier2_every=1, tier3_every=0)
            cp = TieredCheckpointer(settings, log=lambda _: None)
            report = cp.save(1, state, ("memory", "peer"))
            began = time.perf_counter()
            cp.flush()
            out["snapshot"].append(report.blocking_s)
            out["background"].append(time.perf_counter() - began + report.blocking_s)
            out["durable"].append(cp.save(2, state, ("durable",)).blocking_s)
            cp.close()
            began = time.perf_counter()
            restored = TieredCheckpointer(settings, log=lambda _: None).restore()
            out["restore"].append(time.perf_counter() - began)
            assert restored is not None and restored.tier == "durable" and restored.step == 2
    finally:
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(memory, ignore_errors=True)
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=64, help="state size in MiB")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", type=Path, default=Path("/dev/shm/mtc-bench"), help="tier 1's root")
    args = p.parse_args()
    got = measure(args.mib, args.repeat, args.dir)
    print(f"state {args.mib} MiB, median of {args.repeat}:")
    print(f"  tier 1/2 save blocks the step   {got['snapshot'] * 1000:9.1f} ms  (the snapshot copy)")
    print(f"  memory + peer written by        {got['background'] * 1000:9.1f} ms  (background thread)")
    print(f"  durable save blocks the step    {got['durable'] * 1000:9.1f} ms")
    print(f"  restore (newest, verified)      {got['restore'] * 1000:9.1f} ms")


if __name__ == "__main__":
    main()
