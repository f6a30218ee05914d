"""List paging (AIP-158) and filtering (a subset of AIP-160) shared by every collection.

Page tokens are opaque to callers: base64 of where the page ended (the offset, or for a list
read a page at a time from the store, the last resource's key in list order) and a hash of
the filter they were issued for, so a token replayed with another filter is refused instead
of skipping items.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from services.api.errors import ApiError, invalid

T = TypeVar("T")
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
_TERM = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*(=|!=|:)\s*("(?:[^"\\]|\\.)*"|[^\s"()]+)\s*')


@dataclass(frozen=True)
class Page:
    items: list[Any]
    next_page_token: str


def _fingerprint(filter_text: str) -> str:
    return hashlib.sha256(filter_text.encode()).hexdigest()[:12]


def page_size(raw: str | None) -> int:
    if raw in (None, ""):
        return DEFAULT_PAGE_SIZE
    try:
        size = int(raw)
    except ValueError:
        raise invalid("pageSize", f"must be an integer, got {raw!r}") from None
    if size < 0:
        raise invalid("pageSize", "must not be negative")
    return min(size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def bad_token() -> ApiError:
    return invalid("pageToken", "is not a token this list returned for this filter")


def _token(fields: dict[str, Any], filter_text: str) -> str:
    raw = json.dumps({**fields, "f": _fingerprint(filter_text)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _read_token(token: str, filter_text: str, field: str) -> Any:
    """The ``field`` of a token issued for ``filter_text``; INVALID_ARGUMENT otherwise."""
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4)))
        if data["f"] != _fingerprint(filter_text):
            raise ValueError
        return data[field]
    except (ValueError, KeyError, TypeError):
        raise bad_token() from None


def paginate(items: Sequence[T], *, size: int, token: str | None, filter_text: str = "") -> Page:
    offset = 0
    if token:
        try:
            offset = int(_read_token(token, filter_text, "o"))
            if offset < 0:
                raise ValueError
        except (ValueError, TypeError, OverflowError):  # {"o": 1e999}: inf
            raise bad_token() from None
    chunk = list(items[offset:offset + size])
    end = offset + len(chunk)
    nxt = _token({"o": end}, filter_text) if end < len(items) else ""
    return Page(chunk, nxt)


def cursor_token(key: Any, filter_text: str = "") -> str:
    """A page token that resumes after ``key`` (JSON: where the page ended in the list's
    order), so a page stays where it was when resources are created or deleted."""
    return _token({"k": key}, filter_text)


def token_cursor(token: str | None, filter_text: str = "") -> Any:
    """The key a ``cursor_token`` resumes after; None without a token (the first page)."""
    return _read_token(token, filter_text, "k") if token else None


Term = tuple[str, str, str]  # (field, operator, value)


def parse_filter(text: str | None, fields: Sequence[str]) -> list[Term]:
    """``a="x" AND labels.team=y``: equality, inequality and ``:`` (has) joined by AND.
    Field names may be camelCase or snake_case; ``labels.<key>`` is always allowed."""
    if not text or not text.strip():
        return []
    allowed = {f: f for f in fields} | {_snake(f): f for f in fields}
    terms: list[Term] = []
    for part in re.split(r"\s+AND\s+", text.strip()):
        match = _TERM.fullmatch(part)
        if not match:
            raise invalid("filter", f"cannot parse {part!r}: use field=\"value\" terms joined "
                          "by AND")
        name, op, value = match.groups()
        if value.startswith('"'):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:  # "\q", "\u12": the regex lets them by
                raise invalid("filter", f"bad string {value}: {exc.msg}") from None
        if name.startswith("labels."):
            field = name
        elif name in allowed:
            field = allowed[name]
        else:
            raise invalid("filter", f"unknown field {name!r}; filterable: "
                          f"{', '.join([*fields, 'labels.<key>'])}")
        terms.append((field, op, value))
    return terms


def matches(terms: Sequence[Term], get: Callable[[str], Any]) -> bool:
    for field, op, value in terms:
        actual = get(field)
        text = "" if actual is None else str(actual)
        if op == "=" and text != value:
            return False
        if op == "!=" and text == value:
            return False
        if op == ":" and (actual is None or value not in text):
            return False
    return True


def resource_field(item: dict[str, Any], name: str) -> Any:
    """A rendered resource's field for a filter term: ``labels.<key>`` reads its labels."""
    if name.startswith("labels."):
        return item.get("labels", {}).get(name.removeprefix("labels."))
    return item.get(name)


def matches_resource(terms: Sequence[Term], item: dict[str, Any]) -> bool:
    return matches(terms, functools.partial(resource_field, item))


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)
