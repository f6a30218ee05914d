"""The provisioning workflow run by workflows-emulator (as a CLI, in its own venv) against
the step endpoints served over HTTP by functions-framework: success, a node that fails to
provision (health check fails, rollback), and nodes that never come up (timeout, rollback).

The steps run over the in-memory plane here (the workflow's logic is what is under test;
the Firestore/Pub/Sub path is covered by the other tests in this folder), with the
provisioning event handlers active too, as in a deployment.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from gcp_support import ROOT, Server, StorePlane, function_app

from services.job_submission import commands as job_commands
from services.wiring import runtime as rt_mod
from shared.adapters.memory_store import MemoryDocStore
from shared.domain.events import NodeProvisioned
from shared.domain.model import ClusterState, NodeState
from tests.harness import CLUSTER, healthy

pytestmark = pytest.mark.integration

WORKFLOW = ROOT / "workflows" / "provision_cluster.workflows.yaml"


@pytest.fixture(scope="session")
def workflows_cli() -> Path:
    """workflows-emulator pins a fastapi that conflicts with functions-framework, so it lives
    in .venv-wf, created (once, from workflows/emulator-requirements.txt) by the script."""
    proc = subprocess.run(
        [str(ROOT / "scripts" / "emulators.sh"), "workflows-venv"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot create the workflows-emulator venv: {proc.stderr[-500:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


class PlaneRuntime:
    def __init__(self, plane: StorePlane) -> None:
        self.plane = plane
        self.deps = plane.deps

    def after_request(self) -> None:
        self.plane.deliver()


class Machines:
    """Plays the machines: nodes come up and pass their checks, except ``bad`` nodes, which
    fail to provision once every good node is in service, and ``never``, which stay down."""

    def __init__(self, plane: StorePlane, *, bad: set[str] | None = None, never: bool = False) -> None:
        self.plane = plane
        self.bad = bad or set()
        self.never = never
        self.up: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        plane = self.plane
        while not self.stop.wait(0.1):
            if self.never:
                continue
            with plane.lock:
                new = [n for n in plane.compute.provisioned if n not in self.up and n not in self.bad]
                for node_id in new:
                    plane.inject(NodeProvisioned(node_id=node_id))
                plane.deliver()
                for _ in range(plane.deps.config.repair.return_after_passes):
                    plane.clock.advance(1)
                    for node_id in new:
                        plane.report(node_id, healthy(plane.clock.now()))
                    plane.deliver()
                self.up.update(new)
                good = [n for n in plane.compute.provisioned if n not in self.bad]
                if good and all(n in self.up for n in good):
                    for node_id in sorted(self.bad - self.up):
                        plane.inject(NodeProvisioned(node_id=node_id, ok=False, detail="no capacity in zone"))
                        self.up.add(node_id)
                    plane.deliver()


@dataclass
class Env:
    plane: StorePlane
    steps_url: str


@pytest.fixture
def env() -> Iterator[Env]:
    plane = StorePlane(MemoryDocStore())
    plane.deps = replace(plane.deps, config=replace(plane.deps.config, provisioning="workflow"))
    rt_mod.install(PlaneRuntime(plane))
    server = Server(function_app("steps", "http"))
    try:
        yield Env(plane, server.url)
    finally:
        server.close()
        rt_mod.install(None)


def run_workflow(cli: Path, args: dict[str, Any], timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cli), "--loglevel", "WARNING", "--source", str(WORKFLOW), "run", f"--data={json.dumps(args)}"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT / "workflows",
    )


def create(plane: StorePlane) -> tuple[str, int]:
    """Create the cluster record; the workflow, not the create_requested handler, provisions
    it here (the event stays undelivered, so the two cannot race to READY)."""
    cluster = plane.api(job_commands.create_cluster, CLUSTER)
    plane.bus.outbox.mark_published([e.id for e in plane.bus.outbox.pending()])
    return cluster.cluster_id, cluster.generation


def test_workflow_provisions_the_cluster(env: Env, workflows_cli: Path) -> None:
    cluster_id, generation = create(env.plane)
    machines = Machines(env.plane)
    machines.thread.start()
    try:
        proc = run_workflow(
            workflows_cli,
            {
                "cluster_id": cluster_id,
                "generation": generation,
                "steps_url": env.steps_url,
                "auth": "none",
                "poll_s": 1,
                "timeout_s": 60,
            },
        )
    finally:
        machines.stop.set()
        machines.thread.join()
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert result["state"] == "READY"
    assert result["nodes_in_service"] == 5  # login + 4 workers
    with env.plane.uow() as uow:
        cluster = uow.clusters.get(cluster_id)
    assert cluster is not None and cluster.state is ClusterState.READY
    assert all(n.state is NodeState.IDLE for n in env.plane.nodes(cluster_id))


def test_failed_node_fails_the_health_check_and_rolls_back(env: Env, workflows_cli: Path) -> None:
    cluster_id, generation = create(env.plane)
    machines = Machines(env.plane, bad={"c1-gpu-002"})
    machines.thread.start()
    try:
        proc = run_workflow(
            workflows_cli,
            {
                "cluster_id": cluster_id,
                "generation": generation,
                "steps_url": env.steps_url,
                "auth": "none",
                "poll_s": 1,
                "timeout_s": 60,
            },
        )
    finally:
        machines.stop.set()
        machines.thread.join()
    assert proc.returncode != 0
    assert "initial health check failed" in proc.stderr, proc.stderr[-3000:]
    assert "c1-gpu-002" in proc.stderr
    with env.plane.uow() as uow:
        cluster = uow.clusters.get(cluster_id)
    assert cluster is not None and cluster.state is ClusterState.FAILED
    assert "c1-gpu-002" in cluster.message
    nodes = {n.node_id: n for n in env.plane.nodes(cluster_id)}
    assert nodes["c1-gpu-002"].state is NodeState.RETIRED  # what failed was rolled back
    assert "c1-gpu-002" in env.plane.compute.deleted


def test_nodes_that_never_come_up_time_out_and_roll_back(env: Env, workflows_cli: Path) -> None:
    cluster_id, generation = create(env.plane)
    machines = Machines(env.plane, never=True)
    machines.thread.start()
    try:
        proc = run_workflow(
            workflows_cli,
            {
                "cluster_id": cluster_id,
                "generation": generation,
                "steps_url": env.steps_url,
                "auth": "none",
                "poll_s": 1,
                "timeout_s": 2,
            },
        )
    finally:
        machines.stop.set()
        machines.thread.join()
    assert proc.returncode != 0
    assert "timed out after 2 s" in proc.stderr, proc.stderr[-3000:]
    with env.plane.uow() as uow:
        cluster = uow.clusters.get(cluster_id)
    assert cluster is not None and cluster.state is ClusterState.FAILED
    nodes = env.plane.nodes(cluster_id)
    assert nodes and all(n.state is NodeState.RETIRED for n in nodes)
    assert sorted(env.plane.compute.deleted) == sorted(n.node_id for n in nodes)


def test_superseded_generation_is_skipped(env: Env, workflows_cli: Path) -> None:
    cluster_id, generation = create(env.plane)
    proc = run_workflow(
        workflows_cli,
        {"cluster_id": cluster_id, "generation": generation + 1, "steps_url": env.steps_url, "auth": "none"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout[proc.stdout.index("{") :])
    assert result == {"cluster_id": cluster_id, "state": "PROVISIONING", "skipped": True}
    assert env.plane.compute.provisioned == []
