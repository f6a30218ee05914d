"""The Compute contract: what ``shared.ports.Compute`` promises, checked on every implementation.

One set of assertions, run over every implementation through a small driver each
(``compute_drivers.py``: how time passes, how a worker checkpoints and answers SIGTERM):

* ``fake``: ``tests.harness.FakeCompute``, the handler tests' double;
* ``local``: ``LocalCompute`` with real subprocess workers;
* ``slurm``: ``SlurmCompute`` over the in-memory Slurm of its unit tests;
* ``sim``: the simulator's ``SimCompute`` on SimPy time.

What the port promises: every call is idempotent by its key (provision by node; a repair by
node and attempt, whatever the action; start_workers by job and attempt); results come back
later as events, once each: one ``NodeProvisioned`` per node, one ``NodeRepairCompleted`` per
repair followed by its post-repair ``NodeHealthReported``, every ``JobCheckpointSaved`` step
once (attempts of a job share its checkpoints) and before the attempt's one
``JobWorkersExited``; a signalled attempt checkpoints and exits 75. An adapter that runs
deep checks (``start_deep_check``, ``shared.ports.DeepChecks``) runs one per (node,
attempt) as an action that takes time, reporting DCGM and the collective test once, tagged
with the attempt; one that cannot is skipped here and the gate records "unknown".

A new Compute adapter must pass this module unchanged: add a driver for it to
``compute_drivers.DRIVERS``, never a special case here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.domain.events import (
    Event,
    JobCheckpointSaved,
    JobWorkersExited,
    NodeHealthReported,
    NodeProvisioned,
    NodeRepairCompleted,
)
from shared.domain.health import RepairAction
from shared.policies.repair import DEEP_CHECK_SOURCE, DEEP_CHECK_TYPES
from shared.ports import DeepChecks, RecoveryPlan, provision_nodes
from tests.contract.compute_drivers import DRIVERS, JOB, WORLD, Driver, make_node

NODES = tuple(f"w{i}" for i in range(WORLD))
GRACE_S = 600.0  # long enough that no driver's workers are SIGKILLed before they save


# drivers that start real worker processes, servers or client libraries: `make test` runs them
SLOW_DRIVERS = {"gce", "local", "remote"}


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.slow) if name in SLOW_DRIVERS else name
                        for name in sorted(DRIVERS)])
def driver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Driver]:
    made = DRIVERS[request.param](tmp_path)
    yield made
    made.close()


def up(driver: Driver, *node_ids: str) -> None:
    for node_id in node_ids:
        driver.compute.provision_node(make_node(node_id))
    driver.until(lambda: {e.node_id for e in driver.events.of(NodeProvisioned)} >= set(node_ids),
                 "provisioning")


def exits(driver: Driver, attempt: int) -> list[JobWorkersExited]:
    return [e for e in driver.events.of(JobWorkersExited) if (e.job_id, e.attempt) == (JOB, attempt)]


def index(events: list[Event], wanted: Event) -> int:
    return next(i for i, e in enumerate(events) if e is wanted)


def stop_by_signal(driver: Driver, attempt: int) -> JobWorkersExited:
    """SIGTERM (twice: a repeat changes nothing), then wait for the attempt's exit."""
    driver.compute.signal_workers(JOB, attempt, GRACE_S)
    driver.compute.signal_workers(JOB, attempt, GRACE_S)
    driver.until(lambda: bool(exits(driver, attempt)), "workers exit after SIGTERM")
    for _ in range(3):
        driver.settle()
    [exited] = exits(driver, attempt)
    return exited


def test_a_repeated_provision_is_one_node(driver: Driver) -> None:
    node = make_node("w0")
    driver.compute.provision_node(node)
    driver.compute.provision_node(node)
    up(driver, "w0")
    driver.compute.provision_node(node)
    for _ in range(3):
        driver.settle()
    assert [e.node_id for e in driver.events.of(NodeProvisioned)] == ["w0"]
    assert all(e.ok for e in driver.events.of(NodeProvisioned))


def test_a_batch_of_provisions_is_each_node_once(driver: Driver) -> None:
    """``shared.ports.provision_nodes``: one request for many machines (where the adapter
    takes a batch, as the twin does) brings up each node once, a node named twice in it or
    asked for again included."""
    nodes = [make_node(n) for n in ("w0", "w1", "w0")]
    provision_nodes(driver.compute, nodes)
    up(driver, "w0", "w1")
    provision_nodes(driver.compute, [make_node("w1")])
    for _ in range(3):
        driver.settle()
    assert sorted(e.node_id for e in driver.events.of(NodeProvisioned)) == ["w0", "w1"]
    assert all(e.ok for e in driver.events.of(NodeProvisioned))


def test_a_repair_runs_once_per_attempt_and_completes_once_with_its_post_repair_report(
    driver: Driver,
) -> None:
    up(driver, "w0")
    driver.compute.start_repair("w0", RepairAction.REBOOT, 1)
    driver.compute.start_repair("w0", RepairAction.REBOOT, 1)
    driver.compute.start_repair("w0", RepairAction.RESET_GPU, 1)  # same key, another action
    driver.until(lambda: bool(driver.events.of(NodeRepairCompleted)), "the repair completes")
    for _ in range(5):
        driver.settle()
    [done] = driver.events.of(NodeRepairCompleted)
    assert (done.node_id, done.attempt, done.action, done.ok) == ("w0", 1, "reboot", True)
    after = driver.events.events[index(driver.events.events, done) + 1:]
    post = [e for e in after if isinstance(e, NodeHealthReported) and e.node_id == "w0"
            and e.source == "post-repair-check"]
    assert post, "a completed repair is followed by its post-repair check"
    assert all(c["status"] != "true" for c in post[0].conditions)  # nothing was wrong

    driver.compute.start_repair("w0", RepairAction.REBOOT, 2)  # a new attempt: a new repair
    driver.until(lambda: len(driver.events.of(NodeRepairCompleted)) == 2, "the second repair")
    for _ in range(3):
        driver.settle()
    assert [e.attempt for e in driver.events.of(NodeRepairCompleted)] == [1, 2]


def deep_reports(driver: Driver, node_id: str) -> list[NodeHealthReported]:
    return [e for e in driver.events.of(NodeHealthReported)
            if e.node_id == node_id and e.source == DEEP_CHECK_SOURCE]


def test_a_deep_check_takes_time_runs_once_per_attempt_and_reports_each_check(
    driver: Driver,
) -> None:
    compute = driver.compute
    if not isinstance(compute, DeepChecks):
        pytest.skip(f"{driver.name} runs no deep checks (the gate records unknown)")
    up(driver, "w0")
    compute.start_deep_check("w0", 1)
    compute.start_deep_check("w0", 1)
    assert not deep_reports(driver, "w0")  # an action with a duration: nothing at once
    driver.until(lambda: bool(deep_reports(driver, "w0")), "the deep check reports")
    for _ in range(5):
        driver.settle()
    [report] = deep_reports(driver, "w0")
    by_type = {c["type"]: c for c in report.conditions}
    assert set(DEEP_CHECK_TYPES) <= set(by_type)
    assert {c["details"]["deep_check_attempt"] for c in report.conditions} == {1}
    assert all(c["status"] != "true" for c in report.conditions)  # nothing was wrong

    compute.start_deep_check("w0", 2)
    driver.until(lambda: len(deep_reports(driver, "w0")) == 2, "the second deep check")
    assert {c["details"]["deep_check_attempt"] for c in deep_reports(driver, "w0")[1].conditions
            } == {2}


def test_repeated_start_workers_is_one_attempt_ending_in_one_workers_exited(driver: Driver) -> None:
    up(driver, *NODES)
    gang = driver.gang(1, NODES)
    driver.compute.start_workers(gang)
    driver.compute.start_workers(gang)
    driver.running(1)
    driver.compute.start_workers(gang)
    assert driver.launches(1) == 1
    stop_by_signal(driver, 1)
    driver.compute.start_workers(gang)  # after the end: still the same, finished, attempt
    for _ in range(3):
        driver.settle()
    assert driver.launches(1) == 1
    assert len(exits(driver, 1)) == 1


def test_signal_then_a_checkpoint_then_exit_75_then_exactly_one_workers_exited(
    driver: Driver,
) -> None:
    up(driver, *NODES)
    driver.compute.start_workers(driver.gang(1, NODES))
    driver.running(1)
    before = len(driver.events.events)
    exited = stop_by_signal(driver, 1)
    assert exited.exit_code == 75
    events = driver.events.events
    saved = [e for e in events[before:index(events, exited)]
             if isinstance(e, JobCheckpointSaved) and (e.job_id, e.attempt) == (JOB, 1)]
    assert saved, "the program saved a checkpoint on SIGTERM, reported before its exit"
    driver.compute.stop_workers(JOB, 1)  # the end is final: a late stop adds nothing
    driver.compute.signal_workers(JOB, 1, GRACE_S)
    for _ in range(3):
        driver.settle()
    assert exits(driver, 1) == [exited]


def test_each_checkpoint_is_reported_once_across_attempts_and_before_the_exit(
    driver: Driver,
) -> None:
    up(driver, *NODES)
    for attempt in (1, 2):
        driver.compute.start_workers(driver.gang(attempt, NODES))
        driver.running(attempt)
        for _ in range(2):
            driver.checkpoint(attempt)
            for _ in range(3):
                driver.settle()
        exited = stop_by_signal(driver, attempt)
        events = driver.events.events
        late = [e for e in events[index(events, exited):]
                if isinstance(e, JobCheckpointSaved) and e.attempt == attempt]
        assert late == [], "an attempt's checkpoints are all reported before its exit"
    saved = driver.events.of(JobCheckpointSaved)
    steps = [e.step for e in saved]
    assert len(steps) == len(set(steps)), f"a step reported twice: {steps}"
    assert steps == sorted(steps)
    assert {e.attempt for e in saved} == {1, 2}
    assert sum(1 for e in saved if e.attempt == 1) >= 2


# ------------------------------------------------------------------ recoveries


def test_an_in_place_restart_runs_the_next_attempt_on_the_same_nodes(driver: Driver) -> None:
    """``Gang.recovery`` in_place: attempt 2 on the nodes attempt 1 ran on, started once,
    its ranks told the mode (none of them fresh), ending in one exit of its own."""
    up(driver, *NODES)
    driver.compute.start_workers(driver.gang(1, NODES))
    driver.running(1)
    stop_by_signal(driver, 1)
    gang = driver.gang(2, NODES, RecoveryPlan("in_place"))
    driver.compute.start_workers(gang)
    driver.running(2)
    launched = driver.launches(2)
    driver.compute.start_workers(gang)  # a repeat is the same attempt
    driver.settle()
    assert driver.launches(2) == launched
    for rank in range(WORLD):
        seen = driver.recovery_seen(2, rank)
        assert seen is None or seen == ("in_place", "0"), seen
    exited = stop_by_signal(driver, 2)
    assert exited.exit_code == 75 and len(exits(driver, 1)) == 1


def test_a_hot_swap_starts_the_fresh_node_beside_the_kept_ones(driver: Driver) -> None:
    """``Gang.recovery`` hot_swap: rank 1 moves to a spare that is new to the job; only that
    rank is told it is fresh (it restores from the peer tier), rank 0 stays where it was."""
    up(driver, *NODES, "spare")
    driver.compute.start_workers(driver.gang(1, NODES))
    driver.running(1)
    stop_by_signal(driver, 1)
    swapped = (NODES[0], "spare", *NODES[2:])
    launched = driver.launches(1)
    driver.compute.start_workers(driver.gang(2, swapped, RecoveryPlan("hot_swap", ("spare",))))
    driver.running(2)
    assert driver.launches(2) in (1, launched + 1)  # (the twin counts the job's launches)
    seen = [driver.recovery_seen(2, rank) for rank in range(WORLD)]
    if seen[0] is not None:
        assert seen[0] == ("hot_swap", "0") and seen[1] == ("hot_swap", "1"), seen
    exited = stop_by_signal(driver, 2)
    assert exited.exit_code == 75

