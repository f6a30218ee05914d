"""The alert and recording rules are a Prometheus rules file that promtool
accepts and whose unit tests pass; the Grafana dashboard asks only for series mtc serves or
the rules record."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from services.api.serving_metrics import ServingCollector
from services.observability import metrics
from tests.serving import ROOT

RULES = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "mtc-fleet.json"


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.fail("promtool is missing: scripts/install_test_tools.sh installs it")
    return tool


def test_promtool_checks_and_tests_the_rules() -> None:
    tool = _promtool()
    check = subprocess.run([tool, "check", "rules", "mtc-rules.yml"], cwd=RULES,
                           capture_output=True, text=True, timeout=60, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([tool, "test", "rules", "mtc-rules.test.yml"], cwd=RULES,
                          capture_output=True, text=True, timeout=60, check=False)
    assert test.returncode == 0, test.stdout + test.stderr


def test_the_dashboard_uses_only_served_or_recorded_series() -> None:
    served = set(re.findall(r"^# TYPE (\w+) (\w+)", _served_text(), re.M))
    names = {n for n, _ in served} | {n + "_total" for n, t in served if t == "counter"} \
        | {n + s for n, t in served if t == "histogram" for s in ("_bucket", "_sum", "_count")}
    recorded = set(re.findall(r"record: (\S+)", (RULES / "mtc-rules.yml").read_text()))
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(mtc[:_][\w:]+)", e)}
    assert used, exprs
    assert used <= names | recorded, used - names - recorded


def _served_text() -> str:
    """What /metrics declares, from a collector over an empty store (every family is there)."""
    from shared.adapters.clock import SystemClock
    from shared.adapters.memory_store import MemoryDocStore

    reg = metrics.registry(MemoryDocStore(), SystemClock())
    reg.register(ServingCollector(_NoEndpoints()))  # type: ignore[arg-type]
    return metrics.render(reg).decode()


class _NoEndpoints:
    """The API context of a server with no endpoint: the serving families, empty."""

    @contextlib.contextmanager
    def unit(self) -> Iterator[Any]:
        class Uow:
            def records(self, *_: Any) -> list[Any]:
                return []

        yield Uow()
