"""The peer tier across Slurm nodes on the real (one-host) cluster: each node's memory
directory is its own, the peer copy goes over the network to the buddy node's peer store
and lives in the buddy's memory directory; a node whose memory is wiped gets its rank's
state back from there on the next attempt (rank 0 moved to another node, as a hot swap
does), with no durable checkpoint to fall back on.

Own SlurmCompute (own state dir, partition ``mtcpools`` over n2-n4)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from mtc_program import protocol as p
from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.adapters.compute.slurm.scripts import memory_name, memory_root, node_memory
from shared.domain.events import JobWorkersExited
from shared.ports import Gang, LaunchGroup
from tests.harness import Recorder

from .conftest import Cluster
from .test_slurm_ownership import until
from .test_slurm_pools import compute  # noqa: F401 (the fixture)
from .test_slurm_torch import in_service

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]

PROGRAM = """
import json, os, sys
from pathlib import Path
import numpy as np
from mtc_program.tiers import TieredCheckpointer, TierSettings

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
out = Path(sys.argv[1])
s = TierSettings.from_env(os.environ, durable_dir=Path(os.environ["AIP_CHECKPOINT_DIR"]),
                          rank=rank, world_size=world, tier1_every=5, tier3_every=0,
                          replicated=False)
cp = TieredCheckpointer(s)
got = cp.restore()
attempt = os.environ["MTC_JOB_ATTEMPT"]
(out / f"a{attempt}-r{rank}.json").write_text(json.dumps({
    "step": got.step if got else None, "tier": got.tier if got else None,
    "w": float(got.state["w"][0]) if got else None, "env": {
        k: v for k, v in os.environ.items() if k.startswith("MTC_TIER") and "TOKEN" not in k},
    "errors": cp.written.errors}))
if got is None:
    for step in range(1, 11):
        cp.maybe_save(step, {"w": np.full(4, 100.0 * rank + step)})
    cp.close()
    (out / f"a{attempt}-r{rank}.json").write_text(json.dumps({"saved": 10,
                                                             "errors": cp.written.errors}))
    sys.exit(75)  # stopped, as a drain stops it: the memory entries stay for the next attempt
"""


def test_a_wiped_nodes_rank_restores_from_its_buddys_memory_over_the_network(
    compute: tuple[SlurmCompute, Recorder], cluster: Cluster, tmp_path: Path  # noqa: F811
) -> None:
    slurm_compute, rec = compute
    mapping = in_service(slurm_compute, rec, cluster, "p0", "p1", "p2")
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "program.py").write_text(PROGRAM)
    command = (sys.executable, str(tmp_path / "program.py"), str(out))
    env = (("PYTHONPATH", str(ROOT / "shared" / "sdk")),)  # this tree's SDK
    dirs = (str(tmp_path / "c"), str(tmp_path / "m"), str(tmp_path / "t"))

    def gang(attempt: int, node_ids: tuple[str, str]) -> Gang:
        return Gang("peer", attempt, node_ids, (LaunchGroup(0, 2, command, env),), *dirs)

    def run(attempt: int, node_ids: tuple[str, str]) -> JobWorkersExited:
        slurm_compute.start_workers(gang(attempt, node_ids))
        until(slurm_compute, lambda: len(rec.of(JobWorkersExited)) >= attempt, 60,
              f"attempt {attempt} over")
        return rec.of(JobWorkersExited)[-1]

    first = run(1, ("p0", "p1"))
    log = slurm_compute.job_log("peer").read_text()
    assert first.exit_code == 75, (first, log[-3000:])
    for rank in (0, 1):
        assert json.loads((out / f"a1-r{rank}.json").read_text()) == {"saved": 10, "errors": []}
    job = memory_name(gang(1, ("p0", "p1")))
    deployment = str(slurm_compute.state_dir)
    n0, n1 = node_memory(mapping["p0"], deployment), node_memory(mapping["p1"], deployment)
    try:
        assert n0 != n1
        # rank 0's own entries on its node, its peer copy in its buddy's (rank 1's) memory
        assert (n0 / job / "rank-0" / p.entry_name(10)).is_dir()
        assert (n1 / job / "peer" / "rank-0" / p.entry_name(10) / p.MANIFEST).is_file()
        assert (n0 / job / "peer" / "rank-1" / p.entry_name(10) / p.MANIFEST).is_file()
        assert not list((tmp_path / "c").glob("ckpt-*"))  # no durable checkpoint at all
        assert not list(slurm_compute.state_dir.glob("nodes/*/shm"))  # no shared-FS stand-in

        shutil.rmtree(n0 / job)  # rank 0's node loses its memory; rank 0 moves to p2
        second = run(2, ("p2", "p1"))
        log = slurm_compute.job_log("peer").read_text()
        assert second.exit_code == 0, (second, log[-3000:])
        got = json.loads((out / "a2-r0.json").read_text())
        assert (got["step"], got["tier"], got["w"]) == (10, p.PEER, 10.0), (got, log[-3000:])
        assert got["env"][p.TIER2_SOURCE_URL].startswith("http://127.0.0.1:")
        assert got["env"][p.TIER1_DIR].startswith(f"{node_memory(mapping['p2'], deployment)}/")
        assert (json.loads((out / "a2-r1.json").read_text())["tier"]) == p.MEMORY
    finally:
        shutil.rmtree(memory_root(deployment), ignore_errors=True)
