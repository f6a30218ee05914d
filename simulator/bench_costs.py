"""Recovery costs fitted from a live `mtc bench recovery` run, and the twin's scenario of its trace.

A live run (a ``--json`` document's run, or the run just played) is scored per incident:
detection (fault to the control plane's first reaction), fault-to-resumed, and the mode the
recovery policy chose. :func:`fit_run` turns that into :class:`RecoveryCosts`:

- **detection** per signal: the median ``detected_s`` of the incidents a signal reports (an
  XID: ``xid_13``, ``xid_79``, ``no_spare_elastic``; a lost heartbeat: ``node_lost``; the
  exit of a crashed rank: ``app_crash``);
- **startup per mode**: the median of ``recovered_s - detected_s`` over the incidents that
  mode recovered (the attempt's start, restore and first step, as the twin times them too);
  the cold startup is the requeue's, else the run's measured startup; a warm mode never
  measured takes the cold startup;
- **restore per tier** and the **save**: what the live job measured (the run's ``costs``:
  the control plane's own figures, a restore estimated as the tier's save), else defaults;
- **policy inputs**: where the program's save on SIGTERM goes (the durable tier for the
  example program) and how often the control plane hears of a memory or peer entry (the
  tier heartbeat's cadence), so the twin's recovery policy weighs what the live one weighed.

:func:`scenario` is the trace as a twin scenario with these costs (``mtc bench recovery``
plays it; ``mtc sim fit --bench`` writes it). Pure: no I/O.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from shared.resilience.bench_config import BENCH_REPAIR
from shared.resilience.trace import FaultKind, Trace, parse_trace

JOB = "bench"
SPARE_OUT = "spare_out"  # the cause that takes idle nodes out before a no-spare fault
# An XID is played live as the node's health report while its rank runs on: the control
# plane's drain or interrupt stops the attempt (SIGTERM, a save), so the twin's XIDs do not
# kill the job either. A crash and a lost node do.
CAUSES: Mapping[str, dict[str, Any]] = {
    FaultKind.APP_CRASH.value: {"signal": "none", "fix": "none", "category": "software"},
    FaultKind.XID_13.value: {"signal": {"xid": [13]}, "fix": "none", "kills_job": False},
    FaultKind.XID_79.value: {"signal": {"xid": [79]}, "fix": "reboot", "kills_job": False},
    FaultKind.NODE_LOST.value: {"signal": {"heartbeat_lost": True}, "fix": "reboot",
                                "category": "host"},
    FaultKind.NO_SPARE_ELASTIC.value: {"signal": {"xid": [79]}, "fix": "reboot",
                                       "kills_job": False},
    SPARE_OUT: {"signal": {"xid": [79]}, "fix": "replace"},
}
GPUS_PER_NODE = 1  # the bench job runs one rank per node
STATE_BYTES = 1e6  # the example program's state is tiny: restores are set through bandwidths
GB = 1e9
MIN_S = 0.001  # a cost the twin can represent (a bandwidth must be finite)
XID_KINDS = (FaultKind.XID_13.value, FaultKind.XID_79.value, FaultKind.NO_SPARE_ELASTIC.value)
LIVE_TARGETS_FIRST = ("embedded", "slurm")
# a repaired node's health checks, as often as the embedded default's agent reports (a node
# is back about 0.4 s after its repair live)
VERIFY_INTERVAL_S = 0.2


@dataclass(frozen=True)
class RecoveryCosts:
    """Seconds. ``fitted``: which figures came from the live run (name -> incidents or
    "measured"); the rest are the round defaults of the embedded default."""

    startup_s: float = 2.0  # cold: a requeued attempt's start to its first step
    startup_in_place_s: float | None = None  # None: the cold startup
    startup_hot_swap_s: float | None = None
    startup_scale_down_s: float | None = None
    restore_memory_s: float = 0.01
    restore_peer_s: float = 0.01
    restore_durable_s: float = 0.1
    save_s: float = 0.01
    detect_xid_s: float = 0.1
    detect_heartbeat_s: float = 2.0
    detect_exit_s: float = 0.5
    sigterm_save: str = "memory"  # where the save on SIGTERM goes: memory | durable
    tier_report_s: float | None = None  # the cadence tier entries are heard at; None: exact
    exit_after_save_s: float = 1.0  # the save on SIGTERM's report to the process's exit
    fitted: Mapping[str, Any] = field(default_factory=dict)

    def warm(self, mode: str) -> float:
        value = {"in_place": self.startup_in_place_s, "hot_swap": self.startup_hot_swap_s,
                 "scale_down": self.startup_scale_down_s}.get(mode)
        return self.startup_s if value is None else value

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["fitted"] = dict(self.fitted)
        return out


def _median(values: Iterable[float]) -> float | None:
    got = [v for v in values if v is not None]
    return float(statistics.median(got)) if got else None


def live_run(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """The live run of a ``mtc bench recovery --json`` document: embedded, else Slurm, the
    run whose mode the policy chose (not a pinned comparison)."""
    runs = [r for r in doc.get("runs", ()) if isinstance(r, Mapping)]
    for target in LIVE_TARGETS_FIRST:
        for run in runs:
            if run.get("target") == target and run.get("label") == "chosen":
                return run
    raise ValueError("the document has no live run (target embedded or slurm, label "
                     "chosen): write one with `mtc bench recovery --target embedded --json`")


def fit_run(run: Mapping[str, Any]) -> RecoveryCosts:
    """:class:`RecoveryCosts` from one scored live run (``RunScore.as_dict()``)."""
    incidents: Sequence[Mapping[str, Any]] = [i for i in run.get("incidents", ())
                                              if isinstance(i, Mapping)]
    fitted: dict[str, Any] = {}

    def recovery(mode: str) -> float | None:
        got = [float(i["recovered_s"]) - float(i.get("detected_s") or 0.0) for i in incidents
               if i.get("mode") == mode and i.get("recovered_s") is not None]
        value = _median(got)
        if value is not None:
            fitted[f"startup_{mode}_s"] = len(got)
        return None if value is None else max(MIN_S, value)

    def detection(kinds: Iterable[str], key: str) -> float | None:
        wanted = set(kinds)
        got = [float(i["detected_s"]) for i in incidents
               if i.get("kind") in wanted and i.get("detected_s") is not None]
        value = _median(got)
        if value is not None:
            fitted[key] = len(got)
        return None if value is None else max(MIN_S, value)

    base = RecoveryCosts()
    raw_costs, raw_goodput = run.get("costs"), run.get("goodput")
    measured: Mapping[str, Any] = raw_costs if isinstance(raw_costs, Mapping) else {}
    goodput: Mapping[str, Any] = raw_goodput if isinstance(raw_goodput, Mapping) else {}
    cold = recovery("requeue")
    if cold is None and float(goodput.get("startup_s") or 0.0) > 0:
        cold = float(goodput["startup_s"])
        fitted["startup_s"] = "measured"
    elif cold is not None:
        fitted["startup_s"] = fitted.pop("startup_requeue_s")

    def taken(key: str, default: float) -> float:
        value = measured.get(key)
        if isinstance(value, int | float) and value > 0:
            fitted[key] = "measured"
            return max(MIN_S, float(value))
        return default

    save = float(goodput.get("save_s") or 0.0)
    report = measured.get("tier_report_s")
    exit_after = measured.get("exit_after_save_s")
    sigterm = measured.get("sigterm_save")
    return RecoveryCosts(
        startup_s=cold if cold is not None else base.startup_s,
        startup_in_place_s=recovery("in_place"),
        startup_hot_swap_s=recovery("hot_swap"),
        startup_scale_down_s=recovery("scale_down"),
        restore_memory_s=taken("restore_memory_s", base.restore_memory_s),
        restore_peer_s=taken("restore_peer_s", base.restore_peer_s),
        restore_durable_s=taken("restore_durable_s", base.restore_durable_s),
        save_s=max(MIN_S, save) if save > 0 else base.save_s,
        detect_xid_s=detection(XID_KINDS, "detect_xid_s") or base.detect_xid_s,
        detect_heartbeat_s=detection((FaultKind.NODE_LOST.value,), "detect_heartbeat_s")
        or base.detect_heartbeat_s,
        detect_exit_s=detection((FaultKind.APP_CRASH.value,), "detect_exit_s")
        or base.detect_exit_s,
        sigterm_save=sigterm if sigterm in ("memory", "durable") else base.sigterm_save,
        tier_report_s=float(report) if isinstance(report, int | float) and report > 0
        else None,
        exit_after_save_s=float(exit_after) if isinstance(exit_after, int | float)
        and exit_after >= 0 else base.exit_after_save_s,
        fitted=fitted,
    )


def fit_document(doc: Mapping[str, Any]) -> RecoveryCosts:
    """:func:`fit_run` of the document's live run."""
    return fit_run(live_run(doc))


def recovery_block(trace: Trace, costs: RecoveryCosts, pin: str | None = None
                   ) -> dict[str, Any] | None:
    """The job's tiers and elasticity as the live run has them, so the same recovery policy
    weighs the same modes: memory and peer copies every ``tier1_every`` steps (heard at the
    live tier heartbeat's cadence when it is slower), durable every ``checkpoint_every``,
    ``min_replicas`` from the trace; each mode's warm start and each tier's restore from
    ``costs``, a restore set as the bandwidth that moves ``STATE_BYTES`` in that time. None:
    a rigid job with no tier-1 copies, which only the plain requeue recovers."""
    j = trace.job
    if not j.tier1_every and j.min_replicas is None:
        return None
    tiers = ["memory", "peer", "durable"] if j.tier1_every else ["durable"]
    step = j.step_time_s
    shard = STATE_BYTES / j.replicas
    every = (j.tier1_every or j.checkpoint_every) * step
    block: dict[str, Any] = {
        "tiers": tiers, "mode": pin or "auto",
        "parameters": STATE_BYTES, "bytes_per_parameter": 1.0, "largest_rank_gb": 0.0,
        "memory_gb_s": shard / max(MIN_S, costs.restore_memory_s) / GB,
        # a peer entry counts once the control plane hears of it: on average half a report
        # interval after it is made, modelled as a copy that takes that long
        "peer_gb_s": shard / max(MIN_S, costs.restore_peer_s,
                                 (costs.tier_report_s or 0.0) / 2) / GB,
        "durable_gb_s": STATE_BYTES / max(MIN_S, costs.restore_durable_s) / GB,
        "memory_every": every,
        "durable_every": j.checkpoint_every * step,
        "startup_warm": costs.warm("in_place"),
        "startup_hot_swap": costs.warm("hot_swap"),
        "startup_scale_down": costs.warm("scale_down"),
        "rebuild_s_per_kgpu": 0.0, "copy_interference": 0.0,
        "fallback_probability": 0.0, "recur_probability": 0.0, "spares": "warm",
        "sigterm_save": costs.sigterm_save, "report_before_exit": costs.exit_after_save_s,
    }
    if j.min_replicas is not None:
        block["min_replicas"] = j.min_replicas
    return block


def scenario(trace: Trace, faults: list[dict[str, Any]], costs: RecoveryCosts,
             horizon_s: float, pin: str | None = None) -> dict[str, Any]:
    """The trace as a twin scenario: its nodes and spares, one job of its shape, no random
    faults, ``faults`` scripted, the control plane's bench settings, ``costs``."""
    j = trace.job
    recovery = recovery_block(trace, costs, pin)
    tiered = recovery is not None and recovery["tiers"] != ["durable"]
    out: dict[str, Any] = {
        "name": f"bench-{trace.name}", "seed": 1, "duration": horizon_s,
        # a tiered job reports its entries as each attempt stops; an untiered one every save
        "checkpoint_events": "latest" if tiered else "all",
        "cluster": {"cluster_id": "bench", "provision": 0.2, "gpus_per_node": GPUS_PER_NODE,
                    "partitions": [{"name": "train", "nodes": trace.nodes,
                                    "spares": trace.spares}]},
        "jobs": [{"name": JOB, "nodes": j.replicas, "step_time": j.step_time_s,
                  "checkpoint_interval": j.checkpoint_every * j.step_time_s,
                  "checkpoint_save": costs.save_s, "checkpoint_restore": costs.restore_durable_s,
                  "startup": costs.startup_s, "crash_exit": costs.detect_exit_s,
                  "hang_exit": 5.0, "launch_fail": 1.0}],
        "failures": {"rate_scale": 0, "lemons": {"fraction": 0.0, "multiplier": 1},
                     "planned": {"per_day": 0}, "stragglers": {"per_1000_node_days": 0},
                     "causes": {k: {**v, "count": 0} for k, v in CAUSES.items()},
                     "scripted": faults},
        "repair": {"durations": {"reset_gpu": min(0.5, trace.repair_s), "reboot": trace.repair_s,
                                 "reimage": trace.repair_s, "replace": 10 * horizon_s},
                   "verify_interval": VERIFY_INTERVAL_S},
        "detection": {"xid": costs.detect_xid_s, "heartbeat": {"low": 0.0, "high": 0.0},
                      "report_interval": 5.0},
        "control_plane": {"grace_period": 10.0, "heartbeat_timeout": costs.detect_heartbeat_s,
                          "repair": dict(BENCH_REPAIR)},
    }
    if recovery is not None:
        out["recovery"] = recovery
    return out


def measured_inputs(rows: Sequence[Mapping[str, Any]], job_id: str) -> dict[str, Any]:
    """The live run's policy inputs from its event log: ``tier_report_s``, the median gap
    between the control plane hearing of successive memory entries of one attempt (the tier
    heartbeat's cadence, not the program's save cadence), and ``sigterm_save``, the tier of
    the first entry an attempt reported after it was signalled, and ``exit_after_save_s``,
    from that report to the attempt's exit (absent: not seen)."""
    heard: dict[int, list[float]] = {}
    signalled: dict[int, float] = {}
    after: dict[int, str] = {}
    saved_at: dict[int, float] = {}
    exits: list[float] = []
    for r in sorted(rows, key=lambda r: float(r["time"])):
        d = r["data"]
        if d.get("job_id") != job_id:
            continue
        attempt = int(d.get("attempt", 0))
        if r["type"] == "mtc.job.signalled.v1":
            signalled.setdefault(attempt, float(r["time"]))
        elif r["type"] == "mtc.job.checkpoint_saved.v1":
            tier = str(d.get("tier") or "durable")
            if tier == "memory":
                heard.setdefault(attempt, []).append(float(r["time"]))
            since = signalled.get(attempt)
            if since is not None and attempt not in after \
                    and float(d.get("saved_at", r["time"])) >= since:
                after[attempt] = "durable" if tier == "durable" else "memory"
                saved_at[attempt] = float(r["time"])
        elif r["type"] == "mtc.job.workers_exited.v1" and attempt in saved_at:
            exits.append(max(0.0, float(r["time"]) - saved_at.pop(attempt)))
    out: dict[str, Any] = {}
    gaps = [b - a for times in heard.values() for a, b in itertools.pairwise(times)]
    if gaps:
        out["tier_report_s"] = round(float(statistics.median(gaps)), 3)
    if after:
        out["sigterm_save"] = statistics.mode(after.values())
    if exits:
        out["exit_after_save_s"] = round(float(statistics.median(exits)), 3)
    return out


def trace_of(doc: Mapping[str, Any]) -> Trace:
    """The trace a ``mtc bench recovery --json`` document played (its ``trace``, as written
    by ``Trace.as_dict``)."""
    t = doc.get("trace")
    if not isinstance(t, Mapping):
        raise ValueError("the document has no trace: not a `mtc bench recovery --json` file")
    job = t["job"]
    faults = []
    for f in t["faults"]:
        item: dict[str, Any] = {"kind": f["kind"]}
        when = str(f["when"])
        if when.startswith("t+"):
            item["at"] = float(when[2:].rstrip("s"))
        else:
            item["after_step"] = int(when.split()[-1])
        what, _, value = str(f["target"]).partition(" ")
        item["target"] = {"rank": int(value)} if what == "rank" else {"node": value}
        faults.append(item)
    return parse_trace({
        "version": t["version"], "name": t["name"],
        "cluster": {"nodes": t["nodes"], "spares": t["spares"], "repair": t["repair_s"]},
        "job": {"replicas": job["replicas"], "min_replicas": job["min_replicas"],
                "step_time": job["step_time_s"], "checkpoint_every": job["checkpoint_every"],
                "tier1_every": job.get("tier1_every"), "steps": job["steps"]},
        "faults": faults})


def fitted_scenario(doc: Mapping[str, Any], name: str = "") -> tuple[dict[str, Any],
                                                                   RecoveryCosts]:
    """The twin scenario of the document's trace with the live run's fitted costs, its
    faults scripted at their nominal times (after the cold startup; a step at the nominal
    pace): what ``mtc sim fit`` writes for a bench file."""
    costs = fit_document(doc)
    trace = trace_of(doc)
    step = trace.job.step_time_s
    scripted: list[dict[str, Any]] = []
    for f in trace.faults:
        at = costs.startup_s + (f.at_s if f.at_s is not None else (f.after_step or 0) * step)
        scripted.append({"at": round(at, 3), "node": (f.rank or 0) % trace.job.replicas,
                         "cause": f.kind.value})
    horizon = max(float(s["at"]) for s in scripted) + 60.0
    raw = scenario(trace, scripted, costs, horizon)
    raw["description"] = ("trace " + trace.name + " with the recovery costs fitted from a live "
                          "`mtc bench recovery` run: " + ", ".join(
                              f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                              for k, v in costs.as_dict().items()
                              if k != "fitted" and v is not None))
    if name:
        raw["name"] = name
    return raw, costs


def is_bench_document(path: str) -> Mapping[str, Any] | None:
    """The parsed document when ``path`` is a ``mtc bench recovery --json`` file, else None."""
    if not path.endswith(".json"):
        return None
    import json
    from pathlib import Path

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "runs" in doc and "trace" in doc else None
