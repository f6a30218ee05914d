"""The base of every event type: the frozen dataclass, its dict codec and the registry
(split out of ``events``, which re-exports it with the concrete types)."""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from shared.domain.errors import ValidationError


@dataclass(frozen=True)
class Event:
    TYPE: ClassVar[str] = ""
    SUBJECT_FIELD: ClassVar[str] = ""

    @property
    def subject(self) -> str:
        return str(getattr(self, self.SUBJECT_FIELD)) if self.SUBJECT_FIELD else ""

    @property
    def family(self) -> str:
        """The entity part of the type: one Pub/Sub topic per family."""
        return self.TYPE.split(".")[1]

    def to_dict(self) -> dict[str, Any]:
        """The fields by name, tuples as lists (all the way down)."""
        return {name: _plain(getattr(self, name))
                for name in _field_kinds(type(self))}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: type[E], data: Mapping[str, Any]) -> E:
        if not isinstance(data, Mapping):
            raise ValidationError("data", f"must be an object, got {type(data).__name__}")
        kwargs: dict[str, Any] = {}
        for name, (kind, required) in _field_kinds(cls).items():  # type: ignore[arg-type]
            if name not in data or data[name] is None:
                if required:
                    raise ValidationError(f"data.{name}", "is required")
                continue
            kwargs[name] = _coerce(data[name], kind, f"data.{name}")
        return cls(**kwargs)


E = TypeVar("E", bound=Event)


def _plain(value: Any) -> Any:
    """Tuples become lists, all the way down (a tuple of plain values, such as a JobStarted's
    2,048 node ids, is copied as it is)."""
    if isinstance(value, tuple):
        if _SCALARS.issuperset(map(type, value)):  # no tuple inside: copied in C
            return list(value)
        return [_plain(v) if isinstance(v, tuple) else v for v in value]
    return value


_SCALARS = frozenset({str, int, float, bool, type(None)})


@functools.cache
def _field_kinds(cls: type[Event]) -> dict[str, tuple[Any, bool]]:
    hints = typing.get_type_hints(cls)
    out: dict[str, tuple[Any, bool]] = {}
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out[f.name] = (hints[f.name], required)
    return out


def _coerce(value: Any, kind: Any, path: str) -> Any:
    origin = typing.get_origin(kind)
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        return _coerce(value, options[0], path)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValidationError(path, f"must be a list, got {type(value).__name__}")
        inner = typing.get_args(kind)[0]
        return tuple(_coerce(v, inner, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict or kind is dict:
        if not isinstance(value, Mapping):
            raise ValidationError(path, f"must be an object, got {type(value).__name__}")
        return dict(value)
    if kind is Any:
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValidationError(path, f"must be a number, got {value!r}")
        return float(value)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValidationError(path, f"must be an integer, got {value!r}")
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise ValidationError(path, f"must be a boolean, got {value!r}")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise ValidationError(path, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported event field type {kind!r} at {path}")


REGISTRY: dict[str, type[Event]] = {}


def register(cls: type[E]) -> type[E]:
    if not cls.TYPE or cls.TYPE in REGISTRY:
        raise ValueError(f"event type {cls.TYPE!r} is empty or registered twice")
    REGISTRY[cls.TYPE] = cls
    return cls


def event_class(type_: str) -> type[Event]:
    try:
        return REGISTRY[type_]
    except KeyError:
        raise ValidationError("type", f"unknown event type {type_!r}") from None
