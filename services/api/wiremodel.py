"""Parse a request body into a wire message; pydantic's errors become field violations."""

from __future__ import annotations

from typing import Any, TypeVar

import pydantic

from services.api.errors import ApiError, FieldViolation
from services.api.wire.proto_json import Message

M = TypeVar("M", bound=Message)


def field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not out:
            out = part
        else:
            out += f".{part}"
    return out or "(body)"


def _describe(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown field (not in this message)"
    if kind == "missing":
        return "is required"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def parse_message(model: type[M], body: Any) -> M:
    if not isinstance(body, dict):
        raise ApiError("INVALID_ARGUMENT", "(body): must be a JSON object",
                       [FieldViolation("(body)", "must be a JSON object")])
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as exc:
        violations = [FieldViolation(field_path(tuple(e["loc"])), _describe(e))
                      for e in exc.errors()[:20]]
        first = violations[0]
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        raise ApiError("INVALID_ARGUMENT", f"{first.field}: {first.description}{more}",
                       violations) from None
