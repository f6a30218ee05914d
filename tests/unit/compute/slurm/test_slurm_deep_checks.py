"""SlurmCompute's deep checks over the in-memory Slurm: the reservation made and released
around the checks, a node it cannot check reported unknown, a run resumed after a restart."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.adapters.compute.slurm.reservations import DeepCheckSpec, parse_reservation
from shared.domain.errors import ValidationError
from shared.domain.events import NodeHealthReported, NodeProvisioned
from shared.domain.model import Node, NodeRole, NodeState
from shared.probes.commands import CommandResult
from tests.harness import ManualClock, Recorder

from .fake_slurm import FakeSlurm

SHOW = "\n".join((  # captured from the Slurm 22.05 test cluster
    "ReservationName=mtc-deep-n3-a1 StartTime=2026-12-01T12:16:55 EndTime=2026-12-01T12:46:55"
    " Duration=00:30:00",
    "   Nodes=n[3-4] NodeCnt=2 CoreCnt=4 Features=(null) PartitionName=(null)"
    " Flags=MAINT,IGNORE_JOBS,SPEC_NODES",
    "   TRES=cpu=4",
    "   Users=root Groups=(null) Accounts=(null) Licenses=(null) State=ACTIVE"
    " BurstBuffer=(null) Watts=n/a",
))


def test_parse_reservation_as_scontrol_shows_it() -> None:
    res = parse_reservation(SHOW)  # captured from the Slurm 22.05 test cluster
    assert res is not None and res.name == "mtc-deep-n3-a1"
    assert res.nodes == ("n3", "n4") and "MAINT" in res.flags and res.state == "ACTIVE"
    assert parse_reservation("") is None


class NoTools:
    """Nodes without dcgmi or all_reduce_perf, as srun reports them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        self.calls.append(tuple(argv))
        tool = argv[-1] if argv[-1] == "-j" else "all_reduce_perf"
        name = "dcgmi" if tool == "-j" else tool
        return CommandResult(tuple(argv), 2, "", f"slurmstepd-n1: error: execve(): {name}: "
                             "No such file or directory\n")


def build(tmp: Path, slurm: FakeSlurm, events: Recorder, runner: NoTools) -> SlurmCompute:
    return SlurmCompute(tmp / "compute", events, ManualClock(1000.0), cli=slurm,
                        agent_probes=("disk",), observe_interval_s=0.0, agent_interval_s=1e9,
                        deep_check_runner=runner)


def deep(events: Recorder) -> list[NodeHealthReported]:
    return [e for e in events.of(NodeHealthReported) if e.source == "deep-check"]


def wait(compute: SlurmCompute, events: Recorder, n: int) -> None:
    deadline = time.monotonic() + 10
    while len(deep(events)) < n and time.monotonic() < deadline:
        compute.poll()
        time.sleep(0.01)


def test_the_checks_run_in_a_reservation_that_is_released(tmp_path: Path) -> None:
    slurm, events, runner = FakeSlurm(), Recorder(), NoTools()
    compute = build(tmp_path, slurm, events, runner)
    try:
        for node_id in ("w0", "w1"):
            compute.provision_node(Node(node_id, "c", "p", "train", NodeRole.WORKER, "m", None,
                                        0, NodeState.PROVISIONING, 0.0))
        for _ in range(5):
            compute.poll()
        assert len(events.of(NodeProvisioned)) == 2
        compute.start_deep_check("w0", 1)
        wait(compute, events, 1)
        [report] = deep(events)
        reserve = [c for c in slurm.calls if c[0] in ("reserve", "unreserve")]
        name = reserve[0][1]
        assert reserve[0][0] == "reserve" and reserve[-1] == ("unreserve", name)
        assert len(reserve[0][2].split(",")) == 2  # the node and one idle peer
        assert all(f"--reservation={name}" in call for call in runner.calls)
        assert slurm.reservations == {}
        statuses = {c["type"]: (c["status"], c["reason"]) for c in report.conditions}
        assert statuses["DcgmDiagFailed"] == ("unknown", f"dcgmi not found on "
                                              f"{reserve[0][2].split(',')[0]}")
        assert statuses["CollectiveBandwidthLow"][0] == "unknown"
    finally:
        compute.close()


def test_an_unmapped_node_is_reported_unknown_not_left_pending(tmp_path: Path) -> None:
    slurm, events, runner = FakeSlurm(), Recorder(), NoTools()
    compute = build(tmp_path, slurm, events, runner)
    try:
        compute.start_deep_check("nobody", 3)
        wait(compute, events, 1)
        [report] = deep(events)
        assert {c["status"] for c in report.conditions} == {"unknown"}
        assert "no Slurm node" in report.conditions[0]["reason"]
        assert runner.calls == [] and slurm.reservations == {}
    finally:
        compute.close()


def test_a_check_cut_short_by_a_restart_runs_again(tmp_path: Path) -> None:
    slurm, events, runner = FakeSlurm(), Recorder(), NoTools()
    compute = build(tmp_path, slurm, events, runner)
    with compute.store.tx() as db:  # what a crash mid-check leaves: a row without a result
        db.execute("INSERT INTO nodes (node_id, role, machine_type, slurm_node, requested_at,"
                   " provisioned) VALUES ('w0', 'worker', 'm', 'n1', 0, 1)")
        db.execute("INSERT INTO deep_checks (node_id, attempt, slurm_node, started_at)"
                   " VALUES ('w0', 2, 'n1', 1000)")
    compute.close()
    again = build(tmp_path, slurm, events, runner)
    try:
        wait(again, events, 1)
        [report] = deep(events)
        assert {c["details"]["deep_check_attempt"] for c in report.conditions} == {2}
        again.start_deep_check("w0", 2)  # a repeat of the same key: nothing new
        for _ in range(3):
            again.poll()
        assert len(deep(events)) == 1
    finally:
        again.close()


def test_the_spec_from_plain_data_names_a_bad_field(tmp_path: Path) -> None:
    spec = DeepCheckSpec.from_dict({"min_busbw_gbps": 300, "dcgm_level": 2,
                                    "nccl_argv": ["all_reduce_perf", "-b", "1G"]})
    assert spec.nccl_argv == ("all_reduce_perf", "-b", "1G") and spec.dcgm_level == 2
    for bad, field in (({"level": 3}, "deep_check_spec.level"),
                       ({"dcgm_level": 1}, "deep_check_spec.dcgm_level"),
                       ({"min_busbw_gbps": 0}, "deep_check_spec.min_busbw_gbps"),
                       ({"nccl_argv": "all_reduce_perf"}, "deep_check_spec.nccl_argv")):
        with pytest.raises(ValidationError) as err:
            DeepCheckSpec.from_dict(bad)
        assert err.value.path == field
    compute = SlurmCompute(tmp_path / "c", Recorder(), ManualClock(), cli=FakeSlurm(),
                           deep_check_spec={"min_busbw_gbps": 350.0})
    try:
        assert compute.deep_check_spec.min_busbw_gbps == 350.0
    finally:
        compute.close()
