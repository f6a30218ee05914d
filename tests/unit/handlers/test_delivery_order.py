"""The subscribers of one event may run in any order: Pub/Sub gives each (service, family)
pair its own push subscription, so nothing keeps the route table's order on Google Cloud.

The same story (a tuning job whose trials succeed, time out running and time out between
attempts after a node fault, beside an ordinary job resumed after a fault, with repairs and
the periodic tick throughout) runs on the embedded bus in the
route table's order and on buses that shuffle the subscribers of every event; the end state
is the same: every job, trial, study and node, the alerts, and the Prometheus metrics."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.job_submission import commands as job_commands
from services.observability import metrics
from services.tuning import handlers as tuning
from services.wiring.routes import control_plane_routes
from shared.config import ControlPlaneConfig
from shared.domain.events import FleetTicked, JobCheckpointSaved
from shared.handling import Handler, Routes
from tests import harness
from tests.harness import Plane, healthy, job_body, xid

WHERE = {"parent": "projects/p/locations/l", "project": "p", "location": "l"}
SEEDS = range(6)


class ShuffledRoutes(Routes):
    """The control plane's routes, each event's subscribers in a new random order per call."""

    def __init__(self, seed: int) -> None:
        routes = control_plane_routes()
        super().__init__({s: routes.subscriptions(s) for s in routes.services})
        self._rng = random.Random(seed)
        self.reordered = 0  # deliveries whose order differs from the route table's

    def subscribers(self, event_type: str) -> tuple[tuple[str, Handler], ...]:
        table = super().subscribers(event_type)
        found = list(table)
        self._rng.shuffle(found)
        self.reordered += found != list(table)
        return tuple(found)


def study_body() -> dict[str, Any]:
    trial = job_body(1)
    trial["jobSpec"]["scheduling"] = {"timeout": "300s"}
    return {
        "displayName": "hp", "maxTrialCount": 4, "parallelTrialCount": 2,
        "studySpec": {"metrics": [{"metricId": "loss", "goal": "MINIMIZE"}],
                      "parameters": [{"parameterId": "lr",
                                      "discreteValueSpec": {"values": [0.1, 0.2, 0.3, 0.4]}}],
                      "algorithm": "GRID_SEARCH"},
        "trialJobWire": copy.deepcopy(trial["jobSpec"]), "trialJobBody": trial}


def tick(plane: Plane, seconds: float = 60) -> None:
    plane.clock.advance(seconds)
    plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
    plane.deliver()


def study(plane: Plane) -> dict[str, Any]:
    with plane.uow() as uow:
        found = tuning.get_study("s1", uow)
    assert found is not None
    return found


def report_loss(plane: Plane, trial: dict[str, Any], step: int, loss: float) -> None:
    path = Path(trial["metric_file"])
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps({"loss": loss, "global_step": step}) + "\n")
    job = plane.job(trial["job_id"])
    plane.inject(JobCheckpointSaved(job.job_id, job.attempt, step, f"fake://{job.job_id}/{step}",
                                    plane.clock.now()))
    plane.deliver()


def fault(plane: Plane, job_id: str) -> str:
    """An XID under the job's first rank: it checkpoints and leaves; the node goes to repair."""
    job = plane.job(job_id)
    node = job.node_ids[0]
    plane.report(node, xid(79, plane.clock.now()))
    plane.deliver()
    plane.exit_workers(job_id, job.attempt, 75)
    return str(node)


def story(root: Path) -> Plane:
    plane = Plane(ControlPlaneConfig(heartbeat_timeout_s=1e9, output_root=root)).up()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(1), u, d, "j1"))
    plane.deliver()
    plane.api(tuning.create_study, "s1", WHERE, "c1", study_body())
    plane.deliver()
    first, second = study(plane)["trials"]
    report_loss(plane, first, 2, 0.5)
    broken = [fault(plane, "j1")]  # j1 resumes on the spare
    tick(plane)
    broken.append(fault(plane, second["job_id"]))  # trial 2 waits: every other node is busy
    for _ in range(6):  # past the trials' 300 s: the tick fails trial 2 between attempts,
        tick(plane)  # and asks trial 1 to stop
        for job_id, attempt in plane.compute.signalled:
            if not plane.job(job_id).terminal:
                plane.exit_workers(job_id, attempt, 143)
    plane.finish_repairs()  # the nodes come back
    for _ in range(plane.deps.config.repair.return_after_passes):
        tick(plane, 1)
        for node in broken:
            plane.report(node, healthy(plane.clock.now()), source="post-repair-check")
        plane.deliver()
    for trial in study(plane)["trials"]:
        job = plane.job(trial["job_id"])
        if not job.terminal:
            report_loss(plane, trial, 4, 0.125 * int(trial["id"]))
            plane.exit_workers(job.job_id, job.attempt, 0)
    plane.exit_workers("j1", plane.job("j1").attempt, 0)
    tick(plane)
    tick(plane)
    return plane


def end_state(plane: Plane) -> dict[str, Any]:
    with plane.uow() as uow:
        jobs = {j.job_id: (j.state.value, j.attempt, j.restart_count, j.error, j.node_ids)
                for j in uow.jobs.list("c1")}
        nodes = {n.node_id: (n.state.value, n.job_id, n.reason) for n in uow.nodes.list("c1")}
        alerts = sorted((a["kind"], a["subject"], a["state"])
                        for a in uow.records("alerts", {}))  # type: ignore[attr-defined]
    s = study(plane)
    trials = [{k: v for k, v in t.items() if k != "metric_file"} for t in s["trials"]]
    reg = metrics.registry(plane.store, plane.clock, event_log=plane.deps.event_log)
    scraped = {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
               for family in text_string_to_metric_families(metrics.render(reg).decode())
               for sample in family.samples
               if sample.name.startswith("mtc_")}  # the state's, not the process's
    return {"jobs": jobs, "nodes": nodes, "alerts": alerts, "study": (s["state"], s["error"]),
            "trials": trials, "metrics": scraped}


@pytest.fixture(scope="module")
def ordered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return end_state(story(tmp_path_factory.mktemp("ordered")))


def test_the_story_covers_every_kind_of_trial_end(ordered: dict[str, Any]) -> None:
    """(what the comparison below is worth: the ordered run reaches these states)"""
    assert ordered["study"][0] == tuning.SUCCEEDED
    states = [t["state"] for t in ordered["trials"]]
    assert states.count("SUCCEEDED") >= 2 and "INFEASIBLE" in states, states
    assert ordered["jobs"]["j1"][0] == "JOB_STATE_SUCCEEDED" and ordered["jobs"]["j1"][2] == 1
    assert any(state == "JOB_STATE_FAILED" for state, *_ in ordered["jobs"].values())


@pytest.mark.parametrize("seed", SEEDS)
def test_any_delivery_order_reaches_the_same_end_state(
        seed: int, ordered: dict[str, Any], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    routes = ShuffledRoutes(seed)
    monkeypatch.setattr(harness, "control_plane_routes", lambda: routes)
    shuffled = end_state(story(tmp_path))
    assert routes.reordered > 10
    for key in ordered:
        assert shuffled[key] == ordered[key], key
