from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from cloudevents.conversion import to_binary
from cloudevents.http import CloudEvent, from_http

from services.node_agent.cli import main
from services.node_agent.publish import EVENT_TYPE, http_publisher, report_to_cloudevent
from shared.domain.health import Condition, ConditionStatus, HealthReport
from tests.recorded import fixture_text
from tests.unit.probes.fakes import FakeRunner, ok

NOW = 1_796_000_000.0
XID_79 = (
    "Nov 30 08:10:00 n kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=a, GPU has fallen off the bus.\n"
)


def report() -> HealthReport:
    cond = Condition("XidError", ConditionStatus.TRUE, "XID 79", NOW, {"xids": [79], "gpus": ["0000:3b:00"]})
    return HealthReport("n1", NOW, (cond,))


def test_cloudevent_shape_and_binary_round_trip() -> None:
    event = report_to_cloudevent(report(), event_id="e-1")
    assert event["type"] == EVENT_TYPE == "mtc.node.health_reported.v1"
    assert event["source"] == "//mtc/node-agent/n1"
    assert event["id"] == "e-1" and event["subject"] == "n1"
    assert event.data == {
        "node_id": "n1",
        "observed_at": NOW,
        "source": "agent",
        "conditions": [
            {
                "type": "XidError",
                "status": "true",
                "reason": "XID 79",
                "since": NOW,
                "details": {"xids": [79], "gpus": ["0000:3b:00"]},
            }
        ],
    }
    headers, body = to_binary(event)
    assert headers["ce-type"] == EVENT_TYPE and headers["content-type"] == "application/json"
    again = from_http(headers, body)
    assert again.data == event.data and again["source"] == event["source"]


class FakeResponse:
    def __init__(self, status: int) -> None:
        self.status = status

    def raise_for_status(self) -> None:
        if self.status >= 400:
            raise RuntimeError(f"HTTP {self.status}")


class FakeSession:
    def __init__(self, status: int = 204) -> None:
        self.status = status
        self.posts: list[dict[str, Any]] = []

    def post(self, url: str, **kw: Any) -> FakeResponse:
        self.posts.append({"url": url, **kw})
        return FakeResponse(self.status)


def test_http_publisher_posts_binary_mode() -> None:
    session = FakeSession()
    publish = http_publisher("http://127.0.0.1:9/events", timeout_s=3.0, session=session)  # type: ignore[arg-type]
    publish(report_to_cloudevent(report()))
    (post,) = session.posts
    assert post["url"] == "http://127.0.0.1:9/events" and post["timeout"] == 3.0
    assert post["headers"]["ce-source"] == "//mtc/node-agent/n1"
    assert json.loads(post["data"])["node_id"] == "n1"
    failing = http_publisher("http://x", session=FakeSession(500))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        failing(report_to_cloudevent(report()))


# --------------------------------------------------------------------------- CLI


def run_cli(argv: list[str], **kw: Any) -> tuple[int, list[dict[str, Any]]]:
    out = io.StringIO()
    runner = kw.pop("runner", FakeRunner({"nvidia-smi": ok(fixture_text("nvidia_smi/h100_healthy.xml"))}))
    code = main(argv, runner=runner, clock=lambda: NOW, stdout=out, **kw)
    return code, [json.loads(line) for line in out.getvalue().splitlines()]


def test_once_prints_the_report_and_publishes(tmp_path: Path) -> None:
    events: list[CloudEvent] = []
    urls: list[str] = []

    def factory(url: str):  # type: ignore[no-untyped-def]
        urls.append(url)
        return events.append

    code, printed = run_cli(
        [
            "--once",
            "--node-id",
            "n7",
            "--skip",
            "xid,dcgm,speed",
            "--mount",
            "/",
            "--publish-url",
            "http://sink",
        ],
        publish_factory=factory,
    )
    assert code == 0 and urls == ["http://sink"]
    (doc,) = printed
    assert doc["node_id"] == "n7" and doc["source"] == "agent" and doc["observed_at"] == NOW
    assert [c["type"] for c in doc["conditions"]] == [
        "EccUncorrectable",
        "RowRemapFailure",
        "ThermalThrottling",
        "DiskPressure",
    ]
    (event,) = events
    assert event["source"] == "//mtc/node-agent/n7" and event.data == doc


def test_interval_loops_and_survives_publish_failures() -> None:
    sleeps: list[float] = []

    def failing_publish(event: CloudEvent) -> None:
        raise ConnectionError("sink down")

    code, printed = run_cli(
        [
            "--interval",
            "30",
            "--node-id",
            "n1",
            "--skip",
            "xid,nvidia_smi,dcgm,speed",
            "--publish-url",
            "http://x",
        ],
        publish_factory=lambda url: failing_publish,
        sleep=sleeps.append,
        max_iterations=3,
    )
    assert code == 0 and len(printed) == 3 and sleeps == [30.0, 30.0]


def test_bad_config_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "agent.json"
    bad.write_text('{"node_id": "x", "bogus": 1}')
    assert run_cli(["--once", "--config", str(bad)])[0] == 2
    assert run_cli(["--once", "--node-id", "x", "--skip", "warp_drive"])[0] == 2


class FakeDrainer:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.drained: list[tuple[str, str]] = []
        self.slurm_conf: str | None = None

    def drain(self, node: str, reason: str) -> None:
        if self.fail:
            raise RuntimeError("scontrol exploded")
        self.drained.append((node, reason))


def healthcheck(
    tmp_path: Path, log_text: str, drainer: FakeDrainer, *extra: str, env: dict[str, str] | None = None
) -> int:
    log = tmp_path / "kern.log"
    log.write_text(log_text)
    argv = [
        "--slurm-healthcheck",
        "--xid-source",
        str(log),
        "--xid-cursor",
        str(tmp_path / "cursor.json"),
        "--skip",
        "nvidia_smi,dcgm,speed,disk",
        *extra,
    ]
    code, _ = run_cli(
        argv,
        environ={"SLURMD_NODENAME": "n3"} if env is None else env,
        drainer_factory=lambda conf: drainer,
    )
    return code


def test_healthcheck_drains_the_node_on_a_fault(tmp_path: Path) -> None:
    drainer = FakeDrainer()
    assert healthcheck(tmp_path, XID_79, drainer, "--drain-on-fault") == 0
    ((node, reason),) = drainer.drained
    assert node == "n3"
    assert reason.startswith("mtc-agent XidError: XID 79 on 0000:3b:00")
    # The XID was reported once: the next health check finds nothing new and drains nothing.
    assert healthcheck(tmp_path, XID_79, drainer, "--drain-on-fault") == 0
    assert len(drainer.drained) == 1


def test_healthcheck_without_drain_flag_or_fault_does_not_drain(tmp_path: Path) -> None:
    drainer = FakeDrainer()
    assert healthcheck(tmp_path, XID_79, drainer) == 0
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    assert healthcheck(quiet, "quiet log\n", drainer, "--drain-on-fault") == 0
    assert drainer.drained == []


def test_a_failed_drain_is_retried_by_the_next_health_check(tmp_path: Path) -> None:
    assert healthcheck(tmp_path, XID_79, FakeDrainer(fail=True), "--drain-on-fault") == 0
    drainer = FakeDrainer()
    assert healthcheck(tmp_path, XID_79, drainer, "--drain-on-fault") == 0
    assert [node for node, _ in drainer.drained] == ["n3"]


def test_a_failed_publish_repeats_the_xid(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(XID_79)
    calls: list[CloudEvent] = []

    def flaky(event: CloudEvent) -> None:
        calls.append(event)
        if len(calls) == 1:
            raise ConnectionError("sink down")

    argv = ["--interval", "5", "--node-id", "n1", "--skip", "nvidia_smi,dcgm,speed,disk"]
    argv += ["--xid-source", str(log), "--publish-url", "http://sink"]
    code, printed = run_cli(argv, publish_factory=lambda url: flaky, sleep=lambda s: None, max_iterations=3)
    assert code == 0
    assert [d["conditions"][0]["status"] for d in printed] == ["true", "true", "false"]


def test_healthcheck_always_exits_0(tmp_path: Path) -> None:
    assert healthcheck(tmp_path, XID_79, FakeDrainer(fail=True), "--drain-on-fault") == 0
    no_env = FakeDrainer()
    assert healthcheck(tmp_path, XID_79, no_env, "--drain-on-fault", env={}) == 0
    assert no_env.drained == []


def test_unknown_conditions_do_not_drain(tmp_path: Path) -> None:
    drainer = FakeDrainer()
    argv = ["--slurm-healthcheck", "--drain-on-fault", "--skip", "xid,dcgm,speed,disk"]
    code, printed = run_cli(
        argv,
        runner=FakeRunner({}),  # nvidia-smi missing: unknown
        environ={"SLURMD_NODENAME": "n2"},
        drainer_factory=lambda conf: drainer,
    )
    assert code == 0 and drainer.drained == []
    assert {c["status"] for c in printed[0]["conditions"]} == {"unknown"}
