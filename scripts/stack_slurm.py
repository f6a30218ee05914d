#!/usr/bin/env python3
"""`make stack-slurm`: the production topology, end to end, on this host.

    .venv/bin/python scripts/stack_slurm.py [--state-dir var/stack-slurm] [--steps 300]
                                            [--json-out FILE] [--keep]

What runs, each part real:

* the official Pub/Sub and Firestore emulators (scripts/emulators.sh);
* every function under functions-framework (as ``make stack``: scripts/stack.py), with
  ``MTC_COMPUTE=remote``: their compute calls are requests on ``mtc-compute-requests``;
* the compute executor (``python -m services.executor``) with ``SlurmCompute``: it pulls the
  requests, applies them to Slurm, runs each node's agent (the probes read that node's own
  kernel log) and publishes the agents' reports and the machines' results to Pub/Sub;
* a real Slurm 22.05 cluster (scripts/slurm/cluster.sh: n1-n4 and cloud nodes c1-c2, its own
  state dir and free ports).

The story, through the API as a client would: a modelDevelopmentCluster (a login node and
four H100 nodes, one a hot spare) is created and its Operation waited on, a 2-node customJob
is submitted, and once it has checkpointed an XID 79 line is appended to the kernel log of
one of its nodes. The node's agent reports it over Pub/Sub, health_triage diagnoses, repair
drains it in Slurm, the job is signalled (``scancel --signal=TERM``), checkpoints, is
requeued on other nodes and resumes from its checkpoint; the node is rebooted
(``scontrol reboot``), passes its checks and returns to service; the job succeeds. ``sinfo``
is printed at each step. Fault-to-drain (the append to the first ``sinfo`` showing DRAIN) and
fault-to-resumed (to the first ``resumed from step`` line of the next attempt in the Slurm
output) are measured by a watcher polling what a Slurm user would see.

Everything started here is stopped by PID on exit, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "scripts"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from stack import Stack, Timeline, print_result, running  # noqa: E402
from stack_story import JOB_ID, story  # noqa: E402

from services.cli.demo_slurm import SINFO_AFTER, SlurmCluster, sinfo_text, start_cluster  # noqa: E402
from shared.adapters.compute.protocol import safe_name  # noqa: E402
from shared.adapters.compute.slurm.api import xid_line  # noqa: E402
from shared.adapters.compute.slurm.cli import SlurmCli, SlurmError  # noqa: E402
from shared.domain.events import Envelope  # noqa: E402

RESUMED_RE = re.compile(r"resumed from step (\d+)")
# the hops between a fault and its job resumed, in order: where the time goes
MILESTONES = ("mtc.node.health_reported.v1", "mtc.node.diagnosed.v1",
              "mtc.node.draining.v1", "mtc.job.signalled.v1", "mtc.job.workers_exited.v1",
              "mtc.job.requeued.v1", "mtc.job.started.v1", "mtc.node.repair_started.v1",
              "mtc.node.repair_completed.v1", "mtc.node.returned_to_service.v1")


def milestones(envelopes: list[Envelope], fault_at: float | None) -> dict[str, float]:
    """Seconds from the fault to the first event of each ``MILESTONES`` type after it (a
    health report only if it carries a problem, a start only of a later attempt)."""
    out: dict[str, float] = {}
    if fault_at is None:
        return out
    for env in sorted(envelopes, key=lambda e: e.time):
        kind = env.type
        hop = kind.split(".")[2]
        if env.time < fault_at or kind not in MILESTONES or hop in out:
            continue
        data = env.event.to_dict()
        if kind == "mtc.node.health_reported.v1" and not any(
                c.get("status") == "true" for c in data.get("conditions", [])):
            continue
        if kind == "mtc.job.started.v1" and int(data.get("attempt", 1)) < 2:
            continue
        out[hop] = round(env.time - fault_at, 3)
    return out


@dataclass
class SlurmWatch:
    """What a Slurm user would see, polled in a thread every ``period_s``: after ``arm``, when
    the faulty node first shows DRAIN in ``sinfo --json`` and when the job's Slurm output
    first gains a ``resumed from step N`` line. Both topologies are measured by it."""

    slurm: SlurmCli
    outputs: Callable[[], list[Path]]  # the job's Slurm output file(s)
    period_s: float = 0.1
    node: str = ""
    fault_at: float | None = None
    drained_at: float | None = None
    drain_reason: str = ""
    resumed_at: float | None = None
    resumed_step: int | None = None
    _resumed_before: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _resumed(self) -> list[str]:
        found: list[str] = []
        for path in self.outputs():
            with contextlib.suppress(OSError):
                found += RESUMED_RE.findall(path.read_text(errors="replace"))
        return found

    def arm(self, node: str) -> float:
        """Watch ``node`` from now on (call right before the fault); returns the fault time."""
        self.node = node
        self._resumed_before = len(self._resumed())
        self.fault_at = time.time()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="slurm-watch", daemon=True)
            self._thread.start()
        return self.fault_at

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            now = time.time()
            if self.drained_at is None:
                with contextlib.suppress(SlurmError):
                    for n in self.slurm.nodes():
                        if n.name == self.node and n.drained:
                            self.drained_at, self.drain_reason = now, n.reason
            if self.resumed_at is None:
                lines = self._resumed()
                if len(lines) > self._resumed_before:
                    self.resumed_at = now
                    self.resumed_step = int(lines[self._resumed_before])
            if self.drained_at is not None and self.resumed_at is not None:
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def latencies(self) -> dict[str, float | None]:
        def since(t: float | None) -> float | None:
            return None if t is None or self.fault_at is None else round(t - self.fault_at, 3)

        return {"fault_to_drain_s": since(self.drained_at),
                "fault_to_resumed_s": since(self.resumed_at)}


@dataclass
class SlurmStack(Stack):
    """``make stack`` with the production topology's hands: ``MTC_COMPUTE=remote``, the
    executor over a real Slurm cluster."""

    executor_id: str = "stack"
    request_ttl_s: float = 120.0
    slurm_dir: Path | None = None  # default: a short-pathed temporary dir (munge's socket)
    cluster: SlurmCluster | None = None
    watch: SlurmWatch | None = None
    _made_slurm_dir: bool = False

    @property
    def compute_dir(self) -> Path:
        """SlurmCompute's state (node map, attempts, each node's kernel log, job output)."""
        return self.state_dir / "executor" / "compute"

    def _function_env(self, fn: Any) -> dict[str, str]:
        env = super()._function_env(fn)
        env.pop("MTC_LOCAL_COMPUTE", None)
        env.update(MTC_COMPUTE="remote", MTC_COMPUTE_TTL_S=str(self.request_ttl_s))
        return env

    def _start_machines(self) -> None:
        from shared.adapters.compute.remote.pubsub import ensure_request_topology

        if self.slurm_dir is None:
            self.slurm_dir = Path(tempfile.mkdtemp(prefix="mtc-ss-"))
            self._made_slurm_dir = True
        self.cluster = start_cluster(self.slurm_dir)
        self.log(f"slurm: cluster in {self.slurm_dir} (SLURM_CONF={self.cluster.slurm_conf})")
        ensure_request_topology(self.project, self.executor_id)
        env = {**os.environ, **self.env, "GOOGLE_CLOUD_PROJECT": self.project,
               "MTC_EXECUTOR_ID": self.executor_id, "MTC_EXECUTOR_COMPUTE": "slurm",
               "MTC_STATE_DIR": str(self.state_dir / "executor"),
               "SLURM_CONF": self.cluster.slurm_conf, "MTC_EXECUTOR_HEARTBEAT_S": "2",
               "MTC_EXECUTOR_OPTIONS": json.dumps({"agent_interval_s": self.agent_interval_s}),
               "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        log = open(self.state_dir / "logs" / "executor.log", "wb")  # noqa: SIM115
        self.procs["executor"] = subprocess.Popen(
            [sys.executable, "-m", "services.executor"], cwd=ROOT, env=env, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self._wait_executor()
        self.watch = SlurmWatch(SlurmCli(timeout_s=10.0, slurm_conf=self.cluster.slurm_conf),
                                lambda: sorted((self.compute_dir / "logs").glob("*/slurm.out")))
        self._start_ticks()

    def _wait_executor(self, timeout_s: float = 60.0) -> None:
        """Until the executor wrote its liveness document (it is pulling by then)."""
        assert self.store is not None
        proc = self.procs["executor"]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"stack-slurm: the executor exited with {proc.returncode} "
                                 f"(see {self.state_dir / 'logs' / 'executor.log'})")
            docs = self.store.read("executors", {"executor_id": self.executor_id})
            if docs:
                self.log(f"executor: {self.executor_id} (pid {proc.pid}) alive on "
                         f"{docs[0].get('host')}, SlurmCompute over {self.compute_dir}")
                return
            time.sleep(0.2)
        raise SystemExit("stack-slurm: the executor did not report alive within "
                         f"{timeout_s:g} s")

    # ------------------------------------------------------------ reading the executor's map
    def _query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        path = self.compute_dir / "slurm_compute.sqlite3"
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            return db.execute(sql, args).fetchall()
        finally:
            db.close()

    def slurm_node_of(self, node_id: str) -> str:
        rows = self._query("SELECT slurm_node FROM nodes WHERE node_id = ? AND deleted = 0",
                           node_id)
        if not rows or not rows[0][0]:
            raise SystemExit(f"stack-slurm: {node_id} has no Slurm node")
        return str(rows[0][0])

    def attempt_nodes(self) -> dict[int, list[str]]:
        """Each attempt of the story's job: the Slurm nodes its batch job ran on."""
        rows = self._query("SELECT job_id, attempt, slurm_nodes FROM attempts ORDER BY attempt")
        return {int(a): list(json.loads(nodes)) for job, a, nodes in rows
                if JOB_ID in str(job)}

    def inject_xid(self, stack: Stack, victim: str) -> str:
        """The fault: one NVIDIA driver line appended to the node's kernel log, the file that
        node's agent reads (``SlurmCompute.kernel_log``)."""
        assert self.watch is not None
        slurm_node = self.slurm_node_of(victim)
        path = self.compute_dir / "nodes" / safe_name(slurm_node) / "kern.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.watch.arm(slurm_node)
        with path.open("a", encoding="utf-8") as handle:
            handle.write(xid_line(79))
        return (f"XID 79 (GPU fell off the bus) appended to {slurm_node}'s kernel log "
                f"({path}), which {victim}'s node agent reads")

    def sinfo(self) -> str:
        return sinfo_text(self.cluster.slurm_conf) if self.cluster else ""

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        super().stop()
        if self.cluster is not None:
            self.cluster.stop()
            self.log(f"stack: stopped the Slurm cluster in {self.slurm_dir}")
            self.cluster = None
        if self._made_slurm_dir and self.slurm_dir is not None:
            shutil.rmtree(self.slurm_dir, ignore_errors=True)


def _indent(text: str) -> str:
    return "\n".join(f"           {line}" for line in text.splitlines())


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    """The story on the production topology; what it measured and saw (``--json-out``)."""
    from rich.markup import escape

    t0 = time.time()
    stack = SlurmStack(args.state_dir.resolve(), log=lambda m: console.print(f"[dim]{escape(m)}"))
    snapshots: list[dict[str, Any]] = []

    def show_sinfo(env: Envelope) -> None:
        if env.type in SINFO_AFTER and stack.cluster is not None:
            text = stack.sinfo()
            snapshots.append({"after": env.type, "at": round(env.time - t0, 3), "sinfo": text})
            console.print(f"[dim]{escape(_indent(text))}[/dim]")

    timeline = Timeline(console, t0, stack, after=show_sinfo)
    result: dict[str, Any] = {"ok": False}
    console.rule("[bold]mtc on the production topology: emulators, functions, the executor, "
                 "real Slurm")
    with running(stack, timeline):
        console.print(f"[dim]{escape(_indent(stack.sinfo()))}[/dim]")
        job = story(stack, args.steps, console, t0, inject=stack.inject_xid, timeout_s=240)
        ok = print_result(console, stack, timeline, job, t0)
        assert stack.watch is not None and stack.cluster is not None
        stack.watch.stop()
        victim = stack.watch.node
        attempts = stack.attempt_nodes()
        final = {n.name: (n.state, n.drained) for n in stack.watch.slurm.nodes()}
        latencies = stack.watch.latencies()
        progress = job.get("mtcProgress") or {}
        result = {
            "ok": ok, "state": job["state"], "restarts": progress.get("restartCount"),
            "victim": victim, "attempt_nodes": attempts,
            "resumed_step": stack.watch.resumed_step,
            "drain_reason": stack.watch.drain_reason,
            "last_checkpoint": (progress.get("latestCheckpoint") or {}).get("step"),
            "victim_final": {"state": final.get(victim, ("?", True))[0],
                             "drained": final.get(victim, ("?", True))[1]},
            **latencies, "milestones": milestones(timeline.seen, stack.watch.fault_at),
            "sinfo": snapshots, "wall_s": round(time.time() - t0, 1),
            "executor_counts": _executor_counts(stack)}
        console.print(f"fault-to-drain: {latencies['fault_to_drain_s']} s (sinfo shows "
                      f"{victim} DRAIN); fault-to-resumed: {latencies['fault_to_resumed_s']} s "
                      f"(resumed from step {stack.watch.resumed_step} on "
                      f"{','.join(attempts.get(2, []))})")
        console.print(f"executor: {result['executor_counts']}")
        console.print(escape(stack.sinfo()))
        if args.keep:
            console.print("[bold]running; Ctrl-C stops everything")
            while True:
                time.sleep(3600)
    return result


def _executor_counts(stack: SlurmStack) -> dict[str, Any]:
    assert stack.store is not None
    docs = stack.store.read("executors", {"executor_id": stack.executor_id})
    return dict(docs[0].get("counts") or {}) if docs else {}


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, default=ROOT / "var" / "stack-slurm")
    parser.add_argument("--steps", type=int, default=300, help="training steps of the job")
    parser.add_argument("--json-out", type=Path, help="write what was measured here (JSON)")
    parser.add_argument("--keep", action="store_true",
                        help="keep everything running after the story until Ctrl-C")
    args = parser.parse_args(argv)
    console = Console(highlight=False)
    try:
        result = run(args, console)
    except KeyboardInterrupt:
        console.print("[bold]interrupted: stopping everything")
        return 1
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=1, default=str))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
