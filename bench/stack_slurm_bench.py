"""Fault-to-drain and fault-to-resumed on real Slurm: the production topology vs embedded.

    .venv/bin/python bench/stack_slurm_bench.py [--trials 3] [--steps 300] [--out FILE]

One run measures, trial after trial, the same self-healing story on two topologies, each
over its own fresh Slurm 22.05 cluster (scripts/slurm/cluster.sh) on this host:

* embedded over Slurm (``make demo-slurm``): one process, sqlite store, outbox bus,
  ``SlurmCompute`` called by the handlers directly;
* the production topology (``make stack-slurm``: scripts/stack_slurm.py): the Pub/Sub and
  Firestore emulators, every function under functions-framework with
  ``MTC_COMPUTE=remote``, the compute executor applying the requests with ``SlurmCompute``.

The story is the same (a 2-node job of examples/train.py, 0.05 s steps, a checkpoint every
20; an XID 79 line appended to one of its nodes' kernel log once it has checkpointed; the
node agents' probes every second) and so is the watcher (``stack_slurm.SlurmWatch``, polling
``sinfo --json`` and the Slurm job output every 0.1 s): fault-to-drain is from the append to
the first ``sinfo`` showing the node DRAIN, fault-to-resumed to the first ``resumed from
step`` line the next attempt writes. The ratio production/embedded is what to compare: the
machine is noisy, the topologies run back to back.
"""

from __future__ import annotations

import sys
from pathlib import Path as _Path

ROOT = _Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "scripts"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from stack_slurm import MILESTONES, SlurmWatch, milestones  # noqa: E402

from services.cli import demo_slurm  # noqa: E402
from shared.adapters.compute.slurm.cli import SlurmCli  # noqa: E402
from shared.domain.model import JobState  # noqa: E402


def embedded_trial(steps: int) -> dict[str, Any]:
    """``make demo-slurm``'s story, with the watcher armed at the fault."""
    from services.wiring.embedded import embedded

    tmp = Path(tempfile.mkdtemp(prefix="mtc-be-"))
    tmp.chmod(0o755)  # munged (user munge) must reach the cluster dir inside
    demo_slurm.console.quiet = True
    cluster = demo_slurm.start_cluster(tmp / "slurm")
    app = embedded(tmp / "state", compute="slurm", slurm_conf=cluster.slurm_conf,
                   config=demo_slurm.demo_config())
    compute = app.compute
    watch = SlurmWatch(SlurmCli(timeout_s=10.0, slurm_conf=cluster.slurm_conf),
                       lambda: sorted((compute.state_dir / "logs").glob("*/slurm.out")))
    inject = compute.inject_xid

    def armed(node_id: str, xid: int = 79, **line: Any) -> Path:
        watch.arm(compute.slurm_node_of(node_id))
        return inject(node_id, xid, **line)

    compute.inject_xid = armed  # type: ignore[method-assign]
    seen: list[Any] = []
    app.bus.listeners.append(lambda env, outcomes: seen.append(env))
    try:
        final = demo_slurm.run_story(app, steps=steps)
        ok = final.state is JobState.SUCCEEDED
        time.sleep(0.5)
        return {"ok": ok, **watch.latencies(), "milestones": milestones(seen, watch.fault_at)}
    finally:
        watch.stop()
        compute.kill_all()
        compute.close()
        app.close()
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def production_trial(steps: int) -> dict[str, Any]:
    """scripts/stack_slurm.py in its own process (it owns the emulators' environment)."""
    tmp = Path(tempfile.mkdtemp(prefix="mtc-bp-"))
    try:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "stack_slurm.py"), "--state-dir",
             str(tmp / "stack"), "--steps", str(steps), "--json-out", str(tmp / "r.json")],
            capture_output=True, text=True, timeout=600, cwd=ROOT)
        if proc.returncode != 0 or not (tmp / "r.json").exists():
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise SystemExit(f"stack_slurm.py failed ({proc.returncode}):\n{tail}")
        result = json.loads((tmp / "r.json").read_text())
        return {"ok": bool(result["ok"]), "fault_to_drain_s": result["fault_to_drain_s"],
                "fault_to_resumed_s": result["fault_to_resumed_s"],
                "milestones": result.get("milestones", {})}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _summary(trials: list[dict[str, Any]], key: str) -> dict[str, float | None]:
    values = [t[key] for t in trials if t.get(key) is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": round(statistics.median(values), 3), "min": min(values),
            "max": max(values), "n": len(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, Any]]] = {"embedded": [], "production": []}
    for trial in range(args.trials):  # alternate: a noisy minute hits both
        for name, run in (("embedded", embedded_trial), ("production", production_trial)):
            started = time.monotonic()
            results[name].append(run(args.steps))
            got = results[name][-1]
            print(f"trial {trial + 1} {name:10s}: fault-to-drain {got['fault_to_drain_s']} s, "
                  f"fault-to-resumed {got['fault_to_resumed_s']} s, ok={got['ok']} "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
    table: dict[str, Any] = {}
    print(f"\n{'':12s}{'fault-to-drain (median, min-max)':36s}fault-to-resumed (median, min-max)")
    for name, trials in results.items():
        table[name] = {k: _summary(trials, k) for k in ("fault_to_drain_s",
                                                         "fault_to_resumed_s")}
        cells = [f"{s['median']} s ({s['min']}-{s['max']})"
                 for s in table[name].values()]
        print(f"{name:12s}{cells[0]:36s}{cells[1]}")
    ratios = {}
    for key in ("fault_to_drain_s", "fault_to_resumed_s"):
        prod, emb = table["production"][key]["median"], table["embedded"][key]["median"]
        ratios[key] = round(prod / emb, 2) if prod and emb else None
    print(f"production / embedded: drain x{ratios['fault_to_drain_s']}, "
          f"resumed x{ratios['fault_to_resumed_s']}")
    print("\nfrom the fault to each event (median s):  embedded  production")
    hops: dict[str, dict[str, float | None]] = {}
    for kind in MILESTONES:
        hop = kind.split(".")[2]
        hops[hop] = {}
        for name, trials in results.items():
            values = [t["milestones"][hop] for t in trials if hop in t.get("milestones", {})]
            hops[hop][name] = round(statistics.median(values), 3) if values else None
        print(f"  {hop:38s}{hops[hop]['embedded']!s:>10s}{hops[hop]['production']!s:>12s}")
    table["milestones"] = hops
    if args.out:
        args.out.write_text(json.dumps({"trials": results, "summary": table,
                                        "ratios": ratios}, indent=1))
    ok = all(t["ok"] for trials in results.values() for t in trials)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
