"""A job of two worker pools on the real cluster: each rank runs its own pool's command, on
the node mtc chose for it (srun's arbitrary distribution), and sees its pool in CLUSTER_SPEC.

Own SlurmCompute (own state dir, partition ``mtcpools`` over n2-n4); the ranks are given the
nodes in the reverse of Slurm's order, so Slurm's own placement would put them elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.adapters.clock import SystemClock
from shared.adapters.compute.slurm.cli import SlurmError
from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.domain.events import JobWorkersExited
from shared.ports import Gang, LaunchGroup
from tests.harness import Recorder

from .conftest import Cluster, wait_for
from .test_slurm_ownership import provision, until

pytestmark = pytest.mark.integration

NODES = ("n2", "n3", "n4")
REPORT = """
import json, os, sys
out = os.path.join(os.environ["AIP_CHECKPOINT_DIR"], "rank-" + os.environ["RANK"] + ".json")
json.dump({"command": sys.argv[1], "rank": os.environ["RANK"], "a": os.environ.get("A"),
           "b": os.environ.get("B"), "task": json.loads(os.environ["CLUSTER_SPEC"])["task"],
           "slurm_node": os.environ.get("SLURMD_NODENAME")}, open(out, "w"))
"""


@pytest.fixture
def compute(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[SlurmCompute, Recorder]]:
    rec = Recorder()
    made = SlurmCompute(tmp_path / "state", rec, SystemClock(), slurm_conf=cluster.slurm_conf,
                        partition="mtcpools", slurm_nodes=NODES, agent_probes=("xid",),
                        observe_interval_s=0.0)
    yield made, rec
    made.kill_all()
    made.close()
    wait_for(lambda: resumed(cluster), 60, "n2-n4 back in service", interval_s=0.5)


def resumed(cluster: Cluster) -> bool:
    """True once n2-n4 are in service; resumes the ones still drained."""
    nodes = {n.name: n for n in cluster.slurm.nodes()}
    for name in NODES:
        if nodes[name].drained:
            with contextlib.suppress(SlurmError):
                cluster.slurm.resume(name)
    return all(nodes[n].available and not nodes[n].drained for n in NODES)


def test_each_pool_runs_its_command_on_the_nodes_chosen_for_it(
    compute: tuple[SlurmCompute, Recorder], cluster: Cluster, tmp_path: Path
) -> None:
    slurm_compute, rec = compute
    mapping = provision(slurm_compute, rec, "p0", "p1", "p2")
    for node_id in mapping:
        slurm_compute.uncordon(node_id)
    until(slurm_compute, lambda: all(cluster.slurm.node(n).available and not cluster.slurm.node(n).drained
                                     for n in mapping.values()), 30, "nodes in service")
    ranks = tuple(sorted(mapping, key=lambda n: mapping[n], reverse=True))  # rank 0 on n4
    out = tmp_path / "out"
    groups = (LaunchGroup(0, 1, (sys.executable, "-c", REPORT, "cmd-a"), (("A", "1"),)),
              LaunchGroup(1, 2, (sys.executable, "-c", REPORT, "cmd-b"), (("B", "2"),)))
    slurm_compute.start_workers(Gang("pools", 1, ranks, groups, str(out / "c"), str(out / "m"),
                                     str(out / "t")))
    until(slurm_compute, lambda: bool(rec.of(JobWorkersExited)), 60, "attempt over")
    [ended] = rec.of(JobWorkersExited)
    assert ended.exit_code == 0, (ended, slurm_compute.job_log("pools").read_text())
    want = {0: ("cmd-a", "1", None, "workerpool0", 0), 1: ("cmd-b", None, "2", "workerpool1", 0),
            2: ("cmd-b", None, "2", "workerpool1", 1)}
    for rank, (command, a, b, pool, index) in want.items():
        got = json.loads((out / "c" / f"rank-{rank}.json").read_text())
        assert (got["command"], got["rank"], got["a"], got["b"]) == (command, str(rank), a, b), got
        assert got["task"] == {"type": pool, "index": index, "node_id": ranks[rank]}, got
        assert got["slurm_node"] == mapping[ranks[rank]], (rank, got, mapping)
