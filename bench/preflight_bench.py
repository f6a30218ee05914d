"""What a preflight costs and what it finds, on this machine (the embedded default's gloo run).

    PYTHONPATH=. python bench/preflight_bench.py [--nodes 2,3,4] [--mode quick] [--slow-s 0.3]

For each gang size: a preflight of healthy nodes, then one with the last node's link slowed
(``GlooPreflight.degrade_link``: its process pauses before every collective). Printed: the
wall time of each (what the job waits: scheduling badput, cause ``preflight``), the gang's
and the slowest pair's bus bandwidth, and the culprits the policy names. One process per node
and each imports torch: on a loaded 2-core machine most of the time is that import.
"""

from __future__ import annotations

import argparse
import time

from shared.adapters.compute.preflight_gloo import GlooPreflight
from shared.policies.preflight import PLANS, culprits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="2,3,4")
    parser.add_argument("--mode", default="quick", choices=sorted(PLANS))
    parser.add_argument("--slow-s", type=float, default=0.3)
    args = parser.parse_args()
    plan = PLANS[args.mode]
    print(f"mode {args.mode}: {plan.message_bytes} B x {plan.iterations}, floor "
          f"{plan.min_busbw_gbps} GB/s")
    print("nodes  slowed  wall_s  gang_GBps  min_pair_GBps  culprits")
    for n in (int(x) for x in args.nodes.split(",")):
        nodes = [f"n{i}" for i in range(n)]
        for slowed in (False, True):
            runner = GlooPreflight()
            if slowed:
                runner.degrade_link(nodes[-1], args.slow_s)
            start = time.perf_counter()
            result = runner.run_preflight("bench", nodes, plan)
            wall = time.perf_counter() - start
            gang = result.collectives[0].busbw_gbps
            pairs = [c.busbw_gbps for c in result.collectives[1:] if c.busbw_gbps is not None]
            named = [c.node_id for c in culprits(result, plan)]
            print(f"{n:5d}  {'yes' if slowed else 'no':6s}  {wall:6.1f}  "
                  f"{gang if gang is not None else float('nan'):9.4f}  "
                  f"{min(pairs) if pairs else float('nan'):13.4f}  {','.join(named) or '-'}")


if __name__ == "__main__":
    main()
