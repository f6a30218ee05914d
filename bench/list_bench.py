#!/usr/bin/env python3
"""What one page of a list costs as the collection grows (docs/scale.md).

    PYTHONPATH=. .venv/bin/python bench/list_bench.py [--jobs 1000 5000] [--repeat 20]

In process (flask's test client over the embedded API, no sockets; the control plane's
delivery is left out, as ``mtc serve``'s control loop runs it on its own thread): one
cluster and N jobs (``bench/api_seed.py``: one job made through the API, cloned in the
store). Prints the median time of ``customJobs?pageSize=1``, of the console's
poll (``pageSize=100``, the console's own page) and of a filtered page at each N.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from api_seed import AUTH, BASE, grow, in_process, seed


def timed(client: Any, url: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        resp = client.get(url, headers=AUTH)
        times.append(time.perf_counter() - start)
        assert resp.status_code == 200, resp.json
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        app, client = in_process(Path(tmp) / "state")
        seed(app, client, 1)
        base = BASE
        print(f"{'jobs':>6} {'pageSize=1':>11} {'pageSize=100':>12} {'filtered':>9}  (median ms)")
        for n in args.jobs:
            grow(app, n)
            one = timed(client, f"{base}/customJobs?pageSize=1", args.repeat)
            console = timed(client, f"{base}/customJobs?pageSize=100", args.repeat)
            filtered = timed(client, f'{base}/customJobs?pageSize=1&filter=displayName="x"',
                             max(3, args.repeat // 4))
            print(f"{n:>6} {one:>11.1f} {console:>12.1f} {filtered:>9.1f}")
        app.compute.kill_all()
        app.close()


if __name__ == "__main__":
    main()
