"""MachinesAndWorkers with Slurm as the workers side: Compute Engine makes the machine, Slurm
(the in-memory Slurm of the Slurm adapter's tests) runs the work on it, and each call goes to
the side that owns it. What could go wrong: two NodeProvisioned for one node, a node reported
up before Slurm has it, a drain that reaches only one side, a replace that forgets why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from google.auth.credentials import AnonymousCredentials

from shared.adapters.compute.gce.api import GceApi, GceConfig, instance_name
from shared.adapters.compute.gce.compute import GceCompute
from shared.adapters.compute.gce.split import MachinesAndWorkers
from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.domain.events import NodeProvisioned, NodeRepairCompleted
from shared.domain.health import RepairAction
from tests.contract.compute_drivers import make_node
from tests.gce_standin import ComputeStandin
from tests.harness import ManualClock, Recorder
from tests.unit.compute.slurm.fake_slurm import FakeSlurm


class Rig:
    def __init__(self, tmp: Path, standin: ComputeStandin) -> None:
        self.standin = standin
        self.clock = ManualClock(1000.0)
        self.events = Recorder()
        self.slurm = FakeSlurm()
        self.config = GceConfig("proj", "us-central1-a")
        api = GceApi(self.config, api_endpoint=standin.endpoint,
                     credentials=AnonymousCredentials())
        self.machines = GceCompute(tmp / "gce", self.events, self.clock, api)
        self.workers = SlurmCompute(tmp / "slurm", self.events, self.clock, cli=self.slurm,
                                    agent_probes=("xid",), observe_interval_s=0.0,
                                    agent_interval_s=1e9)
        self.compute = MachinesAndWorkers(self.machines, self.workers)

    def run(self, n: int = 10) -> None:
        for _ in range(n):
            self.clock.advance(1.0)
            self.compute.poll()


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    standin = ComputeStandin().start()
    made = Rig(tmp_path, standin)
    yield made
    made.compute.close()
    standin.close()


def test_a_node_is_up_once_when_its_instance_runs_and_slurm_has_it(rig: Rig) -> None:
    rig.compute.provision_node(make_node("w0"))
    rig.clock.advance(1.0)
    rig.compute.poll()
    assert rig.events.of(NodeProvisioned) == []  # the instance is still being made
    assert not any(c[0] == "update" for c in rig.slurm.calls)
    rig.run()
    assert [(e.node_id, e.ok) for e in rig.events.of(NodeProvisioned)] == [("w0", True)]
    assert rig.standin.instance(instance_name(rig.config, "w0"))["status"] == "RUNNING"
    assert rig.workers.slurm_node_of("w0") in rig.slurm.nodes  # mapped to a Slurm node


def test_a_drain_reaches_slurm_and_the_replace_reports_its_reason(rig: Rig) -> None:
    rig.compute.provision_node(make_node("w0"))
    rig.run()
    slurm_node = rig.workers.slurm_node_of("w0")
    assert slurm_node is not None
    rig.compute.cordon("w0", "XidError: xid 79")
    rig.run(2)
    assert "DRAIN" in rig.slurm.nodes[slurm_node].flags
    rig.compute.start_repair("w0", RepairAction.REPLACE, 1)
    rig.run()
    [done] = rig.events.of(NodeRepairCompleted)
    assert done.ok and done.action == "replace"
    [fault] = rig.standin.state.faults_reported
    assert fault["faultReasons"][0]["description"].endswith("XidError: xid 79")
    assert not any(c[0] == "reboot" for c in rig.slurm.calls)  # Compute Engine repaired it


def test_the_composition_root_builds_it_from_configuration(tmp_path: Path) -> None:
    from services.wiring.builder import make_compute
    from shared.domain.events import Envelope

    standin = ComputeStandin().start()
    try:
        got: list[Envelope] = []
        clock = ManualClock(1000.0)
        compute = make_compute("gce", tmp_path, got.append, clock, options={
            "gce": {"project": "proj", "zone": "europe-west4-b", "api_endpoint": standin.endpoint,
                    "anonymous": True, "pools": {"pool": {"provisioning_model": "SPOT"}},
                    "options": {"watch_interval_s": 30.0}},
            "cli": FakeSlurm(), "agent_probes": ("xid",), "observe_interval_s": 0.0,
            "agent_interval_s": 1e9})
        assert isinstance(compute, MachinesAndWorkers)
        compute.provision_node(make_node("w0"))
        for _ in range(10):
            clock.advance(1.0)
            compute.poll()
        up = [e for e in got if isinstance(e.event, NodeProvisioned)]
        assert [(e.event.node_id, e.source) for e in up] == [("w0", "//mtc/compute/gce")]
        inst = standin.instance("mtc-w0")
        assert inst is not None and inst["scheduling"]["provisioningModel"] == "SPOT"
        assert inst["zone"].endswith("/zones/europe-west4-b")
        compute.close()
    finally:
        standin.close()
    with pytest.raises(ValueError, match="loopback"):
        make_compute("gce", tmp_path / "x", got.append, clock, options={
            "gce": {"project": "p", "zone": "z", "api_endpoint": "https://example.com",
                    "anonymous": True}})
