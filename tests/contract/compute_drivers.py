"""Drivers for the Compute contract suite: how to run each implementation's machines.

A driver builds one ``Compute`` with what it emits recorded, and knows how time passes for it
(a manual clock and ``poll()``, real processes, SimPy time) and how its workers behave like
``examples/train.py``: they save ``ckpt-<step>`` checkpoints while they run and, on SIGTERM,
save one more and exit 75. The assertions live in ``test_compute_port.py`` and are the same
for every driver; a new adapter adds a driver here and nothing else.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from shared.adapters.compute.local.compute import LocalCompute
from shared.adapters.compute.protocol import (
    ExitCode,
    checkpoint_name,
    checkpoint_steps,
    recovery_env,
)
from shared.adapters.compute.slurm.api import job_name
from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.domain.events import Envelope, Event
from shared.domain.model import Node, NodeRole, NodeState
from shared.ports import Compute, Gang, RecoveryPlan
from shared.probes.commands import ToolNotFound
from tests.harness import FakeCompute, ManualClock, Recorder, one_pool_gang
from tests.unit.compute.slurm.fake_slurm import FakeSlurm

JOB = "train"  # the simulator's job model knows its jobs by the scenario's names
WORLD = 2

# A training program as the worker protocol wants it: it says when it is ready (its SIGTERM
# handler is installed), saves a checkpoint on SIGTERM (rank 0) and exits 75.
PROGRAM = r'''
import os, signal, sys, time
from pathlib import Path
ckpt = Path(os.environ["AIP_CHECKPOINT_DIR"])
rank = os.environ["RANK"]
def on_term(*_):
    if rank == "0":
        steps = [int(p.name.split("-")[1].split(".")[0]) for p in ckpt.glob("ckpt-*")]
        step = max(steps, default=0) + 1
        tmp = ckpt / f".ckpt-{step:08d}.tmp"
        tmp.write_text("saved on SIGTERM")
        os.replace(tmp, ckpt / f"ckpt-{step:08d}")
    sys.exit(75)
signal.signal(signal.SIGTERM, on_term)
ready = Path(sys.argv[1]) / f"ready-{os.environ['MTC_JOB_ATTEMPT']}-{rank}"
ready.write_text(os.environ.get("MTC_RECOVERY_MODE", "") + " "
                 + os.environ.get("MTC_RECOVERY_FRESH", ""))
while True:
    time.sleep(0.01)
'''


def make_node(node_id: str) -> Node:
    return Node(node_id, "c", "pool", "train", NodeRole.WORKER, "a3-highgpu-8g",
                "NVIDIA_H100_80GB", 8, NodeState.PROVISIONING, 0.0)


class Driver:
    """What every driver offers the contract (defaults suit a poll-driven adapter)."""

    name = "?"
    compute: Compute
    events: Recorder
    max_settles = 200

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.events = Recorder()

    # -- time
    def settle(self) -> None:
        """Let a little time pass and collect what happened."""
        raise NotImplementedError

    def until(self, done: Callable[[], bool], what: str) -> None:
        for _ in range(self.max_settles):
            if done():
                return
            self.settle()
        if not done():
            raise AssertionError(f"{self.name}: {what} did not happen")

    # -- workers
    def gang(self, attempt: int, node_ids: Sequence[str],
             recovery: RecoveryPlan | None = None) -> Gang:
        gang = one_pool_gang(JOB, attempt, node_ids, self.command(), out=self.tmp / "out" / JOB)
        return replace(gang, recovery=recovery)

    def recovery_seen(self, attempt: int, rank: int) -> tuple[str, str] | None:
        """What the rank was told of its attempt's recovery (``MTC_RECOVERY_MODE``,
        ``MTC_RECOVERY_FRESH``); None where the workers have no environment to look at
        (the twin's analytic job model: it reads ``Gang.recovery`` for its costs)."""
        return None

    def command(self) -> tuple[str, ...]:
        return ("true",)

    def running(self, attempt: int) -> None:
        """Wait until the attempt's workers run (and would checkpoint on SIGTERM)."""

    def checkpoint(self, attempt: int) -> None:
        """The running workers save one more checkpoint."""
        raise NotImplementedError

    def launches(self, attempt: int) -> int:
        """How many times the attempt was launched on the machines."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class FileCheckpoints:
    """Workers that checkpoint into the shared file system (local, Slurm)."""

    tmp: Path

    def write_checkpoint(self) -> None:
        directory = self.tmp / "out" / JOB / "checkpoints"
        directory.mkdir(parents=True, exist_ok=True)
        step = max(checkpoint_steps(directory), default=0) + 10
        tmp = directory / f".{checkpoint_name(step)}.tmp"
        tmp.write_text("saved")
        os.replace(tmp, directory / checkpoint_name(step))


class FakeDriver(Driver):
    """``tests.harness.FakeCompute``; the driver plays its machines."""

    name = "fake"

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.fake = FakeCompute(emit=self.events)
        self.compute = self.fake
        self._steps: dict[str, int] = {}

    def settle(self) -> None:
        self.fake.clock.advance(1.0)
        self.fake.complete_provisioning()
        self.fake.complete_repairs()
        self.fake.complete_deep_checks()
        for job_id, attempt in self.fake.signalled:  # the program's answer to SIGTERM
            self.checkpoint(attempt)
            self.fake.exit_workers(job_id, attempt, ExitCode.PREEMPTED)

    def checkpoint(self, attempt: int) -> None:
        if self.fake.ledger.attempt_ended(JOB, attempt):
            return
        step = self._steps[JOB] = self._steps.get(JOB, 0) + 10
        self.fake.checkpoint(JOB, attempt, step)

    def launches(self, attempt: int) -> int:
        return sum(1 for s in self.fake.started if (s.job_id, s.attempt, s.rank) == (JOB, attempt, 0))

    def recovery_seen(self, attempt: int, rank: int) -> tuple[str, str] | None:
        """The fake runs nothing: what it was handed, as the environment would say it."""
        [gang] = [g for g in self.fake.gangs if (g.job_id, g.attempt) == (JOB, attempt)]
        env = recovery_env(gang.recovery, attempt, gang.node_ids[rank])
        return env.get("MTC_RECOVERY_MODE", ""), env.get("MTC_RECOVERY_FRESH", "")


class LocalDriver(FileCheckpoints, Driver):
    """``LocalCompute`` with real subprocess workers on a manual clock."""

    name = "local"
    max_settles = 1000  # real processes: ~20 s at most

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.clock = ManualClock(1000.0)
        self.local = LocalCompute(tmp / "state", self.results(), self.clock, heartbeats=False,
                                  python=sys.executable)
        self.compute = self.local
        self.ctrl = tmp / "ctrl"
        self.ctrl.mkdir()
        self.program = tmp / "program.py"
        self.program.write_text(PROGRAM)

    def results(self) -> Callable[[Event], None]:
        """Where the adapter's events go: straight to the recorder."""
        return self.events

    def settle(self) -> None:
        self.clock.advance(0.25)
        self.local.poll()
        time.sleep(0.02)

    def command(self) -> tuple[str, ...]:
        return (sys.executable, str(self.program), str(self.ctrl))

    def running(self, attempt: int) -> None:
        ranks = [self.ctrl / f"ready-{attempt}-{r}" for r in range(WORLD)]
        deadline = time.monotonic() + 20.0
        while not all(p.exists() for p in ranks):
            if time.monotonic() > deadline:
                raise AssertionError("local workers did not start")
            time.sleep(0.02)

    def checkpoint(self, attempt: int) -> None:
        self.write_checkpoint()

    def launches(self, attempt: int) -> int:
        return sum(1 for w in self.local.workers(JOB) if (w.attempt, w.rank) == (attempt, 0))

    def recovery_seen(self, attempt: int, rank: int) -> tuple[str, str] | None:
        """What the program found in its environment (it writes it to its ready file)."""
        mode, _, fresh = (self.ctrl / f"ready-{attempt}-{rank}").read_text().partition(" ")
        return mode, fresh

    def close(self) -> None:
        self.local.kill_all()
        self.local.close()


class RemoteDriver(LocalDriver):
    """``RemoteCompute`` -> an in-process bus that delivers every request twice, in order per
    key -> the executor (``services.executor``) -> ``LocalCompute``, whose results travel
    back through the Pub/Sub binding (``shared.codec``) as the executor publishes them."""

    name = "remote"

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        from services.executor.dedup import DedupRecord
        from services.executor.executor import Executor
        from shared.adapters.compute.remote.bus import MemoryRequestBus
        from shared.adapters.compute.remote.compute import RemoteCompute

        self.bus = MemoryRequestBus(duplicate=True)
        self.compute = RemoteCompute(self.bus, self.clock, ttl_s=120.0)
        self.dedup = DedupRecord(tmp / "executor")
        self.executor = Executor(self.bus, self.local, self.dedup, self.clock)

    def results(self) -> Callable[[Event], None]:
        from shared.adapters.outbox import SourceEmitter
        from shared.codec import from_pubsub_message, to_pubsub

        def over_pubsub(envelope: Envelope) -> None:
            data, attributes = to_pubsub(envelope)
            self.events(from_pubsub_message({"attributes": attributes, "data": data}).event)

        return SourceEmitter(over_pubsub, self.clock, "//mtc/compute/local")

    def settle(self) -> None:
        self.clock.advance(0.25)
        self.executor.step(timeout_s=0.0)  # the requests that arrived, then a poll
        time.sleep(0.02)

    def running(self, attempt: int) -> None:
        self.executor.step(timeout_s=0.0)  # the start request reaches the machines
        super().running(attempt)

    def close(self) -> None:
        super().close()
        self.dedup.close()


def no_gpu_tools(argv: Sequence[str], timeout_s: float) -> Any:
    """The in-memory Slurm's nodes have no srun, dcgmi or all_reduce_perf."""
    raise ToolNotFound(f"{argv[0]} not found on PATH")


class SlurmDriver(FileCheckpoints, Driver):
    """``SlurmCompute`` over the in-memory Slurm of its unit tests; the driver plays slurmd
    (a reboot finishes) and the batch job's ranks (checkpoint and exit files)."""

    name = "slurm"

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.clock = ManualClock(1000.0)
        self.slurm = FakeSlurm()
        self.slurm_compute = SlurmCompute(tmp / "compute", self.events, self.clock,
                                          cli=self.slurm, agent_probes=("xid", "disk"),
                                          observe_interval_s=0.0, agent_interval_s=1e9,
                                          deep_check_runner=no_gpu_tools)
        self.compute = self.slurm_compute
        self._answered: set[str] = set()

    def settle(self) -> None:
        self.clock.advance(0.5)
        for node in self.slurm.nodes.values():
            if "REBOOT_REQUESTED" in node.flags:
                self.slurm.finish_reboot(node.name)
        for call in self.slurm.calls:
            if call[0] == "signal" and call[2] == "TERM" and call[1] not in self._answered:
                self._answered.add(call[1])
                self._on_sigterm(int(call[1]))
        self.slurm_compute.poll()

    def _on_sigterm(self, slurm_id: int) -> None:
        job = self.slurm.queue[slurm_id]
        match = re.search(r"-a(\d+)-[0-9a-f]+$", job.name)
        assert match is not None, job.name
        attempt = int(match.group(1))
        self.write_checkpoint()
        run_dir = self.slurm_compute.run_dir(JOB, attempt)
        for rank in range(WORLD):
            (run_dir / f"rank-{rank}.exit").write_text(f"{int(ExitCode.PREEMPTED)}\n")
        job.state = "COMPLETED"

    def checkpoint(self, attempt: int) -> None:
        self.write_checkpoint()

    def launches(self, attempt: int) -> int:
        name = job_name(JOB, attempt, self.slurm_compute.instance)
        return sum(1 for c in self.slurm.calls if c == ("sbatch", name))

    def recovery_seen(self, attempt: int, rank: int) -> tuple[str, str] | None:
        """What task.sh exports to the rank: the mode for all, the fresh mark per node."""
        script = (self.slurm_compute.run_dir(JOB, attempt) / "task.sh").read_text()
        mode = re.search(r"export MTC_RECOVERY_MODE=(\S+)", script)
        hosts = re.findall(r"MTC_NODE_ID=(\S+?)(?: MTC_RECOVERY_FRESH=(\d))? ;;", script)
        fresh = hosts[rank][1] if rank < len(hosts) else ""
        return (mode.group(1) if mode else ""), fresh

    def close(self) -> None:
        self.slurm_compute.close()


class GceDriver(LocalDriver):
    """``MachinesAndWorkers``: ``GceCompute`` through the real ``google-cloud-compute``
    client against the local Compute Engine stand-in (``tests/gce_standin.py``; no emulator
    exists), with ``LocalCompute``'s real subprocess workers on the machines."""

    name = "gce"

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        from google.auth.credentials import AnonymousCredentials

        from shared.adapters.compute.gce.api import GceApi, GceConfig
        from shared.adapters.compute.gce.compute import GceCompute
        from shared.adapters.compute.gce.split import MachinesAndWorkers
        from tests.gce_standin import ComputeStandin

        self.standin = ComputeStandin().start()
        api = GceApi(GceConfig("contract", "us-central1-a"), api_endpoint=self.standin.endpoint,
                     credentials=AnonymousCredentials())
        self.machines = GceCompute(tmp / "gce", self.events, self.clock, api,
                                   retry_initial_s=0.25, watch_interval_s=5.0)
        self.split = MachinesAndWorkers(self.machines, self.local)
        self.compute = self.split

    def settle(self) -> None:
        self.clock.advance(0.25)
        self.split.poll()
        time.sleep(0.02)

    def close(self) -> None:
        super().close()
        self.machines.close()
        self.standin.close()


class _RecordingBus:
    """The simulator's bus, reduced to what SimCompute calls: events are recorded, not
    delivered to handlers (the contract is about the adapter, not the control plane)."""

    def __init__(self, record: Callable[[Event], None]) -> None:
        self._record = record

    def listen(self, listener: Callable[[Any], None], *events: type[Event]) -> None:
        """Nothing is delivered here, so nothing is listened to."""

    def emit(self, event: Event, source: str) -> None:
        self._record(event)


SIM_SCENARIO: dict[str, Any] = {
    "name": "contract",
    "seed": 5,
    "duration": "1d",
    "checkpoint_events": "all",
    "cluster": {"cluster_id": "c", "partitions": [{"name": "train", "nodes": WORLD, "spares": 0}],
                "provision": "1m"},
    "jobs": [{"name": JOB, "nodes": WORLD, "step_time": "10s", "checkpoint_interval": "10m",
              "checkpoint_save": "20s", "checkpoint_restore": "30s", "startup": "1m",
              "mfu": 0.4}],
    "failures": {"reference": {"nodes": 1, "days": 1},
                 "causes": {"gpu_off_bus": {"per_1000_node_days": 1, "signal": {"xid": [79]},
                                            "fix": "reboot"}}},
    "repair": {"durations": {"reset_gpu": "1m", "reboot": "2m", "reimage": "3m",
                             "replace": "5m"}, "verify_interval": "30s"},
    "bus": {"latency": "50ms"},
}


class SimDriver(Driver):
    """The simulator's ``SimCompute`` on a SimPy environment; its workers are the analytic
    job model, which checkpoints on its own schedule and saves on SIGTERM."""

    name = "sim"

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        import numpy as np
        import simpy

        from simulator.compute import SimCompute
        from simulator.failures import FailureModel
        from simulator.scenario import parse_scenario

        scenario = parse_scenario(SIM_SCENARIO)
        self.env = simpy.Environment()
        rng = np.random.default_rng(5)
        self.sim = SimCompute(self.env, scenario, _RecordingBus(self.events),  # type: ignore[arg-type]
                              FailureModel(scenario.failures, rng), rng,
                              return_after_passes=2, heartbeat_timeout_s=60.0)
        self.sim.add_job(scenario.jobs[0])
        self.compute = self.sim
        self.cycle_s = 10 * 60 + 20

    def settle(self) -> None:
        self.env.run(until=float(self.env.now) + 30.0)

    def running(self, attempt: int) -> None:
        self.env.run(until=float(self.env.now) + 5 * 60.0)  # startup and restore are over

    def checkpoint(self, attempt: int) -> None:
        self.env.run(until=float(self.env.now) + self.cycle_s)

    def launches(self, attempt: int) -> int:
        """Attempts the job model launched (the contract asks about the job's first)."""
        return int(self.sim.fleet.jobs[JOB].truth.attempts)


DRIVERS: dict[str, type[Driver]] = {
    "fake": FakeDriver,
    "local": LocalDriver,
    "remote": RemoteDriver,
    "slurm": SlurmDriver,
    "sim": SimDriver,
    "gce": GceDriver,
}
