"""A state directory with a cluster and many custom jobs, made in process: what
``bench/list_bench.py`` and ``bench/api_load.py`` measure the API on.

One job is created through the API and run to its end (``true``), then cloned in the store
(its API record and its domain job) until there are N: creating thousands through the API
would measure creates, and finished jobs cost the control plane's passes nothing.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.api.context import RESOURCES, resource_key, save_record
from services.api.http import create_app
from services.api.names import Parent
from services.wiring.api import embedded_api
from services.wiring.embedded import EmbeddedApp, embedded
from shared.handling import command_unit

TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PARENT = "projects/p/locations/l"
BASE = f"/v1beta1/{PARENT}"
H100 = {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
        "acceleratorCount": 8}


def job_body(cluster_id: str = "c1", command: tuple[str, ...] = ("true",)) -> dict[str, Any]:
    """A one-node CustomJob on ``cluster_id`` running ``command``."""
    return {"displayName": "train", "jobSpec": {"persistentResourceId": cluster_id,
                                                "workerPoolSpecs": [{
        "machineSpec": H100, "replicaCount": 1,
        "containerSpec": {"imageUri": "local", "command": list(command)}}]}}


def cluster_body(workers: int = 1) -> dict[str, Any]:
    """A modelDevelopmentCluster of ``workers`` GPU nodes in one partition and a login node."""
    return {"displayName": "c", "nodePools": [
        {"id": "login", "machineSpec": {"machineType": "n2-standard-8"},
         "scalingSpec": {"minNodeCount": 1, "maxNodeCount": 1}},
        {"id": "gpu", "machineSpec": H100,
         "scalingSpec": {"minNodeCount": workers, "maxNodeCount": workers}}],
        "orchestratorSpec": {"slurmSpec": {"partitions": [{"id": "gpu", "nodePoolIds": ["gpu"]}],
                                           "loginNodePoolId": "login"}}}


class Quiet:
    """A runtime that delivers nothing after a call: the request's own cost only."""

    def __init__(self, app: Any) -> None:
        self.app, self.deps, self.store = app, app.deps, app.store

    def after_request(self) -> None:
        pass


def in_process(state_dir: Path) -> tuple[EmbeddedApp, Any]:
    """The embedded app on ``state_dir`` and a flask test client of its API (no sockets;
    nothing delivered after a call: ``app.pump`` does it)."""
    app = embedded(state_dir)
    ctx, _ = embedded_api(app, env_token=TOKEN, runtime=Quiet(app))
    return app, create_app(ctx).test_client()


def create(app: EmbeddedApp, client: Any, path: str, body: dict[str, Any]) -> None:
    """POST ``body`` to ``path`` under the parent, then deliver what it started."""
    made = client.post(f"{BASE}/{path}", json=body, headers=AUTH)
    assert made.status_code == 200, made.json
    app.pump(budget_s=30.0)


def seed(app: EmbeddedApp, client: Any, jobs: int, *, clusters: tuple[str, ...] = (),
         workers: int = 2) -> None:
    """Cluster ``c1`` (one worker) with ``jobs`` finished jobs ``j0``..., and the clusters
    ``clusters`` of ``workers`` idle workers each."""
    create(app, client, "modelDevelopmentClusters?modelDevelopmentClusterId=c1", cluster_body())
    for cluster_id in clusters:
        create(app, client, f"modelDevelopmentClusters?modelDevelopmentClusterId={cluster_id}",
               cluster_body(workers))
    create(app, client, "customJobs?customJobId=j0", job_body())
    finish(app, "j0")
    grow(app, jobs)


def finish(app: EmbeddedApp, job_id: str, timeout_s: float = 120.0) -> None:
    """Deliver until ``job_id`` has ended (its node must come up first): a clone of a job
    still pending would be one more job for every scheduling pass to consider."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        app.pump(budget_s=1.0)
        with command_unit(app.deps, read_only=True) as uow:
            job = uow.jobs.get(job_id)
            if job is not None and job.terminal:
                return
        time.sleep(0.2)
    raise RuntimeError(f"job {job_id} did not end within {timeout_s:g} s")


def grow(app: EmbeddedApp, total: int) -> None:
    """Clone job ``j0`` (record and domain job) until there are ``total`` jobs."""
    parent = Parent("p", "l")
    with command_unit(app.deps) as uow:
        record = uow.record(RESOURCES, resource_key("customJob", "j0"))
        job = uow.jobs.get("j0")
        have = len(uow.records(RESOURCES, {"kind": "customJob", "parent": PARENT}))
        for i in range(have, total):
            clone = copy.deepcopy(job)
            clone.job_id = f"j{i}"
            uow.jobs.add(clone)
            save_record(uow, "customJob", f"j{i}", parent, record["resource"],
                        record["created"] + i)
