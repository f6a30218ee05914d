"""A recorded event history, read from wherever it was kept, as event-log rows.

The rows are what the event log and the twin keep: dicts with ``type`` (the CloudEvent type),
``time`` (epoch seconds), ``data`` (the event's ``to_dict()``) and, where known, ``id``. Three
sources are read:

- an embedded store: a state directory (``mtc serve --state-dir``) or its ``mtc.db``: the
  ``events`` collection of the sqlite store;
- a Firestore export as JSON: the documents of the ``events`` collection as the Firestore REST
  API returns them (``{"documents": [{"name": ..., "fields": {...typed values...}}]}``, or a
  list of such documents), or already plain (a list of event-log documents);
- ``mtc sim run --events`` output: ``events.jsonl``, one row per line.

The event log keeps one entry per handler outcome, so an event can appear more than once:
rows are deduplicated by their ``id`` and returned in time order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["HistoryError", "from_firestore", "load_events"]


class HistoryError(ValueError):
    """The file is not an event history this module reads (the message says why)."""


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The rows of the history at ``path`` (see the module docstring), oldest first."""
    p = Path(path)
    if p.is_dir():
        p = p / "mtc.db"
    if not p.exists():
        raise HistoryError(f"{path}: no such file or state directory")
    if p.suffix == ".db" or _is_sqlite(p):
        return _dedupe(_from_sqlite(p))
    text = p.read_text()
    if p.suffix == ".jsonl" or (text.lstrip().startswith("{") and "\n{" in text.strip()):
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise HistoryError(f"{path}:{n}: not JSON ({exc.msg})") from None
        return _dedupe(rows)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HistoryError(f"{path}: not JSON ({exc.msg})") from None
    return _dedupe(from_firestore(data))


def _is_sqlite(p: Path) -> bool:
    with p.open("rb") as fh:
        return fh.read(16) == b"SQLite format 3\x00"


def _from_sqlite(p: Path) -> list[dict[str, Any]]:
    from shared.adapters.docstore import DocEventLog
    from shared.adapters.sqlite_store import SqliteDocStore

    return list(DocEventLog(SqliteDocStore(p)).read())


def from_firestore(data: Any) -> list[dict[str, Any]]:
    """Event-log documents from a Firestore REST export (typed values) or plain documents."""
    docs = data.get("documents", data) if isinstance(data, Mapping) else data
    if not isinstance(docs, list):
        raise HistoryError("expected a list of documents or {\"documents\": [...]}")
    out = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, Mapping):
            raise HistoryError(f"documents[{i}]: not an object")
        plain = {k: _value(v) for k, v in doc["fields"].items()} if "fields" in doc else dict(doc)
        out.append(plain)
    return out


def _value(v: Mapping[str, Any]) -> Any:
    """One Firestore typed value (REST ``Value``) as plain JSON."""
    if "mapValue" in v:
        return {k: _value(x) for k, x in (v["mapValue"].get("fields") or {}).items()}
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values") or []]
    if "integerValue" in v:
        return int(v["integerValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    for key in ("stringValue", "booleanValue", "timestampValue", "referenceValue"):
        if key in v:
            return v[key]
    if "nullValue" in v:
        return None
    raise HistoryError(f"unknown Firestore value {sorted(v)}")


def _dedupe(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    seen: set[str] = set()
    out = []
    for n, row in enumerate(rows):
        if not isinstance(row, Mapping) or not {"type", "time", "data"} <= set(row):
            raise HistoryError(f"row {n}: needs type, time and data")
        key = str(row.get("id") or "")
        if key:
            if key in seen:
                continue
            seen.add(key)
        out.append({"type": row["type"], "time": float(row["time"]), "data": row["data"],
                    **({"id": key} if key else {})})
    out.sort(key=lambda r: r["time"])
    return out
