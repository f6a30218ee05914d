"""Running `mtc` as a subprocess, and the Vertex-shaped bodies its tests write to files."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
ENV_KEYS = ("MTC_API", "MTC_API_TOKEN", "MTC_PROJECT", "MTC_LOCATION", "MTC_STATE_DIR")


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without the caller's MTC_* settings."""
    env = {k: v for k, v in os.environ.items() if k not in ENV_KEYS}
    env.update(extra)
    return env


def cluster_body() -> dict[str, Any]:
    """examples/cluster.json: 4 H100 nodes + 1 hot spare, a login pool, partition train."""
    return json.loads((EXAMPLES / "cluster.json").read_text())  # type: ignore[no-any-return]


def job_body(steps: int, cluster: str | None = "demo", *, step_time: float = 0.05
             ) -> dict[str, Any]:
    """examples/custom_job.json, running examples/train.py with this interpreter."""
    body: dict[str, Any] = copy.deepcopy(json.loads((EXAMPLES / "custom_job.json").read_text()))
    spec = body["jobSpec"]
    if cluster is None:
        spec.pop("persistentResourceId")
    else:
        spec["persistentResourceId"] = cluster
    for pool in spec["workerPoolSpecs"]:  # pool 0 the primary replica, pool 1 the worker
        container = pool["containerSpec"]
        container["command"] = [sys.executable, str(EXAMPLES / "train.py")]
        container["args"] = ["--steps", str(steps), "--checkpoint-every", "20", "--step-time",
                             str(step_time)]
    return body


def write(path: Path, body: dict[str, Any]) -> Path:
    path.write_text(json.dumps(body))
    return path


def mtc(state: Path, *args: str, check: bool = True, env: dict[str, str] | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "services.cli.main", "--state-dir", str(state), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env=env or clean_env())
    if check and proc.returncode != 0:
        raise AssertionError(f"{args}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


def mtc_json(state: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return json.loads(mtc(state, "--json", *args, env=env).stdout)
