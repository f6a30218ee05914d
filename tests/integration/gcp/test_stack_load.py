"""`bench/stack_load.py` for a few seconds with tiny numbers: every figure of its JSON is
there and sane, and everything it started is gone afterwards. The figures themselves are
measured by running the tool (docs/gcp.md), not here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.stack_support import pids_of, run_script

pytestmark = [pytest.mark.integration, pytest.mark.slow]

KINDS = {"list_jobs", "get_job", "list_clusters", "list_operations", "get_operation",
         "list_nodes", "create_job", "cancel_job"}


def _latencies(figures: dict[str, Any], count: int) -> None:
    p50, p99 = figures["p50_ms"], figures["p99_ms"]
    if count:
        assert 0 < p50 <= p99 < 60_000, figures
    else:
        assert p50 is None and p99 is None, figures


def test_stack_load_reports_every_figure(emulators: dict[str, str], tmp_path: Path) -> None:
    state, out = tmp_path / "load", tmp_path / "load.json"
    stdout = run_script("stack_load.py", "--nodes", "4", "--per-partition", "2", "--rates", "4",
                        "--clients", "2", "--seconds", "5", "--xid-every", "1.5",
                        "--think", "0.05", "--no-reference", "--settle", "0",
                        "--progress", "2", "--state-dir", str(state), "--out", str(out),
                        folder="bench", timeout_s=240)
    assert "report->drain" in stdout and "create_job" in stdout
    result = json.loads(out.read_text())
    assert result["nodes"] == 4 and result["cluster_ready_s"] > 0
    [phase] = result["phases"]
    assert (phase["offered_per_s"], phase["clients"], phase["seconds"]) == (4, 2, 5)

    reports = phase["reports"]
    assert 15 <= reports["published"] <= 20, reports  # 4/s for 5 s
    assert reports["handled"] == reports["published"], reports
    assert 0 < reports["handled_per_s"] <= 4 * 1.5, reports
    _latencies(reports, reports["handled"])

    drains = phase["report_to_drain"]
    assert drains["samples"] >= 2 and drains["measured"] + drains["missing"] == drains["samples"]
    assert drains["measured"] >= 1, drains
    _latencies(drains, drains["measured"])

    api = phase["api"]
    assert set(api["by_kind"]) == KINDS
    assert api["calls"] == sum(k["count"] for k in api["by_kind"].values()) > 0
    assert api["errors"] == sum(sum(k["errors"].values()) for k in api["by_kind"].values())
    assert api["retried"] == sum(k["retried"] for k in api["by_kind"].values())
    assert api["calls_per_s"] == round(api["calls"] / 5, 1)
    for kind in ("list_jobs", "list_clusters"):
        assert api["by_kind"][kind]["count"] > 0, api["by_kind"]
    for figures in (api, *api["by_kind"].values()):
        _latencies(figures, figures.get("count", api["calls"]))
    # a 4xx is the tool asking wrongly (a 5xx may be the loaded stack: counted, not failed)
    assert not [(kind, status) for kind, k in api["by_kind"].items() for status in k["errors"]
                if status.startswith("4")], api["by_kind"]

    assert len(phase["load_avg"]) == 3 and phase["load_avg"][0] >= 0
    cpu = phase["cpu_pct"]
    assert {"api", "health_triage", "pubsub", "firestore", "bench", "machine"} <= set(cpu)
    assert all(v >= 0 for v in cpu.values()) and cpu["machine"] > 0, cpu
    assert not pids_of(str(state)), "something the load test started is still running"
