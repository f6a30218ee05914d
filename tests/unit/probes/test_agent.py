from __future__ import annotations

from pathlib import Path

import pytest

from shared.domain.errors import ValidationError
from shared.domain.health import ConditionStatus, HealthReport
from shared.probes.agent import AgentState, collect
from shared.probes.commands import run_command
from shared.probes.config import AgentConfig
from tests.recorded import fixture_text
from tests.unit.probes.fakes import FakeRunner, ok

NOW = 1_796_000_000.0
T, F, U = ConditionStatus.TRUE, ConditionStatus.FALSE, ConditionStatus.UNKNOWN


def statuses(report: HealthReport) -> dict[str, ConditionStatus]:
    return {c.type: c.status for c in report.conditions}


def gpu_runner(
    xml: str = "nvidia_smi/h100_healthy.xml", dcgm: str = "dcgm/dcgmi_diag_r1_pass.json"
) -> FakeRunner:
    return FakeRunner(
        {
            "nvidia-smi": ok(fixture_text(xml)),
            "dcgmi": ok(fixture_text(dcgm)),
            "dmesg": ok(fixture_text("kernel_log/dmesg_xid.txt")),
        }
    )


def config(tmp_path: Path, **kw: object) -> AgentConfig:
    values: dict[str, object] = {
        "node_id": "n1",
        "node_type": "h100",
        "mounts": ("/",),
        "disk_threshold": 1.0,
        "speed_baselines_s": {"h100": 1.0},
    }
    values.update(kw)
    return AgentConfig(**values)  # type: ignore[arg-type]


def test_healthy_gpu_node_apart_from_the_logged_xids(tmp_path: Path) -> None:
    report = collect(config(tmp_path), NOW, runner=gpu_runner(), speed_timer=lambda n: 0.5)
    assert report.node_id == "n1" and report.observed_at == NOW and report.source == "agent"
    assert statuses(report) == {
        "XidError": T,
        "EccUncorrectable": F,
        "RowRemapFailure": F,
        "ThermalThrottling": F,
        "DcgmDiagFailed": F,
        "DiskPressure": F,
        "SlowSpeedCheck": F,
    }
    assert report.condition("XidError").details["recovery_action"] == "Node Reboot Required"  # type: ignore[union-attr]


def test_faulty_gpu(tmp_path: Path) -> None:
    runner = gpu_runner("nvidia_smi/h100_dbe_remap_thermal.xml", "dcgm/dcgmi_diag_r2_fail.json")
    report = collect(config(tmp_path, dcgm_level=2, probes=("nvidia_smi", "dcgm")), NOW, runner=runner)
    assert statuses(report) == {
        "EccUncorrectable": T,
        "RowRemapFailure": T,
        "ThermalThrottling": T,
        "DcgmDiagFailed": T,
    }


def test_missing_tools_are_unknown_with_the_reason(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        probes=("nvidia_smi", "dcgm"),
        nvidia_smi_path="nvidia-smi-not-installed",
        dcgmi_path="/nonexistent/dcgmi",
    )
    report = collect(cfg, NOW, runner=run_command)
    by_type = {c.type: c for c in report.conditions}
    assert {c.status for c in report.conditions} == {U}
    assert by_type["EccUncorrectable"].reason == "nvidia-smi-not-installed not found on PATH"
    assert by_type["DcgmDiagFailed"].reason == "dcgmi not found at /nonexistent/dcgmi"


def test_default_tool_names_say_not_found_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    report = collect(config(tmp_path, probes=("nvidia_smi",)), NOW, runner=run_command)
    assert {c.reason for c in report.conditions} == {"nvidia-smi not found on PATH"}


def test_garbage_output_is_unknown_never_healthy(tmp_path: Path) -> None:
    runner = FakeRunner({"nvidia-smi": ok("Segmentation fault"), "dcgmi": ok("{}")})
    report = collect(config(tmp_path, probes=("nvidia_smi", "dcgm")), NOW, runner=runner)
    assert {c.status for c in report.conditions} == {U}
    assert "not valid XML" in report.conditions[0].reason
    assert "no test_categories" in report.conditions[-1].reason


def test_a_crashing_probe_does_not_silence_the_others(tmp_path: Path) -> None:
    def crash(size: int) -> float:
        raise ZeroDivisionError("boom")

    report = collect(
        config(tmp_path, probes=("speed", "disk")), NOW, runner=FakeRunner({}), speed_timer=crash
    )
    speed, disk = report.conditions
    assert speed.status is U and speed.reason == "speed probe crashed: ZeroDivisionError: boom"
    assert disk.status is F


def test_timeouts(tmp_path: Path, sleeper: str) -> None:
    cfg = config(
        tmp_path,
        probes=("nvidia_smi", "dcgm"),
        nvidia_smi_path=sleeper,
        dcgmi_path=sleeper,
        command_timeout_s=0.2,
        dcgm_timeout_s=0.2,
    )
    by_type = {c.type: c for c in collect(cfg, NOW, runner=run_command).conditions}
    # nvidia-smi hanging: could not check. dcgmi hanging: the diagnostic failed.
    assert by_type["EccUncorrectable"].status is U
    assert by_type["EccUncorrectable"].reason == "hang.sh timed out after 0.2s"
    assert by_type["DcgmDiagFailed"].status is T and by_type["DcgmDiagFailed"].reason == "timeout"


def test_since_is_kept_while_status_is_unchanged(tmp_path: Path) -> None:
    state = AgentState()
    cfg = config(tmp_path, probes=("xid", "disk"))
    runner = gpu_runner()
    first = collect(cfg, NOW, runner=runner, state=state)
    assert first.condition("XidError").status is T  # type: ignore[union-attr]
    state.acknowledge()  # delivered: the XIDs are not repeated
    second = collect(cfg, NOW + 60, runner=runner, state=state)
    xid = second.condition("XidError")
    assert xid is not None and xid.status is F and xid.since == NOW + 60  # changed: new since
    assert second.condition("DiskPressure").since == NOW  # type: ignore[union-attr]  # unchanged
    third = collect(cfg, NOW + 120, runner=runner, state=state)
    assert third.condition("XidError").since == NOW + 60  # type: ignore[union-attr]


def test_xid_log_file_source(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(fixture_text("kernel_log/kern_log_xid.log"))
    cfg = config(tmp_path, probes=("xid",), xid_source=str(log))
    state = AgentState()
    (cond,) = collect(cfg, NOW, runner=FakeRunner({}), state=state).conditions
    assert cond.details["xids"] == [74, 95, 154]
    assert cond.details["recovery_action"] == "GPU Reset Required"
    state.acknowledge()
    (again,) = collect(cfg, NOW + 5, runner=FakeRunner({}), state=state).conditions
    assert again.status is F
    missing = config(tmp_path, probes=("xid",), xid_source=str(tmp_path / "gone.log"))
    (gone,) = collect(missing, NOW, runner=FakeRunner({})).conditions
    assert gone.status is U and "not found" in gone.reason


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"node_id": ""}, "node_id"),
        ({"probes": ("xid", "gpu_magic")}, "probes"),
        ({"disk_threshold": 1.5}, "disk_threshold"),
        ({"dcgm_level": 5}, "dcgm_level"),
        ({"dcgm_timeout_s": 0}, "dcgm_timeout_s"),
    ],
)
def test_config_validation(tmp_path: Path, kw: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        config(tmp_path, **kw)
    assert info.value.path == field


def test_config_from_dict_and_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.json"
    path.write_text(
        '{"node_id": "gpu-7", "node_type": "a100", "mounts": ["/", "/scratch"],'
        ' "speed_baselines_s": {"a100": 0.02}, "probes": ["disk"]}'
    )
    cfg = AgentConfig.load(str(path), node_id="override")
    assert cfg.node_id == "override" and cfg.mounts == ("/", "/scratch")
    assert cfg.speed_baseline_s == 0.02 and cfg.probes == ("disk",)
    with pytest.raises(ValidationError, match="unknown key"):
        AgentConfig.from_dict({"node_id": "x", "mountz": ["/"]})
    with pytest.raises(ValidationError, match="list of strings"):
        AgentConfig.from_dict({"node_id": "x", "mounts": "/"})


def test_undelivered_xids_are_repeated_and_the_cursor_waits(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(fixture_text("kernel_log/kern_log_xid.log"))
    cursor = tmp_path / "cursor.json"
    cfg = config(tmp_path, probes=("xid",), xid_source=str(log), xid_cursor_path=str(cursor))
    state = AgentState()
    collect(cfg, NOW, runner=FakeRunner({}), state=state)
    with log.open("a") as handle:
        handle.write("NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=a, GPU has fallen off the bus.\n")
    (cond,) = collect(cfg, NOW + 5, runner=FakeRunner({}), state=state).conditions
    assert cond.details["xids"] == [74, 79, 95, 154]  # not delivered yet: still reported
    assert not cursor.exists()  # a restarted agent would read them again
    state.acknowledge()
    assert cursor.exists()
    (after,) = collect(cfg, NOW + 10, runner=FakeRunner({}), state=state).conditions
    assert after.status is F
    (fresh,) = collect(cfg, NOW + 15, runner=FakeRunner({}), state=AgentState()).conditions
    assert fresh.status is F  # the persisted cursor is honoured by a new agent
