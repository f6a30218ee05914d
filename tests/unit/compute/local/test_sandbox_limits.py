"""A job's limits and privacy on its host: its processes are bounded (a cgroup of its job and
node, else its uid's RLIMIT_NPROC), and it sees no other job's processes (its own ``/proc``,
``hidepid=2``). Defect 8: a job started 200 processes (no cgroup, no memory limit) and saw
every job's command line.

Real processes, real mounts and cgroups: root only, on Linux."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from local_compute_support import run_to_exit

from shared.adapters.clock import SystemClock
from shared.adapters.compute.local.compute import LocalCompute
from shared.adapters.compute.worker_launcher import make_cgroups, remove_cgroups
from shared.policies.job_limits import GIB, node_limits
from tests.harness import Recorder, one_pool_gang

ROOT_ONLY = pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0,
                               reason="limits and /proc of a job are a root server's")

# starts up to 500 sleeping children and reports how many it got; then what /proc shows it
FORK = textwrap.dedent(
    """
    import json, os, subprocess, sys
    kids = []
    for _ in range(500):
        try:
            kids.append(subprocess.Popen(["sleep", "30"]))
        except OSError:
            break
    seen = [p for p in os.listdir("/proc") if p.isdigit()]
    other = sys.argv[1]
    try:
        open(f"/proc/{other}/cmdline").read()
        cmdline = "read"
    except OSError as exc:
        cmdline = type(exc).__name__
    for k in kids:
        k.kill()
    out = os.path.join(os.environ["AIP_MODEL_DIR"].replace("gs://", "/gcs/", 1), "forks.json")
    with open(out + ".tmp", "w") as f:  # whole once it exists
        json.dump({"started": len(kids), "pids_seen": len(seen), "other": cmdline}, f)
    os.replace(out + ".tmp", out)
    """
)



def test_limits_come_from_the_machine_spec_and_a_label() -> None:
    assert node_limits("a3-highgpu-8g", {}).memory_bytes == 1872 * GIB
    assert node_limits("n2-standard-8", {}).memory_bytes == 32 * GIB
    assert node_limits("made-up-type", {}).memory_bytes == 0  # unknown: no guess
    assert node_limits("n2-standard-8", {"mtc-max-processes": "64"}).processes == 64
    assert node_limits("n2-standard-8", {"mtc-max-processes": "3"}).processes == 32_768


@ROOT_ONLY
@pytest.mark.slow  # real worker subprocesses
def test_defect_8_a_job_starting_500_processes_is_stopped_at_its_limit(tmp_path: Path) -> None:
    state = tmp_path / "srv"
    compute = LocalCompute(state / "compute", Recorder(), SystemClock(), heartbeats=False,
                           sandboxed=True, output_root=state / "jobs", private_dirs=[state])
    out = state / "jobs" / "gcs" / "bkt" / "forks"
    gang = one_pool_gang("j1", 1, ("n0",), (sys.executable, "-c", FORK, str(os.getpid())),
                         out=out)
    gang = replace(gang, groups=(replace(gang.groups[0], limits=(64, 2 * GIB)),))
    try:
        compute.start_workers(gang)
        code = run_to_exit(compute, "j1", 90.0)
        assert code == 0, Path(compute.workers("j1")[0].log_path).read_text()
    finally:
        compute.kill_all()
        compute.close()
    seen = json.loads((out / "model" / "forks.json").read_text())
    assert 0 < seen["started"] < 64, seen  # stopped at its limit, not at 500
    assert seen["pids_seen"] <= seen["started"] + 4, seen  # its own processes, no others
    assert seen["other"] != "read", seen  # this test's process is not the job's to read


@ROOT_ONLY
def test_a_jobs_cgroup_has_its_limits_and_goes_when_empty(tmp_path: Path) -> None:
    name = f"mtc/test-{os.getpid()}/j1-n0"
    groups, bounded = make_cgroups({"processes": 100, "memory": GIB, "cgroup": name})
    try:
        if not groups:
            pytest.skip("no cgroup can be made here (the launcher falls back to rlimits)")
        assert bounded
        knobs = {"pids.max": "100", "memory.limit_in_bytes": str(GIB), "memory.max": str(GIB)}
        found = {k: Path(g, k).read_text().strip() for g in groups for k in knobs
                 if Path(g, k).exists()}
        assert found.get("pids.max") == "100"
        assert found.get("memory.limit_in_bytes", found.get("memory.max")) == str(GIB)
        assert make_cgroups({"processes": 1, "cgroup": "../escape"}) == ([], False)
    finally:
        remove_cgroups(groups)
        for top in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/memory"),
                    Path("/sys/fs/cgroup")):
            for d in (top / f"mtc/test-{os.getpid()}",):
                if d.is_dir():
                    d.rmdir()
    assert not any(Path(g).exists() for g in groups)
