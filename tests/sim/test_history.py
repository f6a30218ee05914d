"""simulator/history.py: the three forms a recorded history comes in, read the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator import history

ROWS = [
    {"id": "a", "type": "mtc.job.started.v1", "time": 20.0,
     "data": {"job_id": "j", "attempt": 1, "node_ids": ["n1", "n2"], "resume_step": -1}},
    {"id": "b", "type": "mtc.node.health_reported.v1", "time": 10.5,
     "data": {"node_id": "n1", "observed_at": 10.5, "source": "agent",
              "conditions": [{"type": "XidError", "status": "true", "reason": "Xid 79",
                              "since": 9.0, "details": {"xids": [79], "ok": True,
                                                        "none": None}}]}},
]


def typed(value: object) -> dict[str, object]:
    """A value as the Firestore REST API types it."""
    if isinstance(value, bool):
        return {"booleanValue": value}
    if isinstance(value, int):
        return {"integerValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if value is None:
        return {"nullValue": None}
    if isinstance(value, list):
        return {"arrayValue": {"values": [typed(v) for v in value]}}
    assert isinstance(value, dict)
    return {"mapValue": {"fields": {k: typed(v) for k, v in value.items()}}}


def test_jsonl_firestore_export_and_plain_json_read_the_same(tmp_path: Path) -> None:
    jsonl = tmp_path / "events.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in [*ROWS, ROWS[0]]))  # a repeat
    export = tmp_path / "export.json"
    export.write_text(json.dumps({"documents": [
        {"name": f"projects/p/databases/(default)/documents/events/{r['id']}",
         "fields": {k: typed(v) for k, v in r.items()}} for r in ROWS]}))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(ROWS))
    want = sorted(ROWS, key=lambda r: r["time"])
    for path in (jsonl, export, plain):
        assert history.load_events(path) == want, path


def test_bad_histories_are_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(history.HistoryError, match="no such file"):
        history.load_events(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "x", "time": 1, "data": {}}\nnot json\n')
    with pytest.raises(history.HistoryError, match=":2: not JSON"):
        history.load_events(bad)
    rows = tmp_path / "rows.json"
    rows.write_text(json.dumps([{"type": "x"}]))
    with pytest.raises(history.HistoryError, match="needs type, time and data"):
        history.load_events(rows)
