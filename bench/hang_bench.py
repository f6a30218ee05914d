"""Hang to action, measured on the embedded default with real processes.

    .venv/bin/python bench/hang_bench.py [--runs 1] [--floor 3] [--slow-factor 1.3]

Each run starts the embedded control plane (local compute, five simulated nodes), submits
four ranks of ``examples/torch_allreduce.py`` (gloo all-reduce, per-rank progress), waits
until every rank is past step 30, SIGSTOPs rank 2's process group and times:

* ``detect_s``: SIGSTOP to the adapter's ``HangInJob`` report on the culprit's node;
* ``action_s``: SIGSTOP to ``JobSignalled`` (triage's restart: the ranks are told to stop);
* ``resume_s``: SIGSTOP to attempt 2's first step (the stopped rank killed after the grace
  period, the job started again in place, restored from its newest checkpoint);

with the threshold the policy used (3 x the job's p99 step time, floored at ``--floor``) and
the culprit named. ``--slow-factor`` > 1 also runs a job whose rank 1 computes that much
longer (a stand-in for a throttled CPU) and times its ``SlowInJob``. One JSON line per run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mtc_program.protocol import CHECKPOINT_DIR  # noqa: E402
from services.cli.demo import CLUSTER_SPEC, demo_compute_options  # noqa: E402
from services.job_submission import commands as job_commands  # noqa: E402
from services.wiring.embedded import EmbeddedApp, embedded  # noqa: E402
from shared.adapters.compute.protocol import host_dir, progress_path  # noqa: E402
from shared.adapters.compute.rank_progress import RankWatch  # noqa: E402
from shared.config import ControlPlaneConfig  # noqa: E402
from shared.domain.events import JobSignalled, NodeHealthReported  # noqa: E402
from shared.policies.hangs import HangConfig  # noqa: E402

CLUSTER = {**CLUSTER_SPEC, "nodePools": [{**CLUSTER_SPEC["nodePools"][0], "nodeCount": 5}]}


def job_spec(extra: list[str]) -> dict[str, Any]:
    return {"displayName": "allreduce", "jobSpec": {
        "workerPoolSpecs": [{
            "machineSpec": {"machineType": "a3-highgpu-8g",
                            "acceleratorType": "NVIDIA_H100_80GB", "acceleratorCount": 8},
            "replicaCount": 4,
            "containerSpec": {"imageUri": "local/examples:latest",
                              "command": [sys.executable,
                                          str(ROOT / "examples" / "torch_allreduce.py")],
                              "args": ["--steps", "100000", "--step-time", "0.05",
                                       "--checkpoint-every", "20", "--beat-every", "0.5",
                                       *extra]}}],
        "scheduling": {"partition": "train", "restartJobOnWorkerRestart": False}}}


def wait(app: EmbeddedApp, what: str, pred: Any, timeout_s: float) -> float:
    if not app.run(pred, timeout_s=timeout_s):
        raise SystemExit(f"timed out waiting for {what}")
    return time.time()


def beat(ckpt: str, rank: int) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        data: dict[str, Any] = json.loads(progress_path(ckpt, rank).read_text())
        return data
    return {}


def events(app: EmbeddedApp, kind: str) -> list[dict[str, Any]]:
    assert app.deps.event_log is not None
    return [d for d in app.deps.event_log.read() if d["type"] == kind]


def condition(app: EmbeddedApp, ctype: str) -> dict[str, Any] | None:
    for d in events(app, NodeHealthReported.TYPE):
        for c in d["data"]["conditions"]:
            if c["type"] == ctype and c["status"] == "true":
                return {"node_id": d["data"]["node_id"], "observed_at": d["data"]["observed_at"],
                        **c}
    return None


def setup(root: Path, floor: float) -> EmbeddedApp:
    config = replace(ControlPlaneConfig(), grace_period_s=2.0, heartbeat_timeout_s=60)
    app = embedded(root / "state", config=config, compute_options=demo_compute_options())
    app.compute.scan.ranks = RankWatch(hang=HangConfig(floor_s=floor))
    with app.transaction() as uow:
        job_commands.create_cluster(CLUSTER, uow, app.deps)

    def ready() -> bool:
        with app.uow() as uow:
            c = uow.clusters.get("demo")
        return c is not None and c.state.value == "READY"
    wait(app, "the cluster", ready, 60)
    return app


def checkpoint_dir(app: EmbeddedApp, job_id: str) -> str:
    w = app.compute.workers(job_id)[0]
    raw = Path(f"/proc/{w.pid}/environ").read_bytes().split(b"\0")
    told = dict(i.decode().split("=", 1) for i in raw if b"=" in i)[CHECKPOINT_DIR]
    return host_dir(told, str(app.deps.config.output_root / "gcs"))  # a sandboxed rank's gs://


def hang_run(floor: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        app = setup(Path(tmp), floor)
        try:
            with app.transaction() as uow:
                job_commands.submit_job("demo", job_spec([]), uow, app.deps, "hang-1")
            wait(app, "4 workers", lambda: len(app.compute.workers("hang-1")) == 4, 60)
            workers = {w.rank: w for w in app.compute.workers("hang-1")}
            ckpt = checkpoint_dir(app, "hang-1")
            wait(app, "step 30", lambda: all(beat(ckpt, r).get("step", 0) >= 30
                                             for r in range(4)), 300)
            t0 = time.time()
            os.killpg(os.getpgid(workers[2].pid), signal.SIGSTOP)
            wait(app, "HangInJob", lambda: condition(app, "HangInJob") is not None, 300)
            found = condition(app, "HangInJob")
            assert found is not None
            wait(app, "JobSignalled", lambda: bool(events(app, JobSignalled.TYPE)), 120)
            acted = float(events(app, JobSignalled.TYPE)[0]["time"])
            t_resume = wait(app, "attempt 2's first step",
                            lambda: beat(ckpt, 0).get("attempt") == 2
                            and beat(ckpt, 0).get("step", 0) > 0
                            and beat(ckpt, 0).get("steps"), 300)
            return {"detect_s": round(found["observed_at"] - t0, 2),
                    "action_s": round(acted - t0, 2),
                    "resume_s": round(t_resume - t0, 2),
                    "threshold_s": found["details"]["threshold_s"],
                    "culprit": found["details"]["culprit"],
                    "culprit_node_ok": found["node_id"] == workers[2].node_id}
        finally:
            for w in app.compute.workers("hang-1"):
                with contextlib.suppress(OSError):
                    os.killpg(os.getpgid(w.pid), signal.SIGCONT)
            app.compute.kill_all()
            app.close()


def slow_run(factor: float, floor: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        app = setup(Path(tmp), floor)
        try:
            with app.transaction() as uow:
                job_commands.submit_job("demo", job_spec(["--slow-rank", "1", "--slow-factor",
                                                          str(factor)]), uow, app.deps, "slow-1")
            wait(app, "4 workers", lambda: len(app.compute.workers("slow-1")) == 4, 60)
            workers = {w.rank: w for w in app.compute.workers("slow-1")}
            t0 = time.time()
            wait(app, "SlowInJob", lambda: condition(app, "SlowInJob") is not None, 300)
            found = condition(app, "SlowInJob")
            assert found is not None
            return {"slow_in_job_after_start_s": round(time.time() - t0, 2),
                    "rank": found["details"]["rank"],
                    "ratio_to_peers": found["details"]["ratio_to_peers"],
                    "node_ok": found["node_id"] == workers[1].node_id}
        finally:
            app.compute.kill_all()
            app.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--floor", type=float, default=3.0)
    p.add_argument("--slow-factor", type=float, default=0.0)
    args = p.parse_args()
    for _ in range(args.runs):
        print(json.dumps({"hang": hang_run(args.floor)}), flush=True)
    if args.slow_factor > 1:
        print(json.dumps({"straggler": slow_run(args.slow_factor, args.floor)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
