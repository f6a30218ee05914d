"""Composition over inheritance: no class in ``shared/`` stands on more than three bases of
its own (ancestors defined in ``shared``, ``services`` or ``simulator``; ``object``,
``Protocol``, ``Exception`` and third-party classes do not count). A backend built as a tower
of mixins, each file adding attributes only the top ``__init__`` sets, breaks it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import shared

MAX_OWN_BASES = 3
PROJECT = ("shared", "services", "simulator")


def own_bases(cls: type) -> list[str]:
    """The project's classes among ``cls``'s ancestors (itself excluded)."""
    return [f"{b.__module__}.{b.__qualname__}" for b in cls.__mro__[1:]
            if b.__module__.split(".")[0] in PROJECT]


def _shared_classes() -> dict[str, type]:
    found: dict[str, type] = {}
    for info in pkgutil.walk_packages(shared.__path__, "shared."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == info.name:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def test_no_class_in_shared_has_more_than_three_bases_of_its_own() -> None:
    deep = {name: own_bases(cls) for name, cls in _shared_classes().items()
            if len(own_bases(cls)) > MAX_OWN_BASES}
    assert deep == {}, f"over {MAX_OWN_BASES} bases of their own: hold collaborators instead"


def test_the_rule_sees_a_tower() -> None:
    """Four mixins stacked are caught; three are allowed."""
    class A: ...
    class B(A): ...
    class C(B): ...
    class D(C): ...
    for cls in (A, B, C, D):
        cls.__module__ = "shared.example"
    assert len(own_bases(D)) == 3
    class E(D): ...
    assert len(own_bases(E)) == 4 > MAX_OWN_BASES
