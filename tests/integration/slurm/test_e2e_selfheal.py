"""The control plane heals a real Slurm cluster (SlurmCompute over scripts/slurm/cluster.sh).

Each test builds its own control plane (``embedded(..., compute="slurm")``, services.wiring)
in a tmp dir against the session's cluster (conftest.py), and puts the Slurm nodes back as it
found them (n1-n4 idle and in service, c1-c2 powered down), however it ends.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from services.cli.demo_slurm import cluster_spec, demo_config, job_spec
from services.job_submission import commands as job_commands
from services.wiring.embedded import EmbeddedApp, embedded
from shared.adapters.compute.slurm.api import SlurmControl
from shared.adapters.compute.slurm.cli import SlurmCli, SlurmError, subprocess_runner
from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.domain.events import Envelope
from shared.domain.model import Job, JobState, NodeState
from shared.handling import Outcome
from shared.policies.repair import RepairConfig

from .conftest import Cluster, timing

pytestmark = pytest.mark.integration

STATIC = ("n1", "n2", "n3", "n4")
CLOUD = ("c1", "c2")


@dataclass
class Recorder:
    """Every delivered event, plus the Slurm view of a node right after chosen events."""

    slurm: SlurmCli
    watch: dict[str, str] = field(default_factory=dict)  # event type -> Slurm node to snapshot
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    snapshots: dict[str, Any] = field(default_factory=dict)

    def __call__(self, env: Envelope, outcomes: dict[str, Outcome]) -> None:
        self.events.append((env.type, env.event.to_dict()))
        node = self.watch.get(env.type)
        if node is not None and env.type not in self.snapshots:
            self.snapshots[env.type] = self.slurm.node(node)

    def of(self, suffix: str) -> list[dict[str, Any]]:
        return [data for type_, data in self.events if type_.endswith(suffix)]


def run_until(app: EmbeddedApp, what: str, until: Callable[[], bool], timeout_s: float = 60.0) -> float:
    start = time.monotonic()
    if not app.run(until, timeout_s=timeout_s, poll_s=0.05, tick_s=2.0):
        pytest.fail(f"timed out after {timeout_s:g}s waiting for {what}")
    return time.monotonic() - start


def get_job(app: EmbeddedApp, job_id: str) -> Job:
    with app.transaction() as uow:
        job = uow.jobs.get(job_id)
    assert job is not None
    return job


def node_state(app: EmbeddedApp, node_id: str) -> NodeState | None:
    with app.transaction() as uow:
        node = uow.nodes.get(node_id)
        return None if node is None else node.state


def create(app: EmbeddedApp, spec: dict[str, Any]) -> None:
    with app.transaction() as uow:
        job_commands.create_cluster(spec, uow, app.deps)

    def ready() -> bool:
        with app.transaction() as uow:
            c = uow.clusters.get(spec["clusterId"])
            return c is not None and c.state.value == "READY"

    timing("cluster create to READY (provision + first checks)", run_until(app, "cluster READY", ready))


def restore(slurm: SlurmCli, timeout_s: float = 90.0) -> None:
    """n1-n4 idle and in service, c1-c2 powered down: what the other tests expect."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            nodes = {n.name: n for n in slurm.nodes()}
        except SlurmError:
            nodes = {}
        flags = {name: set(n.state_flags) for name, n in nodes.items()}
        settled = bool(nodes)
        for name in STATIC:
            node = nodes.get(name)
            if node is None:
                continue
            busy = flags[name] & {"POWERING_DOWN", "POWERING_UP", "REBOOT_REQUESTED", "REBOOT_ISSUED"}
            ok = node.available and node.state == "idle" and not node.drained
            settled &= ok
            if ok or busy:
                continue
            with contextlib.suppress(SlurmError):
                if node.powered_down:
                    slurm.power_up(name)
                elif node.drained:
                    slurm.resume(name)
        for name in CLOUD:
            node = nodes.get(name)
            if node is None:
                continue
            down = node.powered_down and "POWERING_DOWN" not in flags[name]
            settled &= down
            if not down and not flags[name] & {"POWERING_DOWN", "POWERING_UP"}:
                with contextlib.suppress(SlurmError):
                    slurm.power_down(name)
        if settled:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"could not restore the Slurm nodes: {nodes}")
        time.sleep(0.5)


@pytest.fixture
def make_app(cluster: Cluster, tmp_path: Path) -> Iterator[Callable[..., EmbeddedApp]]:
    apps: list[EmbeddedApp] = []

    def make(**config: Any) -> EmbeddedApp:
        cfg = demo_config()
        if config:
            cfg = replace(cfg, **config)
        app = embedded(tmp_path / f"state-{len(apps)}", compute="slurm",
                       slurm_conf=cluster.slurm_conf, config=cfg)
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.compute.kill_all()
        app.compute.close()
        app.close()
    restore(cluster.slurm)


def test_xid_drains_checkpoints_requeues_resumes_and_returns_the_node(
    cluster: Cluster, make_app: Callable[..., EmbeddedApp]
) -> None:
    app = make_app()
    compute: SlurmCompute = app.compute
    rec = Recorder(cluster.slurm)
    app.bus.listeners.append(rec)
    create(app, cluster_spec("it-heal"))
    mapping = compute.mapping()
    assert sorted(mapping.values()) == list(STATIC), mapping
    for name in STATIC:  # drained while verifying, resumed once the first checks passed
        assert not cluster.slurm.node(name).drained, cluster.slurm.node(name)

    with app.transaction() as uow:
        job_commands.submit_job("it-heal", job_spec(240), uow, app.deps, "heal-1")
    run_until(app, "a first checkpoint", lambda: get_job(app, "heal-1").latest_checkpoint is not None)
    first = get_job(app, "heal-1")
    assert first.state is JobState.RUNNING and first.attempt == 1
    slurm_job = compute.slurm_job_id("heal-1", 1)
    assert slurm_job is not None
    assert sorted(cluster.slurm.job(slurm_job).node_list) == sorted(mapping[n] for n in first.node_ids)

    victim = first.node_ids[0]
    bad = mapping[victim]
    pid_before = cluster.slurmd_pid(bad)
    rec.watch = {"mtc.node.draining.v1": bad, "mtc.job.signalled.v1": bad}
    injected = time.monotonic()
    compute.inject_xid(victim, 79)

    run_until(app, "attempt 1 to exit", lambda: bool(rec.of("job.workers_exited.v1")))
    timing(
        "XID injected to attempt 1 exited (drain, scancel --signal=TERM, checkpoint)",
        time.monotonic() - injected,
    )
    exited = rec.of("job.workers_exited.v1")[0]
    assert exited["attempt"] == 1 and exited["exit_code"] == 75, exited  # checkpointed on SIGTERM
    diagnosed = rec.of("node.diagnosed.v1")
    assert diagnosed and diagnosed[0]["node_id"] == victim and diagnosed[0]["action"] == "reboot"
    drained_then = rec.snapshots["mtc.node.draining.v1"]
    assert drained_then.drained and drained_then.reason.startswith("mtc: gpu_fell_off_bus"), drained_then
    assert rec.of("job.signalled.v1")[0]["attempt"] == 1

    run_until(
        app,
        "the job to finish and the node to return",
        lambda: get_job(app, "heal-1").terminal and node_state(app, victim) is NodeState.IDLE,
        timeout_s=90,
    )
    timing("XID injected to job done and node back", time.monotonic() - injected)
    final = get_job(app, "heal-1")
    assert final.state is JobState.SUCCEEDED, final.error
    assert final.restart_count == 1 and final.attempt == 2
    assert victim not in final.node_ids  # attempt 2 ran on other nodes
    second = compute.slurm_job_id("heal-1", 2)
    assert second is not None and second != slurm_job

    saved_by_term = max(c["step"] for c in rec.of("job.checkpoint_saved.v1")  # durable ones:
                        if c["attempt"] == 1 and c.get("tier", "durable") == "durable")  # a requeue's
    started = rec.of("job.started.v1")
    assert [s["attempt"] for s in started] == [1, 2]
    assert started[1]["resume_step"] == saved_by_term > 0
    out = compute.job_log("heal-1").read_text()
    # the ranks restore one consistent cut from the nearest tier (memory, here), which may
    # sit before the SIGTERM's durable save, by at most one tier-1 interval (10 steps)
    resumed = re.findall(r"resumed from step (\d+)", out)
    assert len(resumed) == 2 and len(set(resumed)) == 1, out[-2000:]
    assert saved_by_term - 10 <= int(resumed[0]) <= 240, (resumed, saved_by_term)
    assert out.count("done at step 240") == 2

    repaired = rec.of("node.repair_completed.v1")
    assert repaired and repaired[0]["node_id"] == victim and repaired[0]["ok"], repaired
    post = [
        d for t, d in rec.events if t.endswith("health_reported.v1") and d["source"] == "post-repair-check"
    ]
    assert post and post[0]["node_id"] == victim
    unknown = {c["type"] for c in post[0]["conditions"] if c["status"] == "unknown"}
    assert unknown, post[0]  # no GPU tools on this host: their checks say unknown, never ok
    assert rec.of("node.returned_to_service.v1")[-1]["node_id"] == victim
    assert cluster.slurmd_pid(bad) not in (None, pid_before)  # its slurmd was restarted (reboot)
    node = cluster.slurm.node(bad)
    assert not node.drained and node.state == "idle", node
    assert compute.alerts() == []


def test_blast_radius_guard_holds_the_second_node_in_slurm(
    cluster: Cluster, make_app: Callable[..., EmbeddedApp]
) -> None:
    app = make_app()
    compute: SlurmCompute = app.compute
    rec = Recorder(cluster.slurm)
    app.bus.listeners.append(rec)
    create(app, cluster_spec("it-blast", nodes=4, spares=0))
    mapping = compute.mapping()
    workers = sorted(n for n in mapping if not n.endswith("-login"))
    a, b = workers[0], workers[1]
    compute.inject_xid(a, 79)  # both before the next agent run: the same instant, as far as
    compute.inject_xid(b, 79)  # the control plane can tell
    run_until(
        app,
        "a repair and a hold",
        lambda: bool(rec.of("node.repair_held.v1")) and bool(rec.of("node.repair_started.v1")),
    )
    held = rec.of("node.repair_held.v1")[0]
    repaired = rec.of("node.repair_started.v1")[0]["node_id"]
    assert {held["node_id"], repaired} == {a, b}, (held, repaired)
    assert "HOLD" in held["reason"] and "limit 1" in held["reason"], held
    assert cluster.slurm.node(mapping[repaired]).drained  # out of service in Slurm (rebooting)
    kept = cluster.slurm.node(mapping[held["node_id"]])
    assert not kept.drained and kept.available, kept  # held: still in service in Slurm
    assert node_state(app, held["node_id"]) in (NodeState.SUSPECT, NodeState.IDLE)
    run_until(app, f"{repaired} back in service", lambda: node_state(app, repaired) is NodeState.IDLE)
    assert not cluster.slurm.node(mapping[held["node_id"]]).drained
    assert [d["node_id"] for d in rec.of("node.diagnosed.v1")].count(held["node_id"]) == 1


def test_replace_powers_down_the_bad_node_and_powers_up_a_cloud_node(
    cluster: Cluster, make_app: Callable[..., EmbeddedApp]
) -> None:
    app = make_app(repair=RepairConfig(lemon_failure_count=1))  # any failure: replace the node
    compute: SlurmCompute = app.compute
    rec = Recorder(cluster.slurm)
    app.bus.listeners.append(rec)
    create(app, cluster_spec("it-replace", nodes=2, spares=0))
    mapping = compute.mapping()
    victim = sorted(n for n in mapping if not n.endswith("-login"))[0]
    bad = mapping[victim]
    fresh = f"{victim}-r1"
    start = time.monotonic()
    compute.inject_xid(victim, 79)
    run_until(app, "the replacement in service", lambda: node_state(app, fresh) is NodeState.IDLE, 90)
    timing("XID to replacement (cloud node powered up, checked) in service", time.monotonic() - start)
    assert rec.of("node.retired.v1")[0]["replacement_id"] == fresh
    new = compute.slurm_node_of(fresh)
    assert new in CLOUD, compute.mapping()
    assert node_state(app, victim) is NodeState.RETIRED
    # resumed: slurmctld flags it NOT_RESPONDING until its next ping answers
    run_until(app, f"{new} available", lambda: cluster.slurm.node(new).available, 30)
    node = cluster.slurm.node(new)
    assert not node.drained and not node.powered_down, node

    def powered_down() -> bool:
        n = cluster.slurm.node(bad)
        return n.powered_down and "POWERING_DOWN" not in n.state_flags

    run_until(app, f"{bad} powered down", powered_down, 60)
    assert cluster.slurm.node(bad).reason.startswith("mtc: retired"), cluster.slurm.node(bad)
    assert cluster.slurmd_pid(bad) is None


def test_controller_down_is_retried_with_backoff_and_an_alert(
    cluster: Cluster, make_app: Callable[..., EmbeddedApp], tmp_path: Path
) -> None:
    """While slurmctld cannot be reached, a drain neither raises into the handler nor is
    lost: it is retried with backoff, an alert says why, and it lands once Slurm answers."""
    app = make_app()
    compute: SlurmCompute = app.compute
    create(app, cluster_spec("it-down", nodes=1, spares=0))
    node_id = next(n for n in compute.mapping() if not n.endswith("-login"))
    name = compute.mapping()[node_id]
    conf = Path(cluster.slurm_conf).read_text().replace("SlurmctldPort=", "SlurmctldPort=1", 1)
    dead = tmp_path / "dead-slurm.conf"
    dead.write_text(conf)
    # every collaborator of SlurmCompute holds the one client: point it at a dead controller
    live = compute.cli
    assert isinstance(live, SlurmControl)
    kept = live._run, live.timeout_s
    live._run, live.timeout_s = subprocess_runner(str(dead)), 3.0
    try:
        start = time.monotonic()
        compute.cordon(node_id, "mtc test: drain during an outage")  # must not raise
        app.run(lambda: False, timeout_s=4.0, poll_s=0.05)  # nor may polling
        assert time.monotonic() - start < 20
        assert not cluster.slurm.node(name).drained
        alerts = compute.alerts()
        assert any(a.kind == "slurm-unreachable" for a in alerts), alerts
        assert node_state(app, node_id) is NodeState.IDLE  # nothing inferred from the silence
    finally:
        live._run, live.timeout_s = kept
    took = run_until(
        app, "the drain to land once Slurm answers", lambda: cluster.slurm.node(name).drained, 60
    )
    timing("controller back to the pending drain applied (backoff)", took)
    landed = cluster.slurm.node(name)  # the outage's drain itself, mtc's prefix added once
    assert landed.reason == "mtc: mtc test: drain during an outage", landed
