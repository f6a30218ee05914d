"""Delivery settings, the token file rule and the wire shapes the transports send."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from services.node_agent.cli import build_parser, load_delivery
from services.node_agent.spool import SpooledReport
from services.node_agent.transports import (
    DeliveryConfig,
    api_body,
    cloudevent_attributes,
    read_token,
)
from shared.domain.errors import ValidationError

AT = 1_796_000_000.5
REPORT = SpooledReport(1, "e-1", "n1", AT, {
    "node_id": "n1", "observed_at": AT, "source": "agent",
    "conditions": [{"type": "XidError", "status": "true", "reason": "XID 79", "since": AT - 5,
                    "details": {"xids": [79]}}]})


@pytest.mark.parametrize(("data", "field"), [
    ({"transport": "kafka"}, "delivery.transport"),
    ({"transport": "api", "api_url": "http://x", "cluster": "c"}, "delivery.token_file"),
    ({"transport": "url"}, "delivery.url"),
    ({"spool": "/x"}, "delivery.spool"),
    ({"timeout_s": 0}, "delivery.timeout_s"),
])
def test_bad_delivery_settings_name_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        DeliveryConfig.from_dict(data)
    assert err.value.path == field


def test_the_config_file_delivery_object_and_spool_flag(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.json"
    cfg.write_text(json.dumps({"node_id": "n1", "delivery": {"transport": "pubsub",
                                                             "project": "p"}}))
    args = build_parser().parse_args(["--once", "--config", str(cfg), "--spool", "/s.db"])
    delivery = load_delivery(args)
    assert (delivery.transport, delivery.project, delivery.topic, delivery.spool_path) == (
        "pubsub", "p", "mtc-node", "/s.db")


def test_the_token_file_must_be_private(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret\n")
    token.chmod(0o640)
    with pytest.raises(PermissionError, match="chmod 600"):
        read_token(str(token))
    token.chmod(0o600)
    assert read_token(str(token)) == "secret"


def test_every_transport_carries_the_observation_time_and_the_event_id() -> None:
    attrs = cloudevent_attributes(REPORT)
    assert attrs["id"] == "e-1" and attrs["source"] == "//mtc/node-agent/n1"
    assert dt.datetime.fromisoformat(attrs["time"]).timestamp() == AT
    body = api_body(REPORT)
    assert body["reportId"] == "e-1"
    assert dt.datetime.fromisoformat(body["observedAt"]).timestamp() == AT
    [cond] = body["conditions"]
    assert cond["status"] == "TRUE" and cond["details"] == {"xids": [79]}
    assert dt.datetime.fromisoformat(cond["since"]).timestamp() == AT - 5


def test_spool_status_prints_the_counters(tmp_path: Path) -> None:
    import io

    from services.node_agent.cli import main
    from services.node_agent.spool import Spool

    spool = Spool(tmp_path / "s.db", max_reports=2)
    for i in range(3):
        spool.append(f"e{i}", {"node_id": "n1", "observed_at": float(i), "source": "agent",
                               "conditions": [{"type": "XidError", "status": "true",
                                               "reason": f"XID {i}"}]})
    out = io.StringIO()
    assert main(["--spool-status", "--node-id", "n1", "--spool", str(tmp_path / "s.db")],
                stdout=out) == 0
    stats = json.loads(out.getvalue())
    assert (stats["queued"], stats["dropped"], stats["spooled"]) == (2, 1, 3)
    assert main(["--spool-status", "--node-id", "n1"], stdout=io.StringIO()) == 2
