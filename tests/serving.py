"""`mtc serve` as a real subprocess on a free loopback port, for tests that use real clients."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
PARENT = "projects/p/locations/l"


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = 30.0,
               interval_s: float = 0.2) -> Any:
    """``check()``'s first truthy answer, polled every ``interval_s``; an AssertionError
    naming ``what`` and the last answer when ``timeout_s`` passes first."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; last saw {last!r}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def mtc_serve(state_dir: Path, token: str, *, timeout_s: float = 30.0,
              extra_args: Sequence[str] = ()) -> Iterator[str]:
    """``mtc --state-dir DIR serve`` from the checkout, with ``token`` as its API token."""
    with serve_subprocess(["--state-dir", str(state_dir)], extra_args, cwd=ROOT,
                          # no jobs' file system unless asked: it would outlive the test's
                          # directory (tests/integration/test_tenant_jobs.py asks)
                          env={"MTC_JOBS_VOLUME": "off", **os.environ, "MTC_API_TOKEN": token},
                          log_dir=state_dir.parent,
                          state_dir=state_dir, timeout_s=timeout_s) as url:
        yield url


@contextmanager
def serve_subprocess(global_args: Sequence[str], serve_args: Sequence[str], *, cwd: Path,
                     env: dict[str, str], log_dir: Path, state_dir: Path,
                     timeout_s: float = 30.0) -> Iterator[str]:
    """``mtc [global args] serve --port P [serve args]`` as a child process, its URL once it
    answers; on exit it is stopped and every worker it started (under ``state_dir``) killed."""
    port = free_port()
    log = open(log_dir / f"serve-{port}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", *global_args, "serve",
         "--port", str(port), *serve_args], cwd=cwd, env=env, stdout=log,
        stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                requests.get(f"{url}/healthz", timeout=5)
                break
            except (requests.ConnectionError, requests.Timeout):  # not up, or still starting
                # (a loaded machine answered the first request after the 1 s this waited)
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mtc serve did not start: {log.name}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        from services.wiring.embedded import embedded

        app = embedded(state_dir)
        app.compute.kill_all()
        app.close()


def cluster_body(workers: int = 4, spares: int = 0) -> dict[str, Any]:
    return {
        "displayName": "test cluster",
        "nodePools": [
            {"id": "login", "machineSpec": {"machineType": "n2-standard-8"},
             "scalingSpec": {"minNodeCount": 1, "maxNodeCount": 1}},
            {"id": "gpu", "machineSpec": {"machineType": "a3-highgpu-8g",
                                          "acceleratorType": "NVIDIA_H100_80GB",
                                          "acceleratorCount": 8},
             "scalingSpec": {"minNodeCount": workers, "maxNodeCount": workers},
             "mtcHotSpareCount": spares},
        ],
        "orchestratorSpec": {"slurmSpec": {"partitions": [{"id": "gpu", "nodePoolIds": ["gpu"]}],
                                           "loginNodePoolId": "login"}},
    }


def create_cluster(url: str, token: str, cluster_id: str = "c1", *, parent: str = PARENT,
                   **kw: Any) -> dict[str, Any]:
    """Create through REST and wait on the Operation until it is done."""
    headers = {"Authorization": f"Bearer {token}"}
    resp = requests.post(f"{url}/v1beta1/{parent}/modelDevelopmentClusters",
                         params={"modelDevelopmentClusterId": cluster_id},
                         json=cluster_body(**kw), headers=headers, timeout=30)
    resp.raise_for_status()
    op = resp.json()
    deadline = time.monotonic() + 60
    while not op.get("done"):
        assert time.monotonic() < deadline, op
        op = requests.post(f"{url}/v1beta1/{op['name']}:wait", json={"timeout": "10s"},
                           headers=headers, timeout=30).json()
    return op  # type: ignore[no-any-return]


def vertex_pools(pool: dict[str, Any], replicas: int | str) -> list[dict[str, Any]]:
    """``replicas`` replicas of ``pool`` in Vertex's layout: pool 0 the one primary replica,
    pool 1 the others (the API refuses a pool 0 of more than one replica, as Vertex does)."""
    n = int(replicas)
    rest = [{**pool, "replicaCount": type(replicas)(n - 1)}] if n > 1 else []
    return [{**pool, "replicaCount": type(replicas)(1)}, *rest]
