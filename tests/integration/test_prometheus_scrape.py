"""The real Prometheus server scrapes a real `mtc serve`: after an XID 79 on a running job's
node, PromQL over what it scraped shows the nodes by state and the fault-to-drain histogram.
Prometheus is /usr/bin/prometheus (scripts/install_test_tools.sh installs it)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.cli_support import job_body
from tests.serving import PARENT, ROOT, create_cluster, free_port, mtc_serve, wait_until

PROMETHEUS = Path("/usr/bin/prometheus")
TOKEN = "prometheus-scrape-test-token"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not PROMETHEUS.exists(), reason="/usr/bin/prometheus is missing: run "
                       "scripts/install_test_tools.sh (.ci/run does)"),
]


@contextmanager
def prometheus(tmp: Path, target: str, token: str) -> Iterator[str]:
    """Prometheus scraping ``target`` with ``token``, from a file as docs/observability.md
    shows (``/metrics`` needs one on loopback too)."""
    port = free_port()
    token_file = tmp / "mtc-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    config = tmp / "prometheus.yml"
    config.write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "mtc", "metrics_path": "/metrics",
                            "authorization": {"type": "Bearer",
                                              "credentials_file": str(token_file)},
                            "static_configs": [{"targets": [target]}]}],
    }))
    log = open(tmp / "prometheus.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        # its query API answers 503 "Service Unavailable" until the TSDB is open
        wait_for("Prometheus ready", lambda: _ready(url), timeout_s=120.0)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/-/ready", timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


def query(prom: str, promql: str) -> list[dict[str, Any]]:
    try:
        resp = requests.get(f"{prom}/api/v1/query", params={"query": promql}, timeout=5)
    except requests.ConnectionError:
        return []
    body = resp.json()
    assert body["status"] == "success", body
    return body["data"]["result"]  # type: ignore[no-any-return]


def scalar(prom: str, promql: str) -> float | None:
    result = query(prom, promql)
    return float(result[0]["value"][1]) if result else None


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 60.0) -> Any:
    return wait_until(what, check, timeout_s, interval_s=0.5)


def test_prometheus_scrapes_nodes_and_fault_to_drain(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with mtc_serve(state, TOKEN) as url:
        create_cluster(url, TOKEN, "c1", workers=3)
        body = job_body(4000, "c1", step_time=0.05)
        body["jobSpec"]["scheduling"]["mtcPartition"] = "gpu"
        resp = requests.post(f"{url}/v1/{PARENT}/customJobs", params={"customJobId": "j1"},
                             json=body, headers=headers, timeout=30)
        assert resp.status_code == 200, resp.text

        def running_nodes() -> list[str]:
            job = requests.get(f"{url}/v1/{PARENT}/customJobs/j1", headers=headers,
                               timeout=30).json()
            nodes = (job.get("mtcProgress") or {}).get("nodes") or []
            return [n if isinstance(n, str) else n.get("nodeId", n.get("id", "")) for n in nodes] \
                if job["state"] == "JOB_STATE_RUNNING" else []

        victim = wait_for("the job to run", running_nodes)[0]
        fault = subprocess.run(
            [sys.executable, "-m", "services.cli.main", "--state-dir", str(state), "node",
             "fault", victim, "--xid", "79"], cwd=ROOT, capture_output=True, text=True,
            timeout=60)
        assert fault.returncode == 0, fault.stderr
        target = url.removeprefix("http://")
        with prometheus(tmp_path, target, TOKEN) as prom:
            wait_for("up == 1", lambda: scalar(prom, 'up{job="mtc"}') == 1.0)
            wait_for("one fault drained",
                     lambda: scalar(prom, "mtc_fault_to_drain_seconds_count") == 1.0)
            wait_for("the job resumed",
                     lambda: scalar(prom, "mtc_fault_to_resumed_seconds_count") == 1.0)
            wait_for("two nodes allocated again",
                     lambda: scalar(prom, 'sum(mtc_nodes{cluster="c1",state="allocated"})') == 2)
            workers = query(prom, 'mtc_nodes{cluster="c1",partition="gpu"}')
            assert sum(float(r["value"][1]) for r in workers) == 3
            # over the cumulative buckets (the fault may predate the first scrape, so a rate()
            # over the window can be empty)
            median = scalar(prom, "histogram_quantile(0.5, sum by (le) "
                            "(mtc_fault_to_drain_seconds_bucket))")
            assert median is not None and not math.isnan(median)
            assert 0 < median <= 5.0  # the drain followed the report within a few seconds
            assert scalar(prom, "sum(mtc_job_restarts_total)") == 1  # the one job, restarted once
            assert scalar(prom, "mtc_dead_letters") == 0
            alerts_json = requests.get(f"{url}/alerts.json", headers=headers, timeout=10).json()
            assert alerts_json["alerts"] == [] and alerts_json["now"] > 0
