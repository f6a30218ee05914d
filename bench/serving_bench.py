#!/usr/bin/env python3
"""Serving through a node fault: a constant request rate on an endpoint while an XID 79
hits a node serving one of its replicas (docs/inference.md records runs).

    PYTHONPATH=. .venv/bin/python bench/serving_bench.py [--replicas 2] [--rate 20]
        [--seconds 60] [--fault-at 15] [--out result.json]
    PYTHONPATH=. .venv/bin/python bench/serving_bench.py --replicas 1 --max-replicas 4 \
        --rate 5 --step-rate 35 --step 10:30 --fault-at -1 --seconds 60

One `mtc serve` (a 4-node cluster), a TorchScript model served by the prebuilt PyTorch
runtime with ``--replicas`` replicas. Requests are sent open-loop (each at its scheduled
time, whatever the earlier ones do) for ``--seconds``; at ``--fault-at`` the node of the
first replica gets an XID 79 through the API (``:reportHealth``). Each answer is recorded
(when, status, latency, ``Retry-After``); the endpoint's replicas are polled every 0.25 s
for where they run. Prints the counts by status, p50/p99 latency, the 503s (all with
``Retry-After``?) and when the last one came, and the replicas' moves. With
``--max-replicas`` above ``--replicas`` the model autoscales (target ``--target`` requests
per minute per replica); ``--step A:B`` sends ``--step-rate`` from A to B s: the scale
events come back with the figures. A negative ``--fault-at`` injects no fault.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.serving import PARENT, create_cluster, mtc_serve
from tests.stalled_clients import inject_xid

TOKEN = "serving-bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REQUEST_COUNT = "aiplatform.googleapis.com/prediction/online/request_count"
IMAGE = "us-docker.pkg.dev/vertex-ai/prediction/pytorch-cpu.2-4:latest"


def save_model(directory: Path) -> None:
    import torch

    layer = torch.nn.Linear(4, 2)
    directory.mkdir(parents=True)
    torch.jit.script(layer).save(str(directory / "model.pt"))


def wait_op(url: str, op: dict[str, Any], timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while not op.get("done"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"operation not done: {op}")
        op = requests.post(f"{url}/v1/{op['name']}:wait", json={"timeout": "5s"}, headers=AUTH,
                           timeout=30).json()
    if "error" in op:
        raise RuntimeError(f"operation failed: {op['error']}")
    return op


def deploy(url: str, replicas: int, high: int, target: int) -> str:
    up = requests.post(f"{url}/v1/{PARENT}/models:upload", headers=AUTH, timeout=30, json={
        "model": {"displayName": "bench", "artifactUri": "gs://serve-bench/model",
                  "containerSpec": {"imageUri": IMAGE}}}).json()
    model = wait_op(url, up)["response"]["model"]
    made = requests.post(f"{url}/v1/{PARENT}/endpoints", headers=AUTH, timeout=30,
                         json={"displayName": "bench"}).json()
    endpoint: str = wait_op(url, made)["response"]["name"]
    op = requests.post(f"{url}/v1/{endpoint}:deployModel", headers=AUTH, timeout=30, json={
        "deployedModel": {"model": model, "dedicatedResources": {
            "machineSpec": {"machineType": "a3-highgpu-8g"},
            "minReplicaCount": replicas, "maxReplicaCount": high,
            "autoscalingMetricSpecs": [{"metricName": REQUEST_COUNT, "target": target}]}}}
    ).json()
    wait_op(url, op)
    return endpoint


class Watch:
    """The replicas' (node, state) over time, polled."""

    def __init__(self, url: str, endpoint: str) -> None:
        self.url, self.endpoint = url, endpoint
        self.seen: list[tuple[float, list[tuple[str, str]]]] = []
        self.stop = threading.Event()

    def run(self, t0: float) -> None:
        while not self.stop.is_set():
            got = requests.get(f"{self.url}/v1/{self.endpoint}", headers=AUTH, timeout=10).json()
            now = [(r.get("node", ""), r["state"])
                   for d in got.get("deployedModels", []) for r in d.get("mtcReplicas", [])]
            if not self.seen or self.seen[-1][1] != now:
                self.seen.append((round(time.monotonic() - t0, 2), now))
            self.stop.wait(0.25)


def one(url: str, endpoint: str, t0: float) -> dict[str, Any]:
    sent = time.monotonic()
    try:
        answer = requests.post(f"{url}/v1/{endpoint}:predict", headers=AUTH, timeout=30,
                               json={"instances": [[1.0, 2.0, 3.0, 4.0]]})
        status, retry = answer.status_code, answer.headers.get("Retry-After")
    except requests.RequestException as exc:
        status, retry = 0, None
        print(f"request failed: {exc}", file=sys.stderr)
    return {"at": round(sent - t0, 3), "status": status, "retry_after": retry,
            "latency_s": time.monotonic() - sent}


def schedule(rate: float, seconds: float, step: tuple[float, float] | None,
             step_rate: float) -> list[float]:
    """When each request is due (s from the start): ``rate``, ``step_rate`` inside ``step``."""
    out, t = [], 0.0
    while t < seconds:
        out.append(t)
        t += 1.0 / (step_rate if step and step[0] <= t < step[1] else rate)
    return out


def run(replicas: int, rate: float, seconds: float, fault_at: float, *, high: int,
        target: int, step: tuple[float, float] | None, step_rate: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        with mtc_serve(state, TOKEN) as url:
            save_model(state / "jobs" / "gcs" / "serve-bench" / "model")  # (a state
            # directory holding outputs but no database is refused at the start)
            op = create_cluster(url, TOKEN, "c1", workers=4)
            assert "error" not in op, op
            endpoint = deploy(url, replicas, max(high, replicas), target)
            watch = Watch(url, endpoint)
            t0 = time.monotonic()
            threading.Thread(target=watch.run, args=(t0,), daemon=True).start()
            time.sleep(0.5)
            victim = watch.seen[-1][1][0][0]
            futures, fault_sent = [], None
            with ThreadPoolExecutor(max_workers=64) as pool:
                for at in schedule(rate, seconds, step, step_rate):
                    due = t0 + at
                    if fault_sent is None and 0 <= fault_at <= at:
                        inject_xid(url, TOKEN, "c1", victim)
                        fault_sent = round(time.monotonic() - t0, 3)
                    time.sleep(max(0.0, due - time.monotonic()))
                    futures.append(pool.submit(one, url, endpoint, t0))
                rows = [f.result() for f in futures]
            time.sleep(1.0)
            watch.stop.set()
            got = requests.get(f"{url}/v1/{endpoint}", headers=AUTH, timeout=10).json()
            events = [{**e, "at_s": round(_since(e["time"], t0), 1)}
                      for d in got["deployedModels"] for e in d.get("mtcScaleEvents", [])]
    out = summary(rows, replicas, rate, seconds, fault_sent, victim, watch.seen)
    out["scale_events"] = events
    out["per_phase"] = phases(rows, step)
    return out


def _since(stamp: str, t0: float) -> float:
    """An RFC 3339 time as seconds since ``t0`` (time.monotonic's)."""
    import datetime as dt

    wall = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    return wall - (time.time() - (time.monotonic() - t0))


def phases(rows: list[dict[str, Any]], step: tuple[float, float] | None
           ) -> dict[str, dict[str, float]]:
    """p50/p99 latency (ms) of the answers before, during and after the step."""
    if step is None:
        return {}
    out = {}
    for name, keep in (("before", lambda a: a < step[0]),
                       ("step", lambda a: step[0] <= a < step[1]),
                       ("after", lambda a: a >= step[1])):
        ok = [r["latency_s"] for r in rows if r["status"] == 200 and keep(r["at"])]
        qs = statistics.quantiles(ok, n=100) if len(ok) > 1 else [0.0] * 99
        out[name] = {"requests": len(ok), "p50_ms": round(qs[49] * 1000, 1),
                     "p99_ms": round(qs[98] * 1000, 1)}
    return out


def summary(rows: list[dict[str, Any]], replicas: int, rate: float, seconds: float,
            fault_sent: float | None, victim: str,
            moves: list[tuple[float, list[tuple[str, str]]]]) -> dict[str, Any]:
    by_status: dict[str, int] = {}
    for r in rows:
        by_status[str(r["status"])] = by_status.get(str(r["status"]), 0) + 1
    ok = sorted(r["latency_s"] for r in rows if r["status"] == 200)
    unavailable = [r for r in rows if r["status"] == 503]
    qs = statistics.quantiles(ok, n=100) if len(ok) > 1 else [0.0] * 99
    return {
        "replicas": replicas, "rate_per_s": rate, "seconds": seconds, "requests": len(rows),
        "by_status": by_status,
        "failed": sum(1 for r in rows if r["status"] not in (200, 503)),
        "unavailable_503": len(unavailable),
        "503_with_retry_after": sum(1 for r in unavailable if r["retry_after"]),
        "last_503_at_s": max((r["at"] for r in unavailable), default=None),
        "ok_after_last_503": sum(1 for r in rows if unavailable and r["status"] == 200
                                 and r["at"] > max(u["at"] for u in unavailable)),
        "p50_ms": round(qs[49] * 1000, 1), "p99_ms": round(qs[98] * 1000, 1),
        "fault_at_s": fault_sent, "fault_node": victim, "replicas_seen": moves,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--fault-at", type=float, default=15.0)
    parser.add_argument("--max-replicas", type=int, default=0)
    parser.add_argument("--target", type=int, default=600,
                        help="requests per minute per replica the autoscaler aims at")
    parser.add_argument("--step", help="A:B, the step's start and end (s)")
    parser.add_argument("--step-rate", type=float, default=0.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    step = tuple(float(x) for x in args.step.split(":")) if args.step else None
    result = run(args.replicas, args.rate, args.seconds, args.fault_at, high=args.max_replicas,
                 target=args.target, step=step,  # type: ignore[arg-type]
                 step_rate=args.step_rate)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
