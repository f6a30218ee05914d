"""Test modules outside a package are imported by their base name (pytest's default import
mode), so two of them with one name stop the whole session's collection."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def test_no_two_test_modules_outside_packages_share_a_name() -> None:
    seen: defaultdict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if "__pycache__" not in path.parts and not (path.parent / "__init__.py").exists():
            seen[path.name].append(str(path.relative_to(TESTS)))
    assert not {n: p for n, p in seen.items() if len(p) > 1}
