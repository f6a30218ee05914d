"""Structured logs: JSON lines off a terminal (Cloud Logging's fields), the human form on
one, the event's ids from the handler runner, the trace from headers and CloudEvents."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from shared import logs
from shared.domain.errors import PermanentError
from shared.domain.events import NodeDiagnosed
from shared.handling import run_handler
from tests.harness import CLUSTER, Plane

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def restore() -> Iterator[None]:
    logger = logging.getLogger("mtc")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_off_a_terminal_with_cloud_logging_fields(restore: None) -> None:
    stream = io.StringIO()
    logs.setup(stream, env={})
    log = logging.getLogger("mtc.test")
    log.warning("node %s is %s", "n1", "hot", extra={"node_id": "n1", "job_id": "j1"})
    with logs.context(event_type="mtc.node.diagnosed.v1", event_id="e1",
                      trace=logs.trace_field(TRACE, "p")):
        log.error("inside")
    log.debug("not at INFO")
    first, second = lines(stream)
    assert first["severity"] == "WARNING" and first["message"] == "node n1 is hot"
    assert (first["node_id"], first["job_id"], first["logger"]) == ("n1", "j1", "mtc.test")
    assert str(first["time"]).endswith("Z") and "T" in str(first["time"])
    assert second["severity"] == "ERROR" and second["event_id"] == "e1"
    assert second[logs.TRACE_KEY] == f"projects/p/traces/{TRACE}"
    assert "event_id" not in first


def test_the_human_form_on_a_terminal_and_the_environment_decides(restore: None) -> None:
    tty = Tty()
    logs.setup(tty, env={})
    logging.getLogger("mtc.test").info("hello", extra={"node_id": "n1"})
    text = tty.getvalue()
    assert "INFO" in text and "mtc.test: hello" in text and "node_id=n1" in text
    assert not text.startswith("{")
    forced = Tty()
    logs.setup(forced, env={"MTC_LOG_FORMAT": "json"})
    logging.getLogger("mtc.test").info("hello")
    assert json.loads(forced.getvalue())["message"] == "hello"
    assert tty.getvalue() == text  # setup replaced its handler, it did not add one
    assert not logs.wants_json(io.StringIO(), {"MTC_LOG_FORMAT": "text"})


def test_the_handler_runner_names_the_event_node_and_service(restore: None) -> None:
    stream = io.StringIO()
    logs.setup(stream, env={})
    plane = Plane()
    from services.job_submission import commands as job_commands

    plane.api(job_commands.create_cluster, CLUSTER)
    plane.deliver()

    def broken(event: NodeDiagnosed, uow: object, deps: object) -> None:
        logging.getLogger("mtc.test").info("looking at it")
        raise PermanentError("bad")

    env = plane.inject(NodeDiagnosed(node_id="c1-gpu-000", observed_at=plane.clock.now(),
                                     failure_mode="x", severity="critical", action="reboot"))
    run_handler("repair", broken, env, plane.deps)
    inside, dead = lines(stream)[-2:]
    for entry in (inside, dead):
        assert (entry["service"], entry["event_type"], entry["event_id"], entry["node_id"]) == (
            "repair", "mtc.node.diagnosed.v1", env.id, "c1-gpu-000")
    assert dead["severity"] == "WARNING" and "dead-lettered" in str(dead["message"])
    assert logs.current() == {}


def test_traces_from_headers_and_cloudevents() -> None:
    assert logs.trace_id({"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}) == TRACE
    assert logs.trace_id({"X-Cloud-Trace-Context": f"{TRACE.upper()}/123;o=1"}) == TRACE
    assert logs.trace_id(extensions={"traceparent": f"00-{TRACE}-00f067aa0ba902b7-01"}) == TRACE
    assert logs.trace_id({"traceparent": "garbage"}) == ""
    assert logs.trace_id({"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01"}) == ""
    assert logs.trace_field("", "p") == "" and logs.trace_field(TRACE, "") == TRACE
