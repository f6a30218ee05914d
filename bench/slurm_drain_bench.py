"""Fault-to-drain latency on a real Slurm cluster: mtc vs Slurm's own health-check drain.

    .venv/bin/python bench/slurm_drain_bench.py [--trials 30] [--interval 2] [--out FILE]

One run starts a private Slurm 22.05 cluster (scripts/slurm/cluster.sh, n1-n4 + c1-c2 on
this host) and measures, trial after trial, the same fault on two nodes at the same moment:

* plain drain (n1): slurmd runs the node agent as ``HealthCheckProgram`` every
  ``HealthCheckInterval`` seconds (``mtc-agent --slurm-healthcheck --drain-on-fault``); on a
  fault it runs ``scontrol update state=drain`` itself. That is what a site without mtc does.
* mtc (n2-n4, an mtc cluster of three nodes on ``SlurmCompute``): the node's agent (the same
  probes, run every ``--interval`` seconds) reports, health_triage diagnoses, repair decides
  (ladder, blast-radius guard) and cordons: ``scontrol update state=drain``.

The fault is one ``NVRM: Xid ... 79`` line appended to the kernel log each detector reads
(``hc/n1.log`` for the plain agent, the mtc node's ``kern.log``), both within a millisecond.
Latency is from the append to the first ``sinfo --json`` (polled every ``--watch`` seconds by
a separate thread) that shows the node DRAIN; the time slurmctld logged the drain
(``update_node: node X state set to DRAIN...``, millisecond stamps) is reported as well.

Same probe cadence: ``HealthCheckInterval`` is whole seconds (1 is the least Slurm accepts),
so mtc's agents run at the same ``--interval``; the plain HealthCheckProgram is limited to
n1 (it exits at once elsewhere) so four agents a second do not load a 2-core host. Between
trials n1 is resumed by hand; mtc repairs its node itself (reboot, checks, resume), and the
next trial uses an mtc node that is back. The repair policy is set so that repeated trials do
not climb the ladder or trip the guard (not what is measured here): escalation window 0,
no lemon count, no out-of-service limit.

Exit status 0 when mtc's p50 and p99 are within 2x of the plain drain's.
"""

from __future__ import annotations

import sys
from pathlib import Path as _Path

sys.path.insert(0, str(_Path(__file__).resolve().parents[1]))

import argparse
import datetime as dt
import json
import math
import random
import re
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from services.cli.demo_slurm import cluster_spec, start_cluster
from services.job_submission import commands as job_commands
from services.wiring.embedded import EmbeddedApp, embedded
from shared.adapters.compute.slurm.api import xid_line
from shared.adapters.compute.slurm.cli import SlurmCli, SlurmError
from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.config import ControlPlaneConfig
from shared.domain.events import Envelope
from shared.domain.model import NodeState
from shared.handling import Outcome
from shared.policies.repair import RepairConfig

ROOT = Path(__file__).resolve().parents[1]
PLAIN_NODE = "n1"
MTC_NODES = ("n2", "n3", "n4")
CLUSTER_ID = "bench"
DRAIN_LOG_RE = re.compile(r"^\[(?P<ts>[0-9T:.-]+)\] update_node: node (?P<node>\S+) state set to DRAIN")


@dataclass
class Watcher:
    """Polls sinfo in its own thread; records when each armed node first shows DRAIN."""

    slurm: SlurmCli
    period_s: float
    armed: dict[str, float] = field(default_factory=dict)  # node -> armed at (monotonic)
    seen: dict[str, float] = field(default_factory=dict)  # node -> first DRAIN (monotonic)
    polls: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def arm(self, nodes: Sequence[str]) -> None:
        with self._lock:
            for node in nodes:
                self.armed[node] = time.monotonic()
                self.seen.pop(node, None)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                nodes = self.slurm.nodes()
            except SlurmError:
                nodes = []
            at = time.monotonic()
            self.polls += 1
            with self._lock:
                for node in nodes:
                    if node.name in self.armed and node.name not in self.seen and node.drained:
                        self.seen[node.name] = at
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()


def both_drained(watcher: Watcher, nodes: Sequence[str]) -> Callable[[], bool]:
    return lambda: all(node in watcher.seen for node in nodes)


def write_healthcheck(state: Path, hc_dir: Path, slurm_conf: str) -> Path:
    """The plain drain: the node agent as slurmd's HealthCheckProgram, on n1 only."""
    script = state / "plain-healthcheck.sh"
    script.write_text(
        "#!/bin/bash\n"
        "# slurmd runs this with an almost empty environment: absolute paths only\n"
        f'[ "$SLURMD_NODENAME" = {PLAIN_NODE} ] || exit 0\n'
        f"cd {ROOT} || exit 0\n"
        f"exec {sys.executable} -m services.node_agent --slurm-healthcheck --drain-on-fault \\\n"
        f"  --slurm-conf {slurm_conf} --mount {hc_dir} \\\n"
        f'  --xid-source {hc_dir}/"$SLURMD_NODENAME".log --xid-cursor {hc_dir}/"$SLURMD_NODENAME".cursor \\\n'
        f"  >/dev/null 2>>{hc_dir}/healthcheck.err\n"
    )
    script.chmod(0o755)
    return script


def bench_config() -> ControlPlaneConfig:
    repair = RepairConfig(
        escalation_window_s=0.0,
        lemon_failure_count=1_000_000,
        max_out_of_service_fraction=1.0,
        max_removals_in_window=1_000_000,
    )
    return replace(ControlPlaneConfig(), repair=repair, heartbeat_timeout_s=120.0)


def drains_logged(log_path: Path, since_wall: float) -> dict[str, float]:
    """Node -> wall time slurmctld logged its first drain after ``since_wall``."""
    out: dict[str, float] = {}
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        m = DRAIN_LOG_RE.match(line)
        if not m:
            continue
        at = dt.datetime.fromisoformat(m["ts"]).timestamp()  # local time, as slurmctld writes it
        if at >= since_wall - 0.001 and m["node"] not in out:
            out[m["node"]] = at
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (p99 of 20 trials is the worst one)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
    }


def mtc_node_ready(app: EmbeddedApp, compute: SlurmCompute, slurm: SlurmCli) -> str | None:
    """An mtc node back in service (IDLE) whose Slurm node is available again."""
    with app.transaction() as uow:
        idle = sorted(
            n.node_id
            for n in uow.nodes.list(CLUSTER_ID)
            if n.state is NodeState.IDLE and not n.node_id.endswith("-login")
        )
    for node_id in idle:
        name = compute.slurm_node_of(node_id)
        if name and slurm.node(name).available:
            return node_id
    return None


def all_back(app: EmbeddedApp) -> bool:
    with app.transaction() as uow:
        return all(n.state is NodeState.IDLE for n in uow.nodes.list(CLUSTER_ID))


def run(args: argparse.Namespace) -> dict[str, Any]:
    state = Path(tempfile.mkdtemp(prefix="mtc-slurm-bench-"))
    state.chmod(0o755)  # munged (user munge) must reach the cluster's socket dir below
    hc_dir = state / "hc"
    hc_dir.mkdir()
    slurm_dir = state / "slurm"
    conf = str(slurm_dir / "etc" / "slurm.conf")
    (hc_dir / f"{PLAIN_NODE}.log").write_text("")
    script = write_healthcheck(state, hc_dir, conf)
    print(f"starting a Slurm cluster in {slurm_dir} (HealthCheckInterval={args.interval}) ...", flush=True)
    cluster = start_cluster(slurm_dir, healthcheck_program=str(script), healthcheck_interval_s=args.interval)
    slurm = SlurmCli(timeout_s=10.0, slurm_conf=conf)
    app = embedded(
        state / "mtc",
        compute="slurm",
        slurm_conf=conf,
        config=bench_config(),
        compute_options={"slurm_nodes": (*MTC_NODES, "c1", "c2"), "agent_interval_s": float(args.interval)},
    )
    compute: SlurmCompute = app.compute
    watcher = Watcher(slurm, args.watch)
    thread = threading.Thread(target=watcher.run, name="sinfo-watch", daemon=True)
    marks: dict[str, float] = {}

    def listen(env: Envelope, outcomes: dict[str, Outcome]) -> None:
        data = env.event.to_dict()
        if env.type.endswith("health_reported.v1") and any(
            c["type"] == "XidError" and c["status"] == "true" for c in data["conditions"]
        ):
            marks.setdefault("reported", time.monotonic())
        elif env.type.endswith("node.diagnosed.v1"):
            marks.setdefault("diagnosed", time.monotonic())

    app.bus.listeners.append(listen)
    trials: list[dict[str, Any]] = []
    rng = random.Random(args.seed)
    try:
        with app.transaction() as uow:
            job_commands.create_cluster(cluster_spec(CLUSTER_ID, nodes=len(MTC_NODES), spares=0),
                                        uow, app.deps)
        if not app.run(lambda: mtc_node_ready(app, compute, slurm) is not None, timeout_s=60, poll_s=0.05):
            raise SystemExit("the mtc cluster did not come up")
        print(f"mtc nodes: {compute.mapping()}; plain-drain node: {PLAIN_NODE}", flush=True)
        thread.start()
        time.sleep(2 * args.interval)  # the health check has run on the fresh n1
        for trial in range(args.trials):
            if not app.run(
                lambda: mtc_node_ready(app, compute, slurm) is not None and slurm.node(PLAIN_NODE).available,
                timeout_s=90,
                poll_s=0.05,
            ):
                raise SystemExit("no mtc node came back / n1 not available")
            node_id = mtc_node_ready(app, compute, slurm)
            assert node_id is not None
            mtc_slurm = compute.slurm_node_of(node_id) or ""
            # a random phase against both detectors' cycles (else the previous trial sets it)
            app.run(lambda: False, timeout_s=rng.uniform(0.0, 2.0 * args.interval), poll_s=0.05)
            marks.clear()
            watcher.arm([PLAIN_NODE, mtc_slurm])
            line = xid_line(79, pid=1000 + trial)
            wall0 = time.time()
            t_plain = time.monotonic()
            with (hc_dir / f"{PLAIN_NODE}.log").open("a") as handle:
                handle.write(line)
            t_mtc = time.monotonic()
            with compute.kernel_log(mtc_slurm).open("a") as handle:
                handle.write(line)
            done = app.run(both_drained(watcher, (PLAIN_NODE, mtc_slurm)), timeout_s=30, poll_s=0.02)
            if not done:
                raise SystemExit(f"trial {trial}: no drain seen within 30 s: {watcher.seen}")
            logged = drains_logged(slurm_dir / "log" / "slurmctld.log", wall0)
            result = {
                "trial": trial,
                "mtc_node": mtc_slurm,
                "plain_s": watcher.seen[PLAIN_NODE] - t_plain,
                "mtc_s": watcher.seen[mtc_slurm] - t_mtc,
                "plain_logged_s": logged.get(PLAIN_NODE, math.nan) - wall0,
                "mtc_logged_s": logged.get(mtc_slurm, math.nan) - wall0,
                "mtc_reported_s": marks.get("reported", math.nan) - t_mtc,
                "mtc_diagnosed_s": marks.get("diagnosed", math.nan) - t_mtc,
            }
            trials.append(result)
            print(
                f"trial {trial:2d}: plain {result['plain_s']:.2f}s  mtc {result['mtc_s']:.2f}s "
                f"({mtc_slurm}; agent report at {result['mtc_reported_s']:.2f}s)",
                flush=True,
            )
            slurm.resume(PLAIN_NODE)
        # no reboot may be in flight when the cluster stops (its slurmd would outlive it)
        app.run(lambda: all_back(app), timeout_s=90, poll_s=0.05)
    finally:
        watcher.stop()
        compute.kill_all()
        compute.close()
        app.close()
        cluster.stop()
        if not args.keep:
            shutil.rmtree(state, ignore_errors=True)
    plain = summarize([t["plain_s"] for t in trials])
    mtc = summarize([t["mtc_s"] for t in trials])
    logged_plain = [t["plain_logged_s"] for t in trials if not math.isnan(t["plain_logged_s"])]
    logged_mtc = [t["mtc_logged_s"] for t in trials if not math.isnan(t["mtc_logged_s"])]
    return {
        "command": " ".join(["bench/slurm_drain_bench.py", *sys.argv[1:]]),
        "interval_s": args.interval,
        "watch_s": args.watch,
        "trials": trials,
        "plain": plain,
        "mtc": mtc,
        "plain_slurmctld_log": summarize(logged_plain) if logged_plain else {},
        "mtc_slurmctld_log": summarize(logged_mtc) if logged_mtc else {},
        "mtc_agent_report": summarize([t["mtc_reported_s"] for t in trials]),
        "mtc_pipeline": summarize([t["mtc_s"] - t["mtc_reported_s"] for t in trials]),
        "ratio_p50": mtc["p50"] / plain["p50"],
        "ratio_p99": mtc["p99"] / plain["p99"],
        "sinfo_polls": watcher.polls,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1, help="seeds the random wait before each fault")
    parser.add_argument("--interval", type=int, default=2, help="HealthCheckInterval = agent interval (s)")
    parser.add_argument("--watch", type=float, default=0.05, help="sinfo poll period (s)")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--keep", action="store_true", help="keep the state dir (logs)")
    args = parser.parse_args(argv)
    if args.trials < 1 or args.interval < 1:
        parser.error("--trials and --interval must be >= 1")
    res = run(args)
    print()
    print(f"{'':18}{'p50':>8}{'p99':>8}{'mean':>8}{'min':>8}{'max':>8}   (s, {len(res['trials'])} trials)")
    for name, key in (
        ("plain drain", "plain"),
        ("mtc", "mtc"),
        ("  slurmctld log", "mtc_slurmctld_log"),
        ("  agent report", "mtc_agent_report"),
        ("  report->DRAIN", "mtc_pipeline"),
        ("plain, ctld log", "plain_slurmctld_log"),
    ):
        s = res[key]
        if s:
            print(f"{name:18}{s['p50']:8.2f}{s['p99']:8.2f}{s['mean']:8.2f}{s['min']:8.2f}{s['max']:8.2f}")
    print(f"mtc / plain: p50 {res['ratio_p50']:.2f}x, p99 {res['ratio_p99']:.2f}x (limit 2x)")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2) + "\n")
    return 0 if res["ratio_p50"] <= 2.0 and res["ratio_p99"] <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
