"""Slurm's ResumeProgram/SuspendProgram on Compute Engine (scripts/slurm/gce-resume, -suspend):
run as Slurm runs them (a subprocess given a host list, ``scontrol`` on PATH: here a stand-in
that expands host lists and logs updates), against the Compute Engine stand-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.adapters.compute.gce.power import nodeset_of
from tests.gce_standin import ComputeStandin, Inject

pytestmark = pytest.mark.slow  # the power scripts as subprocesses, each importing the client library

ROOT = Path(__file__).resolve().parents[4]
SCONTROL = r'''#!/usr/bin/env python3
import re, sys
args = sys.argv[1:]
if args[:2] == ["show", "hostnames"]:
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", args[2]):
        m = re.fullmatch(r"(.*)\[(\d+)-(\d+)\]", part)
        if m:
            for i in range(int(m[2]), int(m[3]) + 1):
                print(f"{m[1]}{i}")
        else:
            print(part)
else:
    with open(__file__ + ".log", "a") as log:
        log.write(" ".join(args) + "\n")
'''


@pytest.fixture
def standin() -> Iterator[ComputeStandin]:
    server = ComputeStandin().start()
    yield server
    server.close()


@pytest.fixture
def env(tmp_path: Path, standin: ComputeStandin) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(SCONTROL)
    scontrol.chmod(0o755)
    config = tmp_path / "gce-power.json"
    config.write_text(json.dumps({
        "project": "proj", "zone": "us-central1-a", "state_dir": str(tmp_path / "state"),
        "api_endpoint": standin.endpoint, "anonymous": True,
        "nodesets": {"c1-gpu": {"machine_type": "a3-highgpu-8g",
                                "accelerator_type": "NVIDIA_H100_80GB", "accelerator_count": 8,
                                "provisioning_model": "SPOT"}}}))
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "MTC_ROOT": str(ROOT),
            "MTC_PYTHON": sys.executable, "MTC_GCE_POWER_CONFIG": str(config)}


def power(verb: str, hostlist: str, env: dict[str, str], *extra: str
          ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / "scripts" / "slurm" / f"gce-{verb}"), hostlist,
                           *(extra or ("--timeout", "20"))], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def updates(env: dict[str, str]) -> list[str]:
    log = Path(env["PATH"].split(":")[0]) / "scontrol.log"
    return log.read_text().splitlines() if log.exists() else []


def test_resume_creates_one_instance_per_node_and_suspend_deletes_them(
        standin: ComputeStandin, env: dict[str, str]) -> None:
    done = power("resume", "c1-gpu-[0-1]", env)
    assert done.returncode == 0, done.stderr
    for name in ("c1-gpu-0", "c1-gpu-1"):
        inst = standin.instance(name)
        assert inst is not None and inst["status"] == "RUNNING"
        assert inst["scheduling"]["provisioningModel"] == "SPOT"
        assert inst["guestAccelerators"][0]["acceleratorCount"] == 8
    assert updates(env) == []
    assert power("resume", "c1-gpu-[0-1]", env).returncode == 0  # Slurm asks again: no new VM
    assert len(standin.calls("insert")) == 2
    done = power("suspend", "c1-gpu-[0-1]", env)
    assert done.returncode == 0, done.stderr
    assert standin.instance("c1-gpu-0") is None and standin.instance("c1-gpu-1") is None
    assert power("resume", "c1-gpu-0", env).returncode == 0  # powered up again: a new VM
    assert standin.instance("c1-gpu-0") is not None


def test_a_node_that_cannot_be_had_goes_down_with_the_reason(
        standin: ComputeStandin, env: dict[str, str]) -> None:
    standin.fail_next("insert", Inject(op_code="ZONE_RESOURCE_POOL_EXHAUSTED",
                                       message="not enough resources"), times=10)
    done = power("resume", "c1-gpu-3,other-1", env, "--timeout", "3")
    assert done.returncode == 1
    lines = updates(env)
    assert "update nodename=c1-gpu-3 state=down reason=mtc: waiting for capacity:" \
           " ZONE_RESOURCE_POOL_EXHAUSTED: not enough resources" in lines
    assert "update nodename=other-1 state=down reason=mtc: no nodeset configured for this node" in lines
    assert standin.instance("c1-gpu-3") is None


def test_nodesets_match_by_the_longest_prefix() -> None:
    sets = {"c1-gpu": {}, "c1-gpu-big": {}, "c1": {}}
    assert nodeset_of("c1-gpu-big-3", sets) == "c1-gpu-big"
    assert nodeset_of("c1-gpu-3", sets) == "c1-gpu"
    assert nodeset_of("c12", sets) == "c1"
    assert nodeset_of("d1-0", sets) is None
