"""Recorded tool outputs (tests/fixtures, sources in tests/fixtures/SOURCES.md), read by name."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def fixture_text(relative: str) -> str:
    return (FIXTURES / relative).read_text(encoding="utf-8")
