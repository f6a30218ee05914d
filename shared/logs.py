"""Structured logs for the ``mtc.*`` loggers: JSON lines off a terminal, the human form on one.

Every entry point (``mtc serve``, ``mtc controller``, the functions' runtime) calls
:func:`setup`. Off a terminal (a pipe, a file, Cloud Run / Cloud Functions) or with
``MTC_LOG_FORMAT=json`` each record is one JSON object per line, in the shape Cloud Logging
reads from stdout/stderr: ``severity`` (DEBUG/INFO/WARNING/ERROR/CRITICAL), ``message``,
``time`` (RFC 3339, UTC), ``logger``, and, where known, ``event_type``, ``event_id``,
``service``, ``node_id``, ``job_id``, ``cluster_id`` and ``logging.googleapis.com/trace``.
``MTC_LOG_FORMAT=text`` forces the human form.

The event fields come from the record's ``extra=`` or from the *log context*: the handler
runner (``shared.handling.run_handler``) and the functions' entry points wrap their work in
:func:`context`, so every line logged while an event is handled names it without each call
site passing it. The trace comes from the request's ``traceparent`` (W3C) or
``X-Cloud-Trace-Context`` header, or the CloudEvent's ``traceparent`` extension
(:func:`trace_id`), as ``projects/<project>/traces/<trace id>``.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, TextIO

TRACE_KEY = "logging.googleapis.com/trace"
FIELDS = ("service", "event_type", "event_id", "cluster_id", "node_id", "job_id", TRACE_KEY)
_SEVERITY = {"WARN": "WARNING", "FATAL": "CRITICAL"}
_EMPTY: Mapping[str, Any] = MappingProxyType({})
_context: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar("mtc_log_context",
                                                                            default=_EMPTY)
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")
_CLOUD_TRACE = re.compile(r"^([0-9a-fA-F]{32})(?:/\d*)?(?:;o=\d)?$")
_HANDLER_MARK = "_mtc_handler"


@contextlib.contextmanager
def context(**fields: Any) -> Iterator[None]:
    """Fields every record logged inside the block carries (empty values are left out)."""
    merged = {**_context.get(), **{k: v for k, v in fields.items() if v not in (None, "")}}
    token = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(token)


class _Deferred(Mapping[str, Any]):
    """Context fields worked out when a line is logged, not for every event handled (the
    handler runner enters one per delivery; most deliveries log nothing)."""

    __slots__ = ("_fields", "_make", "_outer")

    def __init__(self, outer: Mapping[str, Any], make: Callable[[], Mapping[str, Any]]) -> None:
        self._outer = outer
        self._make = make
        self._fields: dict[str, Any] | None = None

    def _all(self) -> dict[str, Any]:
        if self._fields is None:
            self._fields = {**self._outer, **{k: v for k, v in self._make().items()
                                              if v not in (None, "")}}
        return self._fields

    def __getitem__(self, key: str) -> Any:
        return self._all()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def enter(make: Callable[[], Mapping[str, Any]]) -> contextvars.Token[Mapping[str, Any]]:
    """What :func:`context` does, with the fields from ``make`` only if a line is logged;
    :func:`leave` with the token ends it."""
    return _context.set(_Deferred(_context.get(), make))


def leave(token: contextvars.Token[Mapping[str, Any]]) -> None:
    _context.reset(token)


def current() -> Mapping[str, Any]:
    return _context.get()


def trace_id(headers: Mapping[str, str] | None = None, extensions: Mapping[str, Any] | None = None
             ) -> str:
    """The 32-hex trace id of a request's ``traceparent`` / ``X-Cloud-Trace-Context`` header
    or a CloudEvent's ``traceparent`` extension; "" when none is well-formed."""
    candidates: list[tuple[str, re.Pattern[str]]] = []
    for source in (headers or {}), (extensions or {}):
        lowered = {str(k).lower(): str(v) for k, v in source.items()}
        if "traceparent" in lowered:
            candidates.append((lowered["traceparent"].strip().lower(), _TRACEPARENT))
        if "x-cloud-trace-context" in lowered:
            candidates.append((lowered["x-cloud-trace-context"].strip(), _CLOUD_TRACE))
    for value, pattern in candidates:
        match = pattern.match(value)
        if match and set(match.group(1)) != {"0"}:
            return match.group(1).lower()
    return ""


def trace_field(trace: str, project: str | None = None) -> str:
    """Cloud Logging's trace value: ``projects/<project>/traces/<id>`` (the bare id without a
    project)."""
    if not trace:
        return ""
    project = project if project is not None else (os.environ.get("GOOGLE_CLOUD_PROJECT")
                                                   or os.environ.get("GCP_PROJECT") or "")
    return f"projects/{project}/traces/{trace}" if project else trace


def severity(record: logging.LogRecord) -> str:
    return _SEVERITY.get(record.levelname, record.levelname)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, Cloud Logging's structured-log shape."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "severity": severity(record),
            "message": record.getMessage(),
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds").replace("+00:00", "Z"),
            "logger": record.name,
        }
        fields = {**current(), **{k: getattr(record, k) for k in FIELDS
                                  if getattr(record, k, None) not in (None, "")}}
        trace = fields.pop("trace", "")
        entry.update(fields)
        if trace and TRACE_KEY not in entry:
            entry[TRACE_KEY] = trace
        if record.exc_info:
            entry["message"] += "\n" + self.formatException(record.exc_info)
        if record.stack_info:
            entry["message"] += "\n" + self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The human form: time, level, logger, message, then the known ids."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = {**current(), **{k: getattr(record, k) for k in FIELDS
                                  if getattr(record, k, None) not in (None, "")}}
        ids = " ".join(f"{k}={fields[k]}" for k in ("event_type", "node_id", "job_id")
                       if fields.get(k))
        return f"{text}  [{ids}]" if ids else text


def wants_json(stream: TextIO, env: Mapping[str, str] | None = None) -> bool:
    """``MTC_LOG_FORMAT=json|text`` decides; otherwise JSON unless ``stream`` is a terminal."""
    choice = (os.environ if env is None else env).get("MTC_LOG_FORMAT", "").strip().lower()
    if choice in ("json", "text"):
        return choice == "json"
    isatty = getattr(stream, "isatty", None)
    try:
        return not (isatty is not None and isatty())
    except ValueError:  # a closed stream
        return True


def setup(stream: TextIO | None = None, *, level: int = logging.INFO,
          env: Mapping[str, str] | None = None) -> logging.Handler:
    """Give the ``mtc`` logger one handler on ``stream`` (stderr) in the right format.
    Idempotent: a second call replaces the handler it installed, never adds one."""
    stream = stream if stream is not None else sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter() if wants_json(stream, env) else TextFormatter())
    setattr(handler, _HANDLER_MARK, True)
    logger = logging.getLogger("mtc")
    for old in [h for h in logger.handlers if getattr(h, _HANDLER_MARK, False)]:
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return handler
