"""Request bodies: bounded (1 MiB), UTF-8 JSON objects no deeper than 32 levels, no NUL.

Anything else is a 400 naming ``(body)`` (or a 413), in ``google.rpc.Status`` form, never a
500: a handler gets a dict it can hand to a wire model's parser.
"""

from __future__ import annotations

import json
from typing import Any

import flask
from werkzeug.exceptions import RequestEntityTooLarge

from services.api.errors import ApiError, FieldViolation

MAX_BODY_BYTES = 1 << 20
MAX_DEPTH = 32


def read_body(request: flask.Request, *, required: bool = True) -> dict[str, Any]:
    """The body as a JSON object; ``{}`` when it is empty and not ``required``."""
    try:
        raw = request.get_data(cache=True)
    except RequestEntityTooLarge:
        raise too_large() from None
    if len(raw) > MAX_BODY_BYTES:
        raise too_large()
    if not raw.strip():
        if required:
            raise _bad_body("a JSON object is required")
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad_body(f"is not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad_body(f"is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
                        ) from None
    except RecursionError:
        raise _bad_body(f"nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise _bad_body(f"is not JSON: {exc}") from None
    if _depth(value) > MAX_DEPTH:
        raise _bad_body(f"nests deeper than {MAX_DEPTH} levels")
    if not isinstance(value, dict):
        raise _bad_body("must be a JSON object")
    return value


def audit_reason(request: flask.Request) -> str:
    """The body's ``reason`` (an operator's command), for the audit record; "" when none."""
    try:
        body = json.loads(request.get_data(cache=True) or b"{}")
    except (ValueError, RecursionError, RequestEntityTooLarge):  # the call itself said 400
        return ""
    reason = body.get("reason") if isinstance(body, dict) else None
    return reason[:512] if isinstance(reason, str) else ""


def too_large() -> ApiError:
    return ApiError("RESOURCE_EXHAUSTED", f"the request body is larger than {MAX_BODY_BYTES} "
                    "bytes", http=413)


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        if isinstance(item, str) and "\x00" in item:
            raise _bad_body("holds a NUL character in a string")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
            if any("\x00" in k for k in item):
                raise _bad_body("holds a NUL character in a field name")
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def _bad_body(reason: str) -> ApiError:
    return ApiError("INVALID_ARGUMENT", f"(body): {reason}", [FieldViolation("(body)", reason)])
