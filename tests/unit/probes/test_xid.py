from __future__ import annotations

from pathlib import Path

import pytest

from shared.domain.health import ConditionStatus
from shared.probes.commands import ProbeError
from shared.probes.xid import (
    DmesgCursor,
    FileCursor,
    XidSource,
    parse_xid_line,
    parse_xid_lines,
    xid_condition,
)
from tests.recorded import fixture_text
from tests.unit.probes.fakes import FakeRunner, ok

NOW = 1_796_000_000.0


def test_parses_fallen_off_the_bus_with_pid_and_name() -> None:
    event = parse_xid_line(
        "[11807.002345] NVRM: Xid (PCI:0000:3b:00): 79, pid=48213, name=python3, GPU has fallen off the bus."
    )
    assert event is not None
    assert (event.xid, event.gpu, event.pid, event.process_name) == (79, "0000:3b:00", 48213, "python3")
    assert event.message == "GPU has fallen off the bus."
    assert event.recovery_action is None


def test_xid_154_gives_the_recovery_action() -> None:
    line = (
        "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) "
        "to 0x1 (GPU Reset Required)"
    )
    event = parse_xid_line(line)
    assert event is not None
    assert event.xid == 154 and event.pid is None
    assert event.recovery_action == "GPU Reset Required"
    cond = xid_condition([event], NOW)
    assert cond.status is ConditionStatus.TRUE
    assert cond.details["recovery_action"] == "GPU Reset Required"
    assert cond.details["xids"] == [154]
    assert cond.details["gpus"] == ["0000:18:00"]


def test_unknown_pid_and_odd_prefixes() -> None:
    events = parse_xid_lines(fixture_text("kernel_log/xid_odd_lines.txt").splitlines())
    assert [e.xid for e in events] == [154, 119, 45, 31]
    assert events[1].gpu == "0000:af:00"  # no "PCI:" prefix
    assert events[2].gpu == "0001:c1:00.0"  # with a function number
    assert events[2].process_name == "kworker/u256:1"
    assert events[3].message.startswith("channel 0x00000008")


@pytest.mark.parametrize(
    "line",
    [
        "",
        "NVRM: Xid (PCI:0000:65:00): ",
        "NVRM: Xid (PCI:0000:65:00): abc, pid=1, name=x, y",
        "NVRM: GPU at PCI:0000:65:00: GPU-1f2e",
        "\x00\xff garbage \ufffd",
        "Xid 79 mentioned in passing",
    ],
)
def test_garbage_lines_are_not_xids(line: str) -> None:
    assert parse_xid_line(line) is None


def test_dmesg_excerpt() -> None:
    lines = fixture_text("kernel_log/dmesg_xid.txt").splitlines()
    events = parse_xid_lines(lines)
    assert [e.xid for e in events] == [13, 13, 48, 63, 79, 154]
    assert events[2].pid is None and events[2].process_name is None  # pid='<unknown>'
    cond = xid_condition(events, NOW)
    assert cond.details["xids"] == [13, 48, 63, 79, 154]
    assert cond.details["gpus"] == ["0000:18:00", "0000:3b:00"]
    assert cond.details["recovery_action"] == "Node Reboot Required"
    assert cond.details["count"] == 6


def test_no_events_is_healthy() -> None:
    cond = xid_condition([], NOW)
    assert cond.status is ConditionStatus.FALSE
    assert cond.details == {"xids": [], "gpus": []}


def test_file_cursor_reports_each_xid_once(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(fixture_text("kernel_log/kern_log_xid.log"))
    source = XidSource(str(log))
    runner = FakeRunner({})
    assert [e.xid for e in source.read_new(runner)] == [154, 95, 74]
    assert source.read_new(runner) == []
    with log.open("a") as handle:
        handle.write(
            "Nov 30 08:10:00 n kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=a, "
            "GPU has fallen off the bus.\n"
        )
        handle.write("Nov 30 08:10:00 n kernel: NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=a, half a li")
    assert [e.xid for e in source.read_new(runner)] == [79]  # the unfinished line waits
    with log.open("a") as handle:
        handle.write("ne\n")
    assert [e.xid for e in source.read_new(runner)] == [48]
    assert runner.calls == []  # a file source never shells out


def test_file_cursor_restarts_after_rotation(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n" * 3)
    cursor = FileCursor(str(log))
    assert len(cursor.read_new_lines()) == 3
    log.write_text("NVRM: Xid (PCI:0000:18:00): 74, NVLink\n")  # truncated and rewritten
    assert parse_xid_lines(cursor.read_new_lines())[0].xid == 74


def test_cursor_file_survives_agent_restart(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(fixture_text("kernel_log/kern_log_xid.log"))
    cursor_file = tmp_path / "state" / "xid-cursor.json"
    assert len(XidSource(str(log), cursor_path=str(cursor_file)).read_new(FakeRunner({}))) == 3
    assert XidSource(str(log), cursor_path=str(cursor_file)).read_new(FakeRunner({})) == []


def test_corrupt_cursor_file_rereads_rather_than_crashes(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(fixture_text("kernel_log/kern_log_xid.log"))
    cursor_file = tmp_path / "cursor.json"
    cursor_file.write_text("{not json")
    assert len(XidSource(str(log), cursor_path=str(cursor_file)).read_new(FakeRunner({}))) == 3


def test_missing_log_file_is_a_probe_error(tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match="not found"):
        XidSource(str(tmp_path / "nope.log")).read_new(FakeRunner({}))


def test_dmesg_cursor_by_timestamp_and_boot() -> None:
    text = fixture_text("kernel_log/dmesg_xid.txt")
    cursor = DmesgCursor()
    assert len(parse_xid_lines(cursor.new_lines(text, "boot-a"))) == 6
    assert cursor.new_lines(text, "boot-a") == []
    more = text + "[12000.000001] NVRM: Xid (PCI:0000:18:00): 74, pid=1, name=a, NVLink\n"
    assert [e.xid for e in parse_xid_lines(cursor.new_lines(more, "boot-a"))] == [74]
    # After a reboot the ring buffer starts again at 0 s: everything is new.
    assert len(parse_xid_lines(cursor.new_lines(text, "boot-b"))) == 6


def test_dmesg_source_runs_dmesg_with_a_timeout() -> None:
    runner = FakeRunner({"dmesg": ok(fixture_text("kernel_log/dmesg_xid.txt"))})
    source = XidSource("dmesg", timeout_s=7.0)
    assert len(source.read_new(runner)) == 6
    assert source.read_new(runner) == []
    assert runner.calls[0] == (("dmesg",), 7.0)


def test_dmesg_failure_is_a_probe_error() -> None:
    runner = FakeRunner({"dmesg": ok("", 1, "dmesg: read kernel buffer failed: Operation not permitted")})
    with pytest.raises(ProbeError, match="Operation not permitted"):
        XidSource("dmesg").read_new(runner)
