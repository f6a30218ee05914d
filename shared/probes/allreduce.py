"""The ranks of a preflight (``python -m shared.probes.allreduce OUT``): a real all-reduce.

Started by ``shared.adapters.compute.preflight_gloo`` with ``WORLD_SIZE``/``MASTER_ADDR``/
``MASTER_PORT``: it imports torch once and forks one process per node of the gang (rank r
plays node r; an import per process cost seconds each on a loaded machine). Each rank runs,
over torch.distributed
with gloo (the CPU backend; ``all_reduce_perf`` over NCCL is the same test where GPUs exist):

1. its own check: the known-answer compute test (``shared.probes.known_answer``), the stand-in
   for the DCGM diagnostic a GPU node would run;
2. a timed all-reduce over the whole gang, then over each ring pair (rank i with i+1), each
   checked against the known sum; bus bandwidth as nccl-tests counts it,
   ``2 (n-1) / n x bytes / time``.

It writes its findings as JSON to ``OUT/<rank>.json``. ``MTC_PREFLIGHT_DELAYS`` (JSON, rank
to a pause before every collective it enters) and ``MTC_PREFLIGHT_CORRUPT`` (JSON, rank to
an error added to its values) are fault injection: a slow link and a node that computes
wrong, for tests and demos.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _timed(group: Any, ranks: list[int], rank: int, nbytes: int, iters: int, delay: float,
           corrupt: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    n = len(ranks)
    tensor = torch.full((max(1, nbytes // 4),), float(rank + 1))
    expected = float(sum(r + 1 for r in ranks))
    wrong, elapsed = 0, 0.0
    dist.all_reduce(tensor, group=group)  # warm-up: connections
    for _ in range(iters):
        tensor.fill_(float(rank + 1) + corrupt)
        start = time.perf_counter()
        if delay:
            time.sleep(delay)
        dist.all_reduce(tensor, group=group)
        elapsed += time.perf_counter() - start
        wrong += int((tensor != expected + corrupt * n).sum()) if corrupt else \
            int((tensor != expected).sum())
    per = elapsed / max(1, iters)
    busbw = 2 * (n - 1) / n * tensor.numel() * 4 / per / 1e9 if per > 0 else 0.0
    return {"ranks": ranks, "busbw_gbps": busbw, "wrong": wrong, "seconds": per}


def launch(out: Path) -> int:
    """Import torch once, fork a process per rank, wait for them; the worst exit code."""
    import torch.distributed  # noqa: F401  (imported before the fork: once for all ranks)

    world = int(os.environ["WORLD_SIZE"])
    pids = []
    for rank in range(world):
        pid = os.fork()
        if pid == 0:  # the rank's own process
            code = 1
            try:
                code = rank_main(out, rank, world)
            finally:
                os._exit(code)
        pids.append(pid)
    worst = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        worst = max(worst, os.waitstatus_to_exitcode(status) & 0xFF)
    return worst


def rank_main(out: Path, rank: int, world: int) -> int:
    import torch.distributed as dist

    from shared.probes import known_answer

    nbytes = int(os.environ.get("MTC_PREFLIGHT_BYTES", str(1 << 20)))
    iters = int(os.environ.get("MTC_PREFLIGHT_ITERS", "5"))
    delay = float(json.loads(os.environ.get("MTC_PREFLIGHT_DELAYS", "{}")).get(str(rank), 0))
    corrupt = int(json.loads(os.environ.get("MTC_PREFLIGHT_CORRUPT", "{}")).get(str(rank), 0))
    answer = known_answer.compute(corrupt_by=corrupt)
    found: dict[str, Any] = {
        "rank": rank,
        "node_check": {"ok": answer.correct, "reason": (
            "known-answer test correct (stand-in for DCGM: no GPU)" if answer.correct else
            f"known-answer test wrong: checksum {answer.checksum} (stand-in for DCGM)")},
        "collectives": []}
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=_timeout())
    try:
        everyone = list(range(world))
        found["collectives"].append(_timed(None, everyone, rank, nbytes, iters, delay,
                                           corrupt))
        if world > 2:
            pairs = [sorted({i, (i + 1) % world}) for i in range(world)]
            groups = [dist.new_group(p) for p in pairs]  # every rank makes every group
            for pair, group in zip(pairs, groups, strict=True):
                if rank in pair:
                    found["collectives"].append(_timed(group, pair, rank, nbytes, iters,
                                                       delay, corrupt))
                dist.barrier()
    finally:
        dist.destroy_process_group()
    (out / f"{rank}.json").write_text(json.dumps(found))
    return 0


def _timeout() -> Any:
    from datetime import timedelta
    return timedelta(seconds=float(os.environ.get("MTC_PREFLIGHT_TIMEOUT_S", "60")))


if __name__ == "__main__":
    sys.exit(launch(Path(sys.argv[1])))
