"""Parse a request body into a wire message; pydantic's errors become field violations."""

from __future__ import annotations

import difflib
import typing
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


def _describe(error: Any, model: type[Message]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        loc = tuple(error["loc"])
        fields = _fields_at(model, loc[:-1])
        close = difflib.get_close_matches(str(loc[-1]), fields, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown field (not in this message){hint}"
    if kind == "missing":
        return "is required"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def _fields_at(model: type[Message], loc: tuple[int | str, ...]) -> list[str]:
    """The field names (camelCase, as clients write them) of the message at ``loc`` in
    ``model``; none where the path leaves the messages (a map, a free-form struct)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue  # a list's item: the same message type
        fields = getattr(current, "model_fields", None)
        if fields is None:
            return []
        info = next((f for name, f in fields.items() if part in (name, f.alias)), None)
        if info is None:
            return []
        current = _message_of(info.annotation)
    fields = getattr(current, "model_fields", None)
    return [f.alias or name for name, f in fields.items()] if fields else []


def _message_of(annotation: Any) -> Any:
    """The message type inside an annotation (``X | None``, ``list[X]``, ``tuple[X, ...]``)."""
    if isinstance(annotation, type) and issubclass(annotation, Message):
        return annotation
    for arg in typing.get_args(annotation):
        found = _message_of(arg)
        if found is not None:
            return found
    return None


def parse_message(model: type[M], body: Any) -> M:
    if not isinstance(body, dict):
        raise ApiError("INVALID_ARGUMENT", "(body): must be a JSON object",
                       [FieldViolation("(body)", "must be a JSON object")])
    try:
        return model.model_validate(body)
    except pydantic.ValidationError as exc:
        violations = [FieldViolation(field_path(tuple(e["loc"])), _describe(e, model))
                      for e in exc.errors()[:20]]
        first = violations[0]
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        raise ApiError("INVALID_ARGUMENT", f"{first.field}: {first.description}{more}",
                       violations) from None
