"""Preflight on the embedded default: a real multi-process gloo all-reduce, one process per
node of the gang (``shared.probes.allreduce``), bounded by the plan's timeout.

The embedded default's nodes are simulated on one machine, so "on node X" means "the process
that plays node X" (forked from one that imported torch once): the all-reduce, its timing
and its known sum are real, the network between the nodes is the loopback. Where GPUs exist
the same port runs ``dcgmi diag -r N`` per node and ``all_reduce_perf`` across them
(``preflight_nccl``).

``degrade_link`` and ``corrupt`` are fault injection for tests and demos: the named node's
process pauses before every collective (a slow NIC), or computes wrong (corruption).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from shared.policies.preflight import NodeCheck, PairCheck, PreflightPlan, PreflightResult


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GlooPreflight:
    """The ``shared.ports.Preflight`` capability over local processes."""

    def __init__(self, python: str = sys.executable, now: Callable[[], float] = time.time
                 ) -> None:
        self.python = python
        self.now = now
        self.link_delay_s: dict[str, float] = {}
        self.corrupted: dict[str, int] = {}
        self.runs: list[tuple[str, tuple[str, ...]]] = []

    def degrade_link(self, node_id: str, delay_s: float) -> None:
        self.link_delay_s[node_id] = delay_s

    def corrupt(self, node_id: str, by: int = 1) -> None:
        self.corrupted[node_id] = by

    def run_preflight(self, job_id: str, node_ids: Sequence[str], plan: PreflightPlan
                      ) -> PreflightResult:
        self.runs.append((job_id, tuple(node_ids)))
        started = self.now()
        nodes = list(node_ids)
        with tempfile.TemporaryDirectory(prefix="mtc-preflight-") as tmp:
            proc = self._start(nodes, plan, Path(tmp))
            timed_out = False
            try:
                proc.wait(timeout=plan.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            with contextlib.suppress(ProcessLookupError):  # the ranks it forked too
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            found = {}
            for rank in range(len(nodes)):
                path = Path(tmp) / f"{rank}.json"
                if path.exists():
                    found[rank] = json.loads(path.read_text())
        return _merge(nodes, found, started, self.now(), timed_out)

    def _start(self, nodes: list[str], plan: PreflightPlan, out: Path
               ) -> subprocess.Popen[bytes]:
        """One process that forks a rank per node (``shared.probes.allreduce``)."""
        ranks = {n: r for r, n in enumerate(nodes)}
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
               "WORLD_SIZE": str(len(nodes)), "MTC_PREFLIGHT_BYTES": str(plan.message_bytes),
               "MTC_PREFLIGHT_ITERS": str(plan.iterations),
               "MTC_PREFLIGHT_TIMEOUT_S": str(plan.timeout_s), "OMP_NUM_THREADS": "1",
               "MTC_PREFLIGHT_DELAYS": json.dumps({str(ranks[n]): d for n, d
                                                   in self.link_delay_s.items() if n in ranks}),
               "MTC_PREFLIGHT_CORRUPT": json.dumps({str(ranks[n]): c for n, c
                                                    in self.corrupted.items() if n in ranks})}
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        return subprocess.Popen([self.python, "-m", "shared.probes.allreduce", str(out)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)


def _merge(nodes: list[str], found: dict[int, dict[str, Any]], started: float,
           finished: float, timed_out: bool) -> PreflightResult:
    """Each rank's view into one result: a collective's bandwidth is its slowest member's;
    a collective no member reported did not finish."""
    checks = []
    for rank, node_id in enumerate(nodes):
        mine = found.get(rank)
        if mine is None:
            checks.append(NodeCheck(node_id, True, "no report (its collectives say why)"))
        else:
            nc = mine["node_check"]
            checks.append(NodeCheck(node_id, bool(nc["ok"]), str(nc["reason"])))
    n = len(nodes)
    wanted = [tuple(range(n))] + ([tuple(sorted({i, (i + 1) % n})) for i in range(n)]
                                  if n > 2 else [])
    collectives = []
    for ranks in wanted:
        seen = [c for r in ranks for c in found.get(r, {}).get("collectives", ())
                if tuple(c["ranks"]) == ranks]
        complete = len(seen) == len(ranks)
        bw = min(float(c["busbw_gbps"]) for c in seen) if complete else None
        collectives.append(PairCheck(tuple(nodes[r] for r in ranks), bw,
                                     max((int(c["wrong"]) for c in seen), default=0)))
    detail = "timed out" if timed_out else ""
    return PreflightResult(tuple(checks), tuple(collectives), started, finished, True, detail)
