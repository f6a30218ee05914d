"""The event registry and payload validation: bad events are permanent errors."""

from __future__ import annotations

import dataclasses
import inspect
import types
from typing import Any

import pytest

from shared.domain.errors import PermanentError, ValidationError
from shared.domain.events import REGISTRY, NodeDiagnosed, NodeHealthReported, event_class
from shared.domain.health import Diagnosis, FailureRecord, HealthReport


def test_every_type_is_versioned_and_named_after_its_entity() -> None:
    for type_, cls in REGISTRY.items():
        parts = type_.split(".")
        assert parts[0] == "mtc" and parts[-1] == "v1" and len(parts) == 4, type_
        assert type_ == cls.TYPE


def test_round_trip_and_unknown_fields_are_ignored() -> None:
    event = NodeDiagnosed(node_id="n", observed_at=1.0, failure_mode="m", severity="critical",
                          action="reboot", reasons=("a",), unmapped_xids=(999,))
    data = {**event.to_dict(), "added_in_a_later_minor": 1}
    assert NodeDiagnosed.from_dict(data) == event


@pytest.mark.parametrize(("data", "field"), [
    ({"observed_at": 1.0, "conditions": []}, "data.node_id"),
    ({"node_id": "n", "observed_at": "yesterday", "conditions": []}, "data.observed_at"),
    ({"node_id": "n", "observed_at": 1.0, "conditions": {}}, "data.conditions"),
    ({"node_id": "n", "observed_at": 1.0, "conditions": [3]}, "data.conditions[0]"),
    ({"node_id": 5, "observed_at": 1.0, "conditions": []}, "data.node_id"),
])
def test_bad_payloads_name_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        NodeHealthReported.from_dict(data)
    assert err.value.path == field
    assert isinstance(err.value, PermanentError)


def test_unknown_type_is_a_permanent_error() -> None:
    with pytest.raises(ValidationError, match="unknown event type"):
        event_class("mtc.node.exploded.v1")


def test_every_type_is_built_as_its_dataclass_would_build_it() -> None:
    """Each event type (and the report, failure record and diagnosis) is a plain frozen
    dataclass: the dataclass's own ``__init__`` (parameters and defaults), frozen, equal."""
    for cls in [*REGISTRY.values(), HealthReport, FailureRecord, Diagnosis]:
        fields = dataclasses.fields(cls)
        expected = dataclasses.dataclass(frozen=True)(
            type(cls.__name__, (), {"__annotations__": {f.name: f.type for f in fields},
                                    **{f.name: f.default for f in fields
                                       if f.default is not dataclasses.MISSING}})).__init__
        assert _params(cls.__init__) == _params(expected), cls.__name__
    event = NodeHealthReported("n", 1.0, ({"type": "XidError"},))
    assert event == NodeHealthReported(node_id="n", observed_at=1.0,
                                       conditions=({"type": "XidError"},), source="agent")
    assert dataclasses.replace(event, source="x").source == "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.node_id = "m"  # type: ignore[misc]
    with pytest.raises(TypeError, match="observed_at"):
        NodeHealthReported(node_id="n")  # type: ignore[call-arg]


def _params(init: object) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default)
            for p in inspect.signature(init).parameters.values()]  # type: ignore[arg-type]


def test_every_type_encodes_as_the_generic_encoder_does() -> None:
    """Every type encodes with the one ``Event.to_dict``: the fields in order, tuples as lists
    all the way down, for values of each declared kind and for tuples where a plain value
    was declared."""
    import typing

    from shared.domain.event_base import Event, _field_kinds

    def sample(kind: Any, i: int) -> Any:
        origin = typing.get_origin(kind)
        if origin in (types.UnionType, typing.Union):
            return None if i % 2 else sample(typing.get_args(kind)[0], i)
        if origin is tuple:
            return ("a", ("b", ("c",)), {"k": 1}) if i % 3 == 0 else ("a", "b")
        if origin is dict or kind is dict:
            return {"k": (1, 2)}
        return {str: "x", float: 1.5, int: 2, bool: True}.get(kind, ("any", ("thing",)))

    for cls in REGISTRY.values():
        assert cls.to_dict is Event.to_dict, cls.__name__
        kinds = _field_kinds(cls)
        for shift in range(3):
            event = cls(**{name: sample(kind, i + shift)
                           for i, (name, (kind, _)) in enumerate(kinds.items())})
            doc = event.to_dict()
            assert list(doc) == [f.name for f in dataclasses.fields(cls)], cls.__name__
            assert doc == {f.name: _lists(getattr(event, f.name))
                           for f in dataclasses.fields(cls)}, cls.__name__
            # a tuple where a plain value was declared is still turned into a list
            first = next(iter(kinds))
            odd = dataclasses.replace(event, **{first: ("p", ("q",))})
            assert odd.to_dict() == Event.to_dict(odd) and odd.to_dict()[first] == ["p", ["q"]]


def _lists(value: Any) -> Any:
    return [_lists(v) for v in value] if isinstance(value, tuple) else value
