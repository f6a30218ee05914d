"""`make stack`'s story, driven through the API as a client would (scripts/stack.py runs it).

A cluster comes up, the example training job runs on two nodes, an XID 79 hits one of them,
and the node is drained, the job checkpoints on SIGTERM, is requeued on the spare, resumes,
the node is rebooted, passes its checks and returns to service, and the job succeeds.

Everything read back is read with a bounded wait for what the next step needs: a job that
was submitted is not RUNNING yet, and a job with a checkpoint need not be holding nodes at
that instant (``mtcProgress.nodes`` is empty until placement, and holes left by a requeue
are not listed), so nothing indexes into a list the API has not filled yet.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from stack import Stack

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_ID = "demo"
JOB_ID = "train-1"
TERMINAL_JOB_STATES = frozenset({"JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED",
                                 "JOB_STATE_CANCELLED"})
T = TypeVar("T")
Job = Mapping[str, Any]


class StoryTimeout(SystemExit):
    """The story waited past its deadline (or for a job that ended): exits the script with
    the message, as every other stack failure does."""


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 120,
             poll_s: float = 0.2, *, describe: Callable[[], str] = lambda: "",
             clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``probe`` every ``poll_s`` until it returns something other than None (or False),
    and return that; past ``timeout_s`` raise StoryTimeout naming ``what`` and, from
    ``describe``, what was last seen."""
    deadline = clock() + timeout_s
    while True:
        value = probe()
        if value is not None and value is not False:
            return value
        if clock() >= deadline:
            seen = describe()
            raise StoryTimeout(f"stack: timed out after {timeout_s:g} s waiting for {what}"
                               + (f" (last seen: {seen})" if seen else ""))
        sleep(poll_s)


def job_nodes(job: Job) -> list[str]:
    """The nodes the job holds now, as the API lists them (holes left out)."""
    return [n for n in (job.get("mtcProgress") or {}).get("nodes") or [] if n]


def _summary(job: Job | None) -> str:
    if job is None:
        return "no answer yet"
    progress = job.get("mtcProgress") or {}
    checkpoint = (progress.get("latestCheckpoint") or {}).get("step", "none")
    return (f"state {job.get('state')}, nodes {job_nodes(job)}, attempt "
            f"{progress.get('attempt')}, checkpoint {checkpoint}")


def wait_for_running_job(read_job: Callable[[], Job], *, checkpoint: bool = False,
                         timeout_s: float = 120, poll_s: float = 0.2,
                         clock: Callable[[], float] = time.monotonic,
                         sleep: Callable[[float], None] = time.sleep) -> Job:
    """Poll ``read_job`` until the job is RUNNING and holds nodes (and, with ``checkpoint``,
    has saved one); the job as then read. A job that ends first, or a deadline passed,
    raises StoryTimeout saying what the job last looked like."""
    last: list[Job] = []

    def probe() -> Job | None:
        job = read_job()
        last[:] = [job]
        if job.get("state") in TERMINAL_JOB_STATES:
            raise StoryTimeout(f"stack: job {job.get('name', '')} ended while the story "
                               f"waited for it to run: {_summary(job)}")
        if job.get("state") != "JOB_STATE_RUNNING" or not job_nodes(job):
            return None
        if checkpoint and "latestCheckpoint" not in (job.get("mtcProgress") or {}):
            return None
        return job

    what = "the job to be RUNNING on its nodes" + (" with a checkpoint" if checkpoint else "")
    return wait_for(what, probe, timeout_s, poll_s, clock=clock, sleep=sleep,
                    describe=lambda: _summary(last[0] if last else None))


def cluster_body() -> dict[str, Any]:
    """`make demo`'s cluster as a modelDevelopmentCluster: a login node and four H100
    nodes, one of them a hot spare, in one Slurm partition."""
    return {
        "displayName": "self-healing demo",
        "nodePools": [
            {"id": "login", "machineSpec": {"machineType": "n2-standard-8"},
             "scalingSpec": {"minNodeCount": 1, "maxNodeCount": 1}},
            {"id": "h100", "machineSpec": {"machineType": "a3-highgpu-8g",
                                           "acceleratorType": "NVIDIA_H100_80GB",
                                           "acceleratorCount": 8},
             "scalingSpec": {"minNodeCount": 4, "maxNodeCount": 4}, "mtcHotSpareCount": 1},
        ],
        "orchestratorSpec": {"slurmSpec": {
            "partitions": [{"id": "train", "nodePoolIds": ["h100"]}],
            "loginNodePoolId": "login"}},
    }


def custom_job_body(steps: int) -> dict[str, Any]:
    """`make demo`'s training job (examples/train.py on two nodes) as a CustomJob."""
    from services.cli.demo import CHECKPOINT_EVERY_STEPS, STEP_TIME_S

    return {
        "displayName": "numpy-regression",
        # the production topology tells the drain, checkpoint and requeue story; the cheaper
        # recoveries are `make demo`'s and `mtc bench recovery`'s (docs/recovery.md)
        "labels": {"mtc-recovery-mode": "requeue"},
        "jobSpec": {
            "persistentResourceId": CLUSTER_ID,
            "workerPoolSpecs": [{
                "machineSpec": {"machineType": "a3-highgpu-8g",
                                "acceleratorType": "NVIDIA_H100_80GB", "acceleratorCount": 8},
                "replicaCount": "1",
                "containerSpec": {
                    "imageUri": "local/examples:latest",
                    "command": [sys.executable, str(ROOT / "examples" / "train.py")],
                    "args": ["--steps", str(steps), "--checkpoint-every",
                             str(CHECKPOINT_EVERY_STEPS), "--step-time", str(STEP_TIME_S)],
                },
            }] * 2,  # pool 0 the primary replica (one, as on Vertex), pool 1 the worker
            "scheduling": {"mtcPartition": "train", "restartJobOnWorkerRestart": False},
        },
    }


def inject_xid_79(stack: Stack, victim: str) -> str:
    """``make stack``'s fault: an XID 79 condition on the simulated node."""
    from shared.domain.health import Condition, ConditionStatus, ConditionType

    stack.compute.inject_fault(victim, [Condition(ConditionType.XID_ERROR.value,
                                                  ConditionStatus.TRUE, "NVRM: Xid 79",
                                                  time.time(), {"xids": [79]})])
    return f"injecting XID 79 (GPU fell off the bus) on {victim}"


def story(stack: Stack, steps: int, console: Any, t0: float, *,
          inject: Callable[[Stack, str], str] = inject_xid_79, timeout_s: float = 180
          ) -> dict[str, Any]:
    """The self-healing story through the API; the job as the API last showed it.
    ``inject(stack, node)`` breaks the node and says how."""
    from services.cli.demo import CHECKPOINT_EVERY_STEPS, STEP_TIME_S

    def node_state(node_id: str) -> str | None:
        return next((n.get("state") for n in stack.nodes(CLUSTER_ID)
                     if n.get("nodeId") == node_id), None)

    def read_job() -> dict[str, Any]:
        return stack.job(JOB_ID)

    created = time.time()
    op = stack.wait_operation(stack.create_cluster(CLUSTER_ID, cluster_body()))
    ready = op["response"]
    in_service = (ready.get("mtcNodes") or {}).get("inService", "?")
    console.print(f"[dim]{time.time() - t0:7.2f}s  {ready['name']} {ready.get('state')} "
                  f"({in_service} nodes in service) in {time.time() - created:.1f} s: "
                  f"{op['name']} done")
    submitted = stack.submit_job(JOB_ID, custom_job_body(steps))
    console.print(f"[dim]{time.time() - t0:7.2f}s  {submitted['name']} submitted: "
                  f"{submitted.get('state')}")
    wait_for_running_job(read_job, checkpoint=True)
    time.sleep(CHECKPOINT_EVERY_STEPS * STEP_TIME_S / 2)  # mid-interval: the SIGTERM save counts
    # read again: between the two reads the job may have been requeued and placed anew
    victim = job_nodes(wait_for_running_job(read_job, timeout_s=60))[0]
    console.print(f"[bold magenta]>>> {inject(stack, victim)}")
    return wait_for("the job to finish and the node to return", lambda: (
        job if (job := read_job())["state"] in TERMINAL_JOB_STATES
        and _final_checkpoint_seen(job, steps) and node_state(victim) == "idle" else None),
        timeout_s=timeout_s,
        describe=lambda: f"job: {_summary(read_job())}; {victim}: {node_state(victim)}")


def _final_checkpoint_seen(job: Mapping[str, Any], steps: int) -> bool:
    """A job that succeeded saved its last step; the event saying so travels on its own topic
    and may land after the one that ended the job, so the story waits for both."""
    if job.get("state") != "JOB_STATE_SUCCEEDED":
        return True
    latest = ((job.get("mtcProgress") or {}).get("latestCheckpoint") or {}).get("step")
    return latest is not None and int(latest) >= steps


def node_table(nodes: list[dict[str, Any]]) -> Any:
    """The cluster's nodes as the API lists them (sinfo-like)."""
    from rich.table import Table

    table = Table("PARTITION", "NODE", "ROLE", "STATE", "SPARE", "FAILURES", "REASON",
                  title="mtc node list (GET .../modelDevelopmentClusters/demo/nodes)")
    for n in sorted(nodes, key=lambda n: n["nodeId"]):
        table.add_row(n.get("partition", "-"), n["nodeId"], n.get("role", ""),
                      n.get("state", ""), "yes" if n.get("spare") else "",
                      str(n.get("failures", 0)), n.get("reason", ""))
    return table
