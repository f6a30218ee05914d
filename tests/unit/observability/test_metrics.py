"""Prometheus metrics from the store and the event log: the families ``/metrics`` serves,
their labels and values after a real self-healing story on the in-memory plane."""

from __future__ import annotations

import platform
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from services.job_submission import commands as job_commands
from services.observability import metrics
from shared.config import ControlPlaneConfig
from shared.domain.events import FleetTicked, JobCheckpointSaved
from tests.harness import CLUSTER, Plane, job_body, xid


def scrape(plane: Plane, reg: Any = None) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    reg = reg or metrics.registry(plane.store, plane.clock, event_log=plane.deps.event_log)
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(metrics.render(reg).decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_node_job_bus_and_event_metrics_after_a_fault() -> None:
    plane = Plane(ControlPlaneConfig(heartbeat_timeout_s=1e9)).up()
    reg = metrics.registry(plane.store, plane.clock, event_log=plane.deps.event_log)
    before = scrape(plane, reg)
    assert before["mtc_nodes"][(("cluster", "c1"), ("partition", "train"), ("state", "idle"))] == 4
    assert before["mtc_fault_to_drain_seconds_count"][()] == 0
    assert "mtc_controller_last_tick_age_seconds" not in before  # no tick yet
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    node = plane.job("j1").node_ids[0]
    plane.clock.advance(10)
    plane.inject(JobCheckpointSaved("j1", 1, 100, "fake://j1/ckpt-100", plane.clock.now()))
    plane.deliver()
    plane.report(node, xid(79, plane.clock.now() - 3))  # observed 3 s before it arrives
    plane.deliver()
    plane.clock.advance(4)
    plane.exit_workers("j1", 1, 75)  # checkpointed and left: requeued, resumed elsewhere
    plane.inject(FleetTicked(cluster_id="c1", at=plane.clock.now()))
    plane.deliver()
    plane.clock.advance(2)
    after = scrape(plane, reg)  # the same registry: the event stats are incremental
    assert after["mtc_fault_to_drain_seconds_count"][()] == 1
    assert after["mtc_fault_to_drain_seconds_sum"][()] == 3.0
    assert after["mtc_fault_to_drain_seconds_bucket"][(("le", "2.5"),)] == 0
    assert after["mtc_fault_to_drain_seconds_bucket"][(("le", "5.0"),)] == 1
    assert after["mtc_fault_to_resumed_seconds_count"][()] == 1
    assert after["mtc_fault_to_resumed_seconds_sum"][()] == 7.0
    assert after["mtc_repair_starts_total"][(("action", "reboot"),)] == 1
    assert "mtc_repairs_total" not in after  # started is not an outcome: none completed yet
    assert after["mtc_nodes"][(("cluster", "c1"), ("partition", "train"),
                               ("state", "repairing"))] == 1
    assert after["mtc_jobs"][(("cluster", "c1"), ("state", "JOB_STATE_RUNNING"))] == 1
    assert after["mtc_job_restarts_total"][(("cluster", "c1"), ("job", "j1"))] == 1
    assert after["mtc_jobs"][(("cluster", "c1"), ("state", "JOB_STATE_FAILED"))] == 0
    assert after["mtc_nodes"][(("cluster", "c1"), ("partition", "train"),
                               ("state", "failed"))] == 0  # an empty state is 0, not absent
    assert after["mtc_build_info"][(("python", platform.python_version()),
                                    ("version", metrics._version()))] == 1
    assert after["process_cpu_seconds_total"][()] > 0
    # 10 s trained and checkpointed, then 4 s from the fault to the restart (the shared
    # accounting, shared.goodput): nothing lost since the checkpoint
    job = (("cluster", "c1"), ("job", "j1"))
    assert after["mtc_job_goodput_ratio"][job] == 10 / 14
    assert after["mtc_job_recovery_seconds"][job] == 4.0
    assert after["mtc_job_lost_steps"][job] == 0
    assert after["mtc_controller_last_tick_age_seconds"][()] == 2.0
    assert after["mtc_bus_lag_seconds"][()] == 0.0 and after["mtc_dead_letters"][()] == 0
    assert after["mtc_alerts_firing"][(("kind", "repair_held"),)] == 0
    again = scrape(plane, reg)  # a second scrape counts nothing twice
    assert again["mtc_fault_to_drain_seconds_count"][()] == 1
    fresh = scrape(plane)  # a new collector (a restarted server) rebuilds from the log
    assert fresh["mtc_fault_to_resumed_seconds_count"][()] == 1
    assert fresh["mtc_repair_starts_total"] == after["mtc_repair_starts_total"]


def test_bus_lag_is_the_oldest_undelivered_entry_and_gcp_has_no_event_stats() -> None:
    plane = Plane()
    plane.api(job_commands.create_cluster, CLUSTER)  # queued, not delivered
    plane.clock.advance(7)
    out = scrape(plane, metrics.registry(plane.store, plane.clock, event_log=None))
    assert out["mtc_bus_lag_seconds"][()] == 7.0
    assert "mtc_repair_starts_total" not in out
    assert out["mtc_fault_to_drain_seconds_count"][()] == 0


def test_only_live_and_lately_ended_jobs_keep_series_of_their_own() -> None:
    """Every job ever submitted kept its own series (unbounded)."""
    now = 100_000.0
    docs = [{"job_id": "live", "created_at": 1.0, "ended_at": None},
            {"job_id": "lately", "created_at": 2.0, "ended_at": now - 60.0},
            {"job_id": "long-ago", "created_at": 3.0, "ended_at": now - metrics.RECENT_S - 1}]
    docs += [{"job_id": f"j{i}", "created_at": 10.0 + i, "ended_at": None}
             for i in range(metrics.MAX_JOB_SERIES)]
    kept = [d["job_id"] for d in metrics.per_job_series(docs, now)]
    assert "long-ago" not in kept and len(kept) == metrics.MAX_JOB_SERIES
    assert kept[0] == f"j{metrics.MAX_JOB_SERIES - 1}"  # newest first
    assert [d["job_id"] for d in metrics.per_job_series(docs[:3], now)] == ["lately", "live"]


def test_recoveries_are_counted_by_mode() -> None:
    """An in-place restart (the job measured tier-1 saves) counts as in_place; a later
    requeue the policy had no alternative to (a drained node, no peer copy for a spare to
    restore from, not elastic: the plain requeue, no decision recorded) counts as requeue."""
    plane = Plane(ControlPlaneConfig(heartbeat_timeout_s=1e9)).up()
    plane.api(lambda u, d: job_commands.submit_job("c1", job_body(2), u, d, "j1"))
    plane.deliver()
    first = plane.job("j1").node_ids
    plane.clock.advance(10)
    plane.inject(JobCheckpointSaved("j1", 1, 100, "mem://j1/100", plane.clock.now(), 0.1,
                                    "memory"))
    plane.deliver()
    plane.report(first[0], xid(13, plane.clock.now()))
    plane.deliver()
    plane.exit_workers("j1", 1, 75)
    assert plane.job("j1").attempt == 2
    plane.report(first[1], xid(79, plane.clock.now()))
    plane.deliver()
    plane.exit_workers("j1", 2, 75)
    out = scrape(plane)
    assert out["mtc_recoveries_total"] == {(("mode", "in_place"),): 1, (("mode", "requeue"),): 1}
