"""What users read: one line per event (``mtc events``, the demos, the console's timeline) and
the entity views of the CLI's tables. Moved with ``services/presentation`` out of ``shared``."""

from __future__ import annotations

from typing import Any

from services.presentation.timeline import describe, is_routine, style
from services.presentation.views import iso, job_view
from shared.domain.model import Job, JobState
from shared.domain.specs import CustomJobSpec
from tests.harness import healthy, job_body, xid

NOW = 1_800_000_000.0


def report(conditions: tuple[dict[str, Any], ...], source: str = "agent") -> dict[str, Any]:
    return {"type": "mtc.node.health_reported.v1", "time": NOW,
            "data": {"node_id": "c1-gpu-001", "source": source,
                     "conditions": list(conditions)}}


def test_a_healthy_heartbeat_and_a_tick_are_routine_a_fault_is_not() -> None:
    assert is_routine(report(healthy(NOW)))
    assert is_routine({"type": "mtc.fleet.ticked.v1", "data": {}})
    assert not is_routine(report(xid(79, NOW)))
    assert not is_routine(report(healthy(NOW), source="post-repair-check"))


def test_describe_names_the_fault_and_falls_back_to_entity_and_verb() -> None:
    assert describe(report(xid(79, NOW))) == "node c1-gpu-001: health report [agent]: XID 79"
    assert describe(report(healthy(NOW))).endswith("all checks pass")
    unknown = {"type": "mtc.study.trial_paused.v1", "subject": "s1", "data": {}}
    assert describe(unknown) == "study s1: trial paused"
    assert style("mtc.node.diagnosed.v1") == "bold red"
    assert style("mtc.job.finished.v1") == "bold green"


def test_views_are_camel_case_with_rfc3339_times() -> None:
    assert iso(None) is None
    assert iso(NOW) == "2027-01-15T08:00:00Z"
    spec = CustomJobSpec.parse(job_body(2))
    view = job_view(Job("j1", "c1", spec, JobState.QUEUED, NOW, NOW))
    assert view["jobId"] == "j1" and view["state"] == "JOB_STATE_QUEUED"
    assert view["createTime"] == "2027-01-15T08:00:00Z" and view["endTime"] is None


def test_a_rack_drain_reads_as_one_alert_for_the_rack() -> None:
    data = {"cluster_id": "c1", "partition": "gpu", "domain": "gpu-rack-0",
            "node_ids": ["n0", "n1"], "reason": "rack gpu-rack-0: 2 of 2 nodes bad",
            "held": False}
    doc: dict[str, Any] = {"type": "mtc.domain.drained.v1", "time": NOW,
                           "subject": "gpu-rack-0", "data": data}
    assert describe(doc) == ("rack gpu-rack-0 (gpu): ALERT rack drained as one, nodes n0, n1: "
                             "rack gpu-rack-0: 2 of 2 nodes bad")
    held = {**doc, "data": {**doc["data"], "held": True}}
    assert "rack drain HELD" in describe(held)


def test_a_later_attempt_without_a_known_checkpoint_does_not_claim_to_start_over() -> None:
    """A program may resume from files it names in a way mtc cannot read a step from: mtc
    says it recognised no checkpoint rather than "from scratch" (docs/pytorch.md)."""
    def started(attempt: int, resume_step: int) -> str:
        return describe({"type": "mtc.job.started.v1", "time": NOW, "data": {
            "job_id": "j1", "attempt": attempt, "node_ids": ["n0"], "resume_step": resume_step}})

    assert started(1, -1) == "job j1: attempt 1 started on n0, from scratch"
    assert started(2, -1) == ("job j1: attempt 2 started on n0, no checkpoint recognised "
                              "(see docs/pytorch.md)")
    assert started(2, 120).endswith("resuming from checkpoint step 120")


def test_each_checkpoint_line_names_its_tier() -> None:
    """One line per save, saying where it went: the memory, peer and durable saves of one
    step read as three different saves, not the same one repeated."""
    def saved(tier: str | None) -> str:
        data = {"job_id": "j1", "attempt": 2, "step": 40, "path": "/x", "time": NOW}
        return describe({"type": "mtc.job.checkpoint_saved.v1",
                         "data": data if tier is None else {**data, "tier": tier}})

    assert saved("memory") == "job j1: checkpoint step 40 saved to node memory (attempt 2)"
    assert saved("peer").endswith("saved to its buddy node's memory (attempt 2)")
    assert saved("durable") == saved(None)  # events from before tiers were durable saves
    assert saved(None).endswith("saved to durable storage (attempt 2)")
