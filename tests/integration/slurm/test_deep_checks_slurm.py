"""Deep checks on the real Slurm cluster: the node (and its peer) sit in a MAINT reservation
while the checks run through ``srun --reservation``, and leave it when they end.

No GPU here: ``dcgmi`` is a stand-in script (said plainly: it prints the level-3 fixture
and records where srun ran it), ``all_reduce_perf`` is absent on the nodes, so the
collective test is ``unknown`` and so is the verdict, never "ok".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.adapters.compute.slurm.reservations import (
    DeepCheckSpec,
    Reservation,
    ReservationCli,
    reservation_name,
    run_deep_check,
)
from shared.domain.events import NodeHealthReported
from shared.domain.health import Condition
from shared.policies.repair import deep_check_verdict
from shared.probes.commands import CommandResult, run_command
from tests.harness import ManualClock, Recorder
from tests.integration.slurm.conftest import Cluster, wait_for

pytestmark = [pytest.mark.integration]

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "dcgm" / "dcgmi_diag_r3_pass.json"


def stand_in_dcgmi(tmp: Path) -> Path:
    """A stand-in for dcgmi (no GPU here): prints the recorded level-3 output and notes which
    node srun ran it on."""
    tool = tmp / "dcgmi"
    tool.write_text("#!/bin/bash\n"
                    f'echo "$SLURMD_NODENAME $*" >> {tmp}/dcgmi.calls\n'
                    f"cat {FIXTURE}\n")
    tool.chmod(0o755)
    return tool


class Watching:
    """run_command, noting the reservation as Slurm shows it while each check runs."""

    def __init__(self, cli: ReservationCli, name: str) -> None:
        self.cli = cli
        self.name = name
        self.seen: list[tuple[str, Reservation | None]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> CommandResult:
        tool = next(a for a in argv if not a.startswith("-") and a not in ("env", "srun")
                    and "=" not in a)
        self.seen.append((tool, self.cli.reservation(self.name)))
        return run_command(argv, timeout_s)


def test_a_node_sits_in_a_maint_reservation_during_its_deep_checks(
    cluster: Cluster, tmp_path: Path
) -> None:
    cli = ReservationCli(timeout_s=30.0, slurm_conf=cluster.slurm_conf)
    name = reservation_name("n3", 1)
    assert cli.reservation(name) is None
    spec = DeepCheckSpec(dcgmi=str(stand_in_dcgmi(tmp_path)), min_busbw_gbps=300.0,
                         tasks_per_node=1, dcgm_timeout_s=60, nccl_timeout_s=60,
                         reservation_minutes=10, slurm_conf=cluster.slurm_conf)
    watch = Watching(cli, name)
    conditions = run_deep_check(cli, "n3", ["n4"], 1, spec, watch, time.time)

    (dcgm_tool, during_dcgm), (nccl_tool, during_nccl) = watch.seen
    assert Path(dcgm_tool).name == "dcgmi" and nccl_tool == "all_reduce_perf"
    for during in (during_dcgm, during_nccl):
        assert during is not None and during.nodes == ("n3", "n4")
        assert "MAINT" in during.flags and during.state == "ACTIVE"
    assert cli.reservation(name) is None  # left it when the checks ended
    assert (tmp_path / "dcgmi.calls").read_text().split()[:5] == ["n3", "diag", "-r", "3", "-j"]

    dcgm, bandwidth = (Condition.from_dict(c) for c in conditions)
    assert (dcgm.type, dcgm.status.value, dcgm.details["level"]) == ("DcgmDiagFailed", "false", 3)
    assert bandwidth.type == "CollectiveBandwidthLow" and bandwidth.status.value == "unknown"
    assert "all_reduce_perf not found on n3,n4" in bandwidth.reason
    assert {c["details"]["deep_check_attempt"] for c in conditions} == {1}
    assert deep_check_verdict([dcgm, bandwidth], 3).status.value == "unknown"  # never "ok"


def test_slurm_compute_runs_its_deep_check_in_a_reservation_and_reports_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Through the adapter: start_deep_check returns at once, poll() reports the results
    once; the reservation is gone afterwards. (Its node mapping is made directly: this test
    is about the deep check, not about provisioning.)"""
    events = Recorder()
    compute = SlurmCompute(tmp_path / "compute", events, ManualClock(), partition=None,
                           slurm_conf=cluster.slurm_conf, agent_interval_s=1e9,
                           deep_check_spec=DeepCheckSpec(
                               dcgmi=str(stand_in_dcgmi(tmp_path)), min_busbw_gbps=None,
                               tasks_per_node=1, reservation_minutes=10,
                               slurm_conf=cluster.slurm_conf))
    try:
        with compute.store.tx() as db:
            db.execute("INSERT INTO nodes (node_id, role, machine_type, slurm_node,"
                       " requested_at, provisioned) VALUES ('w-n2', 'worker', 'x', 'n2', 0, 1)")
        compute.observe(force=True)
        compute.start_deep_check("w-n2", 7)
        compute.start_deep_check("w-n2", 7)  # once per (node, attempt)

        def reported() -> list[NodeHealthReported]:
            compute.poll()
            return [e for e in events.of(NodeHealthReported) if e.source == "deep-check"]

        wait_for(lambda: bool(reported()), 60, "the deep check's report")
        for _ in range(3):
            compute.poll()
        [report] = reported()
        assert {c["details"]["reservation"] for c in report.conditions} == {"mtc-deep-n2-a7"}
        assert ReservationCli(slurm_conf=cluster.slurm_conf).reservation("mtc-deep-n2-a7") is None
        by_type = {c["type"]: c for c in report.conditions}
        assert by_type["DcgmDiagFailed"]["status"] == "false"
        assert by_type["CollectiveBandwidthLow"]["status"] == "unknown"  # no threshold set
    finally:
        compute.close()
