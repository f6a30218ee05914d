"""The validation kit: read untrusted mappings (JSON bodies, YAML files) strictly, and name the
exact field path of whatever is wrong.

One set of helpers for every parser of user input: the API specs (``shared.domain.specs``), the
triage table (``shared.policies.triage_table``) and the simulator's scenarios
(``simulator.readers``). Every rejection is a :class:`~shared.domain.errors.ValidationError`
whose ``path`` is the field path in the document, written the way users read it:
``jobSpec.workerPoolSpecs[0].replicaCount``, ``xid.rules[3].codes``,
``failures.causes.gpu_off_bus.fix.rebot``.

Two layers:

- *value readers* check one value found at ``path``: :func:`mapping`, :func:`number`,
  :func:`integer`, :func:`boolean`, :func:`text`;
- *field getters* read ``data[key]`` under ``path``, join the key onto the path and check its
  JSON type: :func:`field`, :func:`string`, :func:`int_field`, :func:`list_field`;

plus :func:`join` (path building), :func:`only_keys` (unknown keys are an error naming the
key), :func:`required` and :func:`get` (absent and ``null`` are the same).

Pure: no I/O, nothing but ``shared.domain.errors``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from shared.domain.errors import ValidationError

T = TypeVar("T")

__all__ = [
    "ValidationError",
    "boolean",
    "field",
    "get",
    "int_field",
    "integer",
    "join",
    "kind_name",
    "list_field",
    "mapping",
    "number",
    "only_keys",
    "required",
    "string",
    "text",
]


# ---------------------------------------------------------------- paths and keys


def join(path: str, key: str | int) -> str:
    """``join("a", "b") == "a.b"``, ``join("a", 0) == "a[0]"``, ``join("", "b") == "b"``."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def only_keys(data: Mapping[str, Any], path: str, allowed: Iterable[str]) -> None:
    """Reject the first key of ``data`` not in ``allowed``, naming its full path."""
    allowed = set(allowed)
    for key in data:
        if key not in allowed:
            raise ValidationError(join(path, str(key)),
                                  f"unknown key (expected one of {', '.join(sorted(allowed))})")


def required(data: Mapping[str, Any], key: str, path: str) -> Any:
    """``data[key]``; absent or ``null`` is an error naming ``path.key``."""
    if key not in data or data[key] is None:
        raise ValidationError(join(path, key), "is required")
    return data[key]


def get(data: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """``data[key]``, or ``default`` when it is absent or ``null`` (YAML's empty value)."""
    value = data.get(key)
    return default if value is None else value


# ---------------------------------------------------------------- value readers


def mapping(value: Any, path: str, *, noun: str = "a mapping",
            optional: bool = False) -> Mapping[str, Any]:
    """``value`` as a mapping; ``None`` is an empty one when ``optional``."""
    if value is None and optional:
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError(path, f"must be {noun}, got {type(value).__name__}")
    return value


def number(value: Any, path: str, *, low: float | None = None, high: float | None = None,
           finite: bool = True) -> float:
    """An int or float (a boolean is not a number), optionally finite and in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(path, f"must be a number, got {value!r}")
    out = float(value)
    if finite and not math.isfinite(out):
        raise ValidationError(path, f"must be finite, got {value!r}")
    if low is not None and out < low:
        raise ValidationError(path, f"must be at least {low:g}, got {value!r}")
    if high is not None and out > high:
        raise ValidationError(path, f"must be at most {high:g}, got {value!r}")
    return out


def integer(value: Any, path: str, *, low: int | None = None, high: int | None = None) -> int:
    """An int (a boolean is not one), optionally in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(path, f"must be an integer, got {value!r}")
    if low is not None and value < low:
        raise ValidationError(path, f"must be at least {low}, got {value!r}")
    if high is not None and value > high:
        raise ValidationError(path, f"must be at most {high}, got {value!r}")
    return value


def boolean(value: Any, path: str) -> bool:
    """``true`` or ``false``, nothing that merely looks like one (``"yes"``, ``1``)."""
    if not isinstance(value, bool):
        raise ValidationError(path, f"must be true or false, got {value!r}")
    return value


def text(value: Any, path: str) -> str:
    """A string with something in it besides spaces."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(path, f"must be a non-empty string, got {value!r}")
    return value


# ---------------------------------------------------------------- field getters (JSON types)

_KIND_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
               list: "a list", dict: "an object"}


def kind_name(kinds: tuple[type, ...]) -> str:
    """``(int, float)`` -> ``"an integer or a number"``."""
    return " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)


def field(data: Mapping[str, Any], key: str, path: str, kind: type | tuple[type, ...], *,
          required: bool) -> Any:
    """``data[key]`` checked against the JSON type(s) ``kind``; ``None`` when absent and not
    ``required``. A boolean never passes for an integer or a number."""
    full = join(path, key)
    if key not in data or data[key] is None:
        if required:
            raise ValidationError(full, "is required")
        return None
    value = data[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise ValidationError(full, f"must be {kind_name(kinds)}, got a boolean")
    if not isinstance(value, kinds):
        raise ValidationError(full, f"must be {kind_name(kinds)}, got {type(value).__name__}")
    return value


def string(data: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> str | None:
    """A non-empty string field (``None`` when absent and not ``required``)."""
    value = field(data, key, path, str, required=required)
    if value is not None and not value.strip():
        raise ValidationError(join(path, key), "must not be empty")
    return value  # type: ignore[no-any-return]


def int_field(data: Mapping[str, Any], key: str, path: str, *, required: bool = True,
              minimum: int = 0, maximum: int | None = None, default: int = 0) -> int:
    """An integer field in ``[minimum, maximum]`` (``default`` when absent and optional)."""
    value = field(data, key, path, int, required=required)
    if value is None:
        return default
    return integer(value, join(path, key), low=minimum, high=maximum)


def list_field(data: Mapping[str, Any], key: str, path: str, parse: Callable[[Any, str], T], *,
               required: bool = True, non_empty: bool = True) -> tuple[T, ...]:
    """A list field, each item read by ``parse(item, "path.key[i]")``."""
    value = field(data, key, path, list, required=required)
    if value is None:
        return ()
    full = join(path, key)
    if non_empty and not value:
        raise ValidationError(full, "must not be empty")
    return tuple(parse(item, join(full, i)) for i, item in enumerate(value))


# ---------------------------------------------------------------- flat request bodies


def _body(data: Any) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ValidationError("", "must be an object")
    return data


def require_str(data: Any, key: str) -> str:
    """A top-level field of a request body or event: a non-empty string."""
    return text(required(_body(data), key, ""), key)


def require_number(data: Any, key: str) -> float:
    """A top-level field: a finite number."""
    return number(required(_body(data), key, ""), key)


def require_int(data: Any, key: str, *, minimum: int | None = None) -> int:
    """A top-level field: an integer, at least ``minimum`` when given."""
    return integer(required(_body(data), key, ""), key, low=minimum)
