"""Composition over inheritance: no class in ``shared/``, ``simulator/``, ``bench/`` or
``examples/`` stands on more than three bases of its own (ancestors defined in the project:
``shared``, ``services``, ``simulator``, the SDK, ``bench``, ``examples``; ``object``,
``Protocol``, ``Exception`` and third-party classes do not count). A backend built as a tower
of mixins, each file adding attributes only the top ``__init__`` sets, breaks it."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

import shared
import simulator

MAX_OWN_BASES = 3
PROJECT = ("shared", "services", "simulator", "mtc_program", "bench", "examples")
ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = ("bench", "examples")  # folders of scripts, not packages


def own_bases(cls: type) -> list[str]:
    """The project's classes among ``cls``'s ancestors (itself excluded)."""
    return [f"{b.__module__}.{b.__qualname__}" for b in cls.__mro__[1:]
            if b.__module__.split(".")[0] in PROJECT]


def _classes_of(names: list[str]) -> dict[str, type]:
    found: dict[str, type] = {}
    for name in names:
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name:
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def _package_modules(package: ModuleType) -> list[str]:
    """The package's modules, but ``__main__`` (importing it runs the command)."""
    return [info.name for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")
            if not info.name.endswith(".__main__")]


def _script_modules(folder: str) -> list[str]:
    """The folder's scripts that define a class (the others cannot hold a deep one, and need
    not be imported: some import torch)."""
    return [f"{folder}.{p.stem}" for p in sorted((ROOT / folder).glob("*.py"))
            if any(isinstance(n, ast.ClassDef) for n in ast.walk(ast.parse(p.read_text())))]


def _deep(classes: dict[str, type]) -> dict[str, list[str]]:
    return {name: own_bases(cls) for name, cls in classes.items()
            if len(own_bases(cls)) > MAX_OWN_BASES}


@pytest.mark.parametrize("package", [shared, simulator], ids=["shared", "simulator"])
def test_no_package_class_has_more_than_three_bases_of_its_own(package: ModuleType) -> None:
    deep = _deep(_classes_of(_package_modules(package)))
    assert deep == {}, f"over {MAX_OWN_BASES} bases of their own: hold collaborators instead"


@pytest.mark.parametrize("folder", SCRIPTS)
def test_no_script_class_has_more_than_three_bases_of_its_own(folder: str) -> None:
    path = list(sys.path)  # scripts put their own folders on the path: restored after
    try:
        modules = _script_modules(folder)
        assert modules, f"{folder}/ defines no class: the rule would see nothing"
        deep = _deep(_classes_of(modules))
    finally:
        sys.path[:] = path
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
