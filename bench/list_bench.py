#!/usr/bin/env python3
"""What one page of a list costs as the collection grows (issue 28 item 4; docs/scale.md).

    PYTHONPATH=. .venv/bin/python bench/list_bench.py [--jobs 1000 5000] [--repeat 20]

In process (flask's test client over the embedded API, no sockets; the control plane's
delivery is left out, as ``mtc serve``'s control loop runs it on its own thread): one
cluster, one job
created through the API, then cloned in the store to N jobs (creating 5,000 through the API
would measure creates). Prints the median time of ``customJobs?pageSize=1``, of the console's
poll (``pageSize=100``, the console's own page) and of a filtered page at each N.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.api.context import RESOURCES, resource_key, save_record
from services.api.http import create_app
from services.api.names import Parent
from services.wiring.api import embedded_api
from services.wiring.embedded import embedded
from shared.handling import command_unit

TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PARENT = "projects/p/locations/l"
JOB = {"displayName": "train", "jobSpec": {"persistentResourceId": "c1", "workerPoolSpecs": [{
    "machineSpec": {"machineType": "a3-highgpu-8g", "acceleratorType": "NVIDIA_H100_80GB",
                    "acceleratorCount": 8},
    "replicaCount": 1, "containerSpec": {"imageUri": "local", "command": ["true"]}}]}}
CLUSTER = {"displayName": "c", "nodePools": [
    {"id": "login", "machineSpec": {"machineType": "n2-standard-8"},
     "scalingSpec": {"minNodeCount": 1, "maxNodeCount": 1}},
    {"id": "gpu", "machineSpec": {"machineType": "a3-highgpu-8g",
                                  "acceleratorType": "NVIDIA_H100_80GB", "acceleratorCount": 8},
     "scalingSpec": {"minNodeCount": 1, "maxNodeCount": 1}}],
    "orchestratorSpec": {"slurmSpec": {"partitions": [{"id": "gpu", "nodePoolIds": ["gpu"]}],
                                       "loginNodePoolId": "login"}}}


class Quiet:
    """A runtime that delivers nothing after a call: the request's own cost only."""

    def __init__(self, app: Any) -> None:
        self.app, self.deps, self.store = app, app.deps, app.store

    def after_request(self) -> None:
        pass


def grow(app: Any, total: int) -> None:
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


def timed(client: Any, url: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        resp = client.get(url, headers=AUTH)
        times.append(time.perf_counter() - start)
        assert resp.status_code == 200, resp.json
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        app = embedded(Path(tmp) / "state")
        ctx, _ = embedded_api(app, env_token=TOKEN, runtime=Quiet(app))
        client = create_app(ctx).test_client()
        base = f"/v1beta1/{PARENT}"
        made = client.post(f"{base}/modelDevelopmentClusters?modelDevelopmentClusterId=c1",
                           json=CLUSTER, headers=AUTH)
        assert made.status_code == 200, made.json
        app.pump(budget_s=30.0)  # the cluster comes up
        made = client.post(f"{base}/customJobs?customJobId=j0", json=JOB, headers=AUTH)
        assert made.status_code == 200, made.json
        app.pump(budget_s=30.0)
        print(f"{'jobs':>6} {'pageSize=1':>11} {'pageSize=100':>12} {'filtered':>9}  (median ms)")
        for n in args.jobs:
            grow(app, n)
            one = timed(client, f"{base}/customJobs?pageSize=1", args.repeat)
            console = timed(client, f"{base}/customJobs?pageSize=100", args.repeat)
            filtered = timed(client, f'{base}/customJobs?pageSize=1&filter=displayName="x"',
                             max(3, args.repeat // 4))
            print(f"{n:>6} {one:>11.1f} {console:>12.1f} {filtered:>9.1f}")
        app.compute.kill_all()
        app.close()


if __name__ == "__main__":
    main()
