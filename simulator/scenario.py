"""Scenario files: what the twin simulates, parsed strictly from YAML.

A scenario names the fleet (partitions of nodes plus spares), the training jobs, the failure
model (see ``simulator/failures.py``), repair and detection times, the simulated bus and the
control-plane settings. Every value has a default in the constants block below; a scenario
file only says what differs. Parsing is validation: an unknown key or a bad value raises
:class:`ScenarioError` naming its path (``failures.causes.faulty_gpu.fix.rebot: unknown key``).

Durations are written ``90s``, ``15m``, ``2h``, ``54d``, ``1y`` or as plain seconds. A sampled
duration is either one such value (fixed) or a mapping: ``{median: 15m, sigma: 0.5}``
(lognormal), ``{low: 5m, high: 20m}`` (uniform) or ``{mean: 1h}`` (exponential).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

# ---------------------------------------------------------------- constants (defaults)
# Units are in the names: _S seconds, _PER_NODE_DAY events per node per day, _FRACTION 0..1.
DEFAULT_SEED = 42
DEFAULT_DURATION_S = 54 * 86_400.0  # Llama 3 405B pretraining: 54 days
DEFAULT_GPUS_PER_NODE = 8
DEFAULT_MACHINE_TYPE = "a3-highgpu-8g"
DEFAULT_ACCELERATOR = "NVIDIA_H100_80GB"
DEFAULT_PROVISION_MEDIAN_S = 600.0  # a fresh node boots and joins in about 10 minutes
DEFAULT_STEP_TIME_S = 10.0  # one synchronous training step at nominal speed
DEFAULT_CHECKPOINT_INTERVAL_S = 1800.0  # compute time between two checkpoint saves
DEFAULT_CHECKPOINT_SAVE_S = 20.0  # blocking part of one save
DEFAULT_CHECKPOINT_RESTORE_S = 120.0  # load the newest checkpoint on restart
DEFAULT_STARTUP_S = 180.0  # launch, NCCL init, data loader warm-up
DEFAULT_MFU_FRACTION = 0.40  # Llama 3 405B reached 38-43% BF16 MFU
DEFAULT_CRASH_EXIT_S = 30.0  # a crashed rank takes the launcher this long to stop the rest
DEFAULT_HANG_EXIT_S = 600.0  # NCCL watchdog: ranks blocked on a dead peer give up after this
DEFAULT_LAUNCH_FAIL_S = 60.0  # workers started on a broken node fail after this
DEFAULT_MAX_RESTARTS = 1_000_000
DEFAULT_BUS_LATENCY_S = 0.05  # control-plane event delivery (Pub/Sub push) median
DEFAULT_VERIFY_INTERVAL_S = 60.0  # post-repair / post-provision health check cadence
DEFAULT_SPEED_CHECK_INTERVAL_S = 1800.0  # how often a straggler's slowness is reported
DEFAULT_GRACE_PERIOD_S = 30.0  # SIGTERM to SIGKILL
DEFAULT_HEARTBEAT_TIMEOUT_S = 60.0
DEFAULT_MAX_EVENT_AGE_S = 3600.0
DEFAULT_REPAIR_MEDIAN_S = {  # one rung of the repair ladder, start to result
    "reset_gpu": 180.0,
    "reboot": 900.0,
    "reimage": 3600.0,
    "replace": 2 * 86_400.0,  # on-premises hardware swap (RMA, spare chassis)
}
DEFAULT_DETECT_MEDIAN_S = 10.0  # XID / ECC / DCGM line in the kernel log to agent report
TIME_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86_400.0, "w": 7 * 86_400.0,
              "y": 365 * 86_400.0, "ms": 0.001}

_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|m|h|d|w|y)?\s*$")
SCENARIO_DIR = Path(__file__).parent / "scenarios"
DEFAULT_SCENARIO = SCENARIO_DIR / "llama3.yaml"


class ScenarioError(ValueError):
    """A bad scenario: names the key path and the reason."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path or '(scenario)'}: {reason}")
        self.path = path
        self.reason = reason


# ---------------------------------------------------------------- small readers


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def mapping(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ScenarioError(path, f"must be a mapping, got {type(value).__name__}")
    return value


def only_keys(data: Mapping[str, Any], path: str, allowed: Sequence[str]) -> None:
    for key in data:
        if key not in allowed:
            raise ScenarioError(_join(path, str(key)),
                                f"unknown key (expected one of {', '.join(sorted(allowed))})")


def duration(value: Any, path: str) -> float:
    if isinstance(value, bool):
        raise ScenarioError(path, f"must be a duration like '15m', got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION_RE.match(value)
        if not match:
            raise ScenarioError(path, f"must be a duration like '90s', '15m', '2h', '54d', "
                                      f"got {value!r}")
        seconds = float(match.group(1)) * TIME_UNITS[match.group(2) or "s"]
    else:
        raise ScenarioError(path, f"must be a duration like '15m', got {type(value).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ScenarioError(path, f"must not be negative, got {value!r}")
    return seconds


def number(value: Any, path: str, *, low: float | None = None, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(path, f"must be a number, got {value!r}")
    out = float(value)
    if not math.isfinite(out):
        raise ScenarioError(path, f"must be finite, got {value!r}")
    if low is not None and out < low:
        raise ScenarioError(path, f"must be at least {low:g}, got {value!r}")
    if high is not None and out > high:
        raise ScenarioError(path, f"must be at most {high:g}, got {value!r}")
    return out


def integer(value: Any, path: str, *, low: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(path, f"must be an integer, got {value!r}")
    if low is not None and value < low:
        raise ScenarioError(path, f"must be at least {low}, got {value!r}")
    return value


def text(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ScenarioError(path, f"must be a non-empty string, got {value!r}")
    return value


def get(data: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = data.get(key)
    return default if value is None else value


@dataclass(frozen=True)
class Dist:
    """A sampled non-negative quantity (a duration, in seconds, or a plain number)."""

    kind: str  # fixed | lognormal | uniform | exponential
    a: float  # value | median | low | mean
    b: float = 0.0  # - | sigma | high | -

    def sample(self, rng: np.random.Generator) -> float:
        if self.kind == "fixed":
            return self.a
        if self.kind == "lognormal":
            return float(self.a * math.exp(self.b * rng.standard_normal()))
        if self.kind == "uniform":
            return float(self.a + (self.b - self.a) * rng.random())
        return float(rng.exponential(self.a))

    @property
    def mean(self) -> float:
        if self.kind == "lognormal":
            return self.a * math.exp(self.b * self.b / 2.0)
        if self.kind == "uniform":
            return (self.a + self.b) / 2.0
        return self.a

    @staticmethod
    def fixed(value: float) -> Dist:
        return Dist("fixed", value)


def dist(value: Any, path: str, *, as_duration: bool = True) -> Dist:
    read = duration if as_duration else (lambda v, p: number(v, p, low=0.0))
    if not isinstance(value, Mapping):
        return Dist("fixed", read(value, path))
    keys = set(value)
    if keys <= {"median", "sigma"} and "median" in keys:
        sigma = number(get(value, "sigma", 0.5), _join(path, "sigma"), low=0.0)
        return Dist("lognormal", read(value["median"], _join(path, "median")), sigma)
    if keys == {"low", "high"}:
        low = read(value["low"], _join(path, "low"))
        high = read(value["high"], _join(path, "high"))
        if high < low:
            raise ScenarioError(_join(path, "high"), f"must not be below low ({low:g})")
        return Dist("uniform", low, high)
    if keys == {"mean"}:
        return Dist("exponential", read(value["mean"], _join(path, "mean")))
    raise ScenarioError(path, "must be a value or one of {median[, sigma]}, {low, high}, "
                              f"{{mean}}; got keys {sorted(map(str, keys))}")


# ---------------------------------------------------------------- sections


@dataclass(frozen=True)
class PartitionCfg:
    name: str
    nodes: int  # workers, spares included
    spares: int


@dataclass(frozen=True)
class ClusterCfg:
    cluster_id: str
    gpus_per_node: int
    machine_type: str
    accelerator: str
    partitions: tuple[PartitionCfg, ...]
    provision: Dist

    @property
    def nodes(self) -> int:
        return sum(p.nodes for p in self.partitions)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class JobCfg:
    name: str
    partition: str
    nodes: int
    step_time_s: float
    checkpoint_interval_s: float
    checkpoint_save_s: float
    checkpoint_restore_s: float
    startup_s: float
    mfu: float
    work_s: float | None  # nominal compute time to finish; None: train until the horizon
    submit_at_s: float  # after the cluster is ready
    priority: int
    crash_exit_s: float
    hang_exit_s: float
    launch_fail_s: float
    max_restarts: int

    @property
    def steps_per_checkpoint(self) -> int:
        return max(1, round(self.checkpoint_interval_s / self.step_time_s))


@dataclass(frozen=True)
class RepairCfg:
    durations: Mapping[str, Dist]  # per RepairAction value
    mechanical_failure: Mapping[str, float]  # the action itself fails (probability)
    verify_interval_s: float


@dataclass(frozen=True)
class BusCfg:
    latency: Dist
    duplicate: float  # probability that an event is delivered twice
    reorder: float  # probability that an event is held back (and so overtaken)
    reorder_delay: Dist
    retry_delay_s: float
    max_deliveries: int


@dataclass(frozen=True)
class ControlPlaneCfg:
    triage_table: str | None  # a triage table YAML path; None: the packaged one
    repair: Mapping[str, Any]  # shared.policies.repair.load_repair_config input
    grace_period_s: float
    heartbeat_timeout_s: float
    max_event_age_s: float
    backfill: bool


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    seed: int
    duration_s: float
    cluster: ClusterCfg
    jobs: tuple[JobCfg, ...]
    failures: Any  # simulator.failures.FailureCfg (typed there to keep imports one way)
    repair: RepairCfg
    detection: Mapping[str, Dist]
    bus: BusCfg
    control_plane: ControlPlaneCfg
    checkpoint_events: str  # latest | all
    raw: Mapping[str, Any] = field(repr=False, compare=False, default_factory=dict)


TOP_KEYS = ("name", "description", "seed", "duration", "cluster", "jobs", "failures", "repair",
            "detection", "bus", "control_plane", "checkpoint_events")
DETECTION_KEYS = ("xid", "ecc", "dcgm", "disk", "thermal", "heartbeat", "speed")


def parse_cluster(value: Any, path: str) -> ClusterCfg:
    data = mapping(value, path)
    only_keys(data, path, ("cluster_id", "gpus_per_node", "machine_type", "accelerator",
                           "partitions", "provision"))
    raw_parts = get(data, "partitions", [{"name": "train", "nodes": 64, "spares": 4}])
    if not isinstance(raw_parts, list) or not raw_parts:
        raise ScenarioError(_join(path, "partitions"), "must be a non-empty list")
    parts: list[PartitionCfg] = []
    for i, item in enumerate(raw_parts):
        ppath = _join(_join(path, "partitions"), i)
        pdata = mapping(item, ppath)
        only_keys(pdata, ppath, ("name", "nodes", "spares"))
        name = text(get(pdata, "name", f"p{i}"), _join(ppath, "name"))
        nodes = integer(pdata.get("nodes"), _join(ppath, "nodes"), low=1)
        spares = integer(get(pdata, "spares", 0), _join(ppath, "spares"), low=0)
        if name in [p.name for p in parts]:
            raise ScenarioError(_join(ppath, "name"), f"duplicate partition {name!r}")
        # ``nodes`` counts the nodes jobs may use; spares come on top
        parts.append(PartitionCfg(name, nodes + spares, spares))
    return ClusterCfg(
        cluster_id=text(get(data, "cluster_id", "sim"), _join(path, "cluster_id")),
        gpus_per_node=integer(get(data, "gpus_per_node", DEFAULT_GPUS_PER_NODE),
                              _join(path, "gpus_per_node"), low=1),
        machine_type=text(get(data, "machine_type", DEFAULT_MACHINE_TYPE),
                          _join(path, "machine_type")),
        accelerator=text(get(data, "accelerator", DEFAULT_ACCELERATOR),
                         _join(path, "accelerator")),
        partitions=tuple(parts),
        provision=dist(get(data, "provision", {"median": DEFAULT_PROVISION_MEDIAN_S,
                                               "sigma": 0.3}), _join(path, "provision")),
    )


JOB_KEYS = ("name", "partition", "nodes", "step_time", "checkpoint_interval", "checkpoint_save",
            "checkpoint_restore", "startup", "mfu", "work", "submit_at", "priority",
            "crash_exit", "hang_exit", "launch_fail", "max_restarts")


def parse_job(value: Any, path: str, cluster: ClusterCfg, index: int) -> JobCfg:
    data = mapping(value, path)
    only_keys(data, path, JOB_KEYS)
    partition = text(get(data, "partition", cluster.partitions[0].name), _join(path, "partition"))
    part = next((p for p in cluster.partitions if p.name == partition), None)
    if part is None:
        raise ScenarioError(_join(path, "partition"),
                            f"no partition {partition!r} in cluster.partitions")
    nodes = integer(get(data, "nodes", part.nodes - part.spares), _join(path, "nodes"), low=1)
    if nodes > part.nodes:
        raise ScenarioError(_join(path, "nodes"),
                            f"needs {nodes} nodes; partition {partition!r} has {part.nodes}")
    step = duration(get(data, "step_time", DEFAULT_STEP_TIME_S), _join(path, "step_time"))
    if step <= 0:
        raise ScenarioError(_join(path, "step_time"), "must be positive")
    interval = duration(get(data, "checkpoint_interval", DEFAULT_CHECKPOINT_INTERVAL_S),
                        _join(path, "checkpoint_interval"))
    if interval < step:
        raise ScenarioError(_join(path, "checkpoint_interval"),
                            f"must be at least one step ({step:g} s)")
    work = data.get("work")
    name = text(get(data, "name", f"job-{index}"), _join(path, "name"))
    if not re.match(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$", name):
        raise ScenarioError(_join(path, "name"), "must be lowercase letters, digits, hyphens")
    return JobCfg(
        name=name,
        partition=partition,
        nodes=nodes,
        step_time_s=step,
        checkpoint_interval_s=interval,
        checkpoint_save_s=duration(get(data, "checkpoint_save", DEFAULT_CHECKPOINT_SAVE_S),
                                   _join(path, "checkpoint_save")),
        checkpoint_restore_s=duration(get(data, "checkpoint_restore",
                                          DEFAULT_CHECKPOINT_RESTORE_S),
                                      _join(path, "checkpoint_restore")),
        startup_s=duration(get(data, "startup", DEFAULT_STARTUP_S), _join(path, "startup")),
        mfu=number(get(data, "mfu", DEFAULT_MFU_FRACTION), _join(path, "mfu"), low=0.0,
                   high=1.0),
        work_s=None if work is None else duration(work, _join(path, "work")),
        submit_at_s=duration(get(data, "submit_at", 0.0), _join(path, "submit_at")),
        priority=integer(get(data, "priority", 0), _join(path, "priority")),
        crash_exit_s=duration(get(data, "crash_exit", DEFAULT_CRASH_EXIT_S),
                              _join(path, "crash_exit")),
        hang_exit_s=duration(get(data, "hang_exit", DEFAULT_HANG_EXIT_S),
                             _join(path, "hang_exit")),
        launch_fail_s=duration(get(data, "launch_fail", DEFAULT_LAUNCH_FAIL_S),
                               _join(path, "launch_fail")),
        max_restarts=integer(get(data, "max_restarts", DEFAULT_MAX_RESTARTS),
                             _join(path, "max_restarts"), low=0),
    )


ACTIONS = ("reset_gpu", "reboot", "reimage", "replace")


def parse_repair(value: Any, path: str) -> RepairCfg:
    data = mapping(value, path)
    only_keys(data, path, ("durations", "mechanical_failure", "verify_interval"))
    dpath = _join(path, "durations")
    raw = mapping(data.get("durations"), dpath)
    only_keys(raw, dpath, ACTIONS)
    durations = {a: dist(raw[a], _join(dpath, a)) if a in raw
                 else Dist("lognormal", DEFAULT_REPAIR_MEDIAN_S[a], 0.3) for a in ACTIONS}
    mpath = _join(path, "mechanical_failure")
    mraw = mapping(data.get("mechanical_failure"), mpath)
    only_keys(mraw, mpath, ACTIONS)
    mech = {a: number(get(mraw, a, 0.0), _join(mpath, a), low=0.0, high=1.0) for a in ACTIONS}
    return RepairCfg(durations, mech, duration(get(data, "verify_interval",
                                                   DEFAULT_VERIFY_INTERVAL_S),
                                               _join(path, "verify_interval")))


def parse_detection(value: Any, path: str) -> dict[str, Dist]:
    data = mapping(value, path)
    only_keys(data, path, DETECTION_KEYS)
    defaults: dict[str, Any] = {
        "xid": {"median": DEFAULT_DETECT_MEDIAN_S, "sigma": 0.5},
        "ecc": {"median": 30.0, "sigma": 0.5},
        "dcgm": {"median": 3600.0, "sigma": 0.5},  # found by the next periodic diagnostic
        "disk": {"median": 60.0, "sigma": 0.5},
        "thermal": {"median": 30.0, "sigma": 0.5},
        "heartbeat": {"low": 0.0, "high": 30.0},  # on top of the heartbeat timeout: tick phase
        "speed": {"median": 300.0, "sigma": 0.5},
    }
    return {k: dist(get(data, k, defaults[k]), _join(path, k)) for k in DETECTION_KEYS}


def parse_bus(value: Any, path: str) -> BusCfg:
    data = mapping(value, path)
    only_keys(data, path, ("latency", "duplicate", "reorder", "reorder_delay", "retry_delay",
                           "max_deliveries"))
    return BusCfg(
        latency=dist(get(data, "latency", {"median": DEFAULT_BUS_LATENCY_S, "sigma": 0.5}),
                     _join(path, "latency")),
        duplicate=number(get(data, "duplicate", 0.0), _join(path, "duplicate"), low=0.0,
                         high=1.0),
        reorder=number(get(data, "reorder", 0.0), _join(path, "reorder"), low=0.0, high=1.0),
        reorder_delay=dist(get(data, "reorder_delay", {"low": 0.1, "high": 2.0}),
                           _join(path, "reorder_delay")),
        retry_delay_s=duration(get(data, "retry_delay", 10.0), _join(path, "retry_delay")),
        max_deliveries=integer(get(data, "max_deliveries", 5), _join(path, "max_deliveries"),
                               low=1),
    )


def parse_control_plane(value: Any, path: str) -> ControlPlaneCfg:
    data = mapping(value, path)
    only_keys(data, path, ("triage_table", "repair", "grace_period", "heartbeat_timeout",
                           "max_event_age", "backfill"))
    table = data.get("triage_table")
    if table is not None:
        table = text(table, _join(path, "triage_table"))
    repair = dict(mapping(data.get("repair"), _join(path, "repair")))
    from shared.domain.errors import ValidationError
    from shared.policies.repair import load_repair_config

    try:
        load_repair_config(repair)
    except ValidationError as exc:
        raise ScenarioError(_join(_join(path, "repair"), exc.path), exc.reason) from None
    backfill = get(data, "backfill", False)
    if not isinstance(backfill, bool):
        raise ScenarioError(_join(path, "backfill"), f"must be true or false, got {backfill!r}")
    return ControlPlaneCfg(
        triage_table=table,
        repair=repair,
        grace_period_s=duration(get(data, "grace_period", DEFAULT_GRACE_PERIOD_S),
                                _join(path, "grace_period")),
        heartbeat_timeout_s=duration(get(data, "heartbeat_timeout", DEFAULT_HEARTBEAT_TIMEOUT_S),
                                     _join(path, "heartbeat_timeout")),
        max_event_age_s=duration(get(data, "max_event_age", DEFAULT_MAX_EVENT_AGE_S),
                                 _join(path, "max_event_age")),
        backfill=backfill,
    )


def parse_scenario(data: Any, *, source: str = "") -> Scenario:
    from simulator.failures import parse_failures

    top = mapping(data, "")
    only_keys(top, "", TOP_KEYS)
    cluster = parse_cluster(top.get("cluster"), "cluster")
    raw_jobs = get(top, "jobs", [{}])
    if not isinstance(raw_jobs, list) or not raw_jobs:
        raise ScenarioError("jobs", "must be a non-empty list")
    jobs = tuple(parse_job(j, _join("jobs", i), cluster, i) for i, j in enumerate(raw_jobs))
    names = [j.name for j in jobs]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ScenarioError(_join(_join("jobs", i), "name"), f"duplicate job {name!r}")
    for part in cluster.partitions:
        wanted = sum(j.nodes for j in jobs if j.partition == part.name)
        if wanted > part.nodes - part.spares and len([j for j in jobs
                                                      if j.partition == part.name]) == 1:
            raise ScenarioError("jobs", f"partition {part.name!r} has {part.nodes - part.spares}"
                                        f" non-spare nodes; its job needs {wanted}")
    events = get(top, "checkpoint_events", "latest")
    if events not in ("latest", "all"):
        raise ScenarioError("checkpoint_events", f"must be 'latest' or 'all', got {events!r}")
    name = get(top, "name", Path(source).stem if source else "scenario")
    return Scenario(
        name=text(name, "name"),
        description=str(get(top, "description", "")).strip(),
        seed=integer(get(top, "seed", DEFAULT_SEED), "seed", low=0),
        duration_s=duration(get(top, "duration", DEFAULT_DURATION_S), "duration"),
        cluster=cluster,
        jobs=jobs,
        failures=parse_failures(top.get("failures"), "failures"),
        repair=parse_repair(top.get("repair"), "repair"),
        detection=parse_detection(top.get("detection"), "detection"),
        bus=parse_bus(top.get("bus"), "bus"),
        control_plane=parse_control_plane(top.get("control_plane"), "control_plane"),
        checkpoint_events=events,
        raw=copy.deepcopy(dict(top)),
    )


def load_raw(path: str | Path | None = None) -> dict[str, Any]:
    """The YAML of a scenario file (the default Llama 3 one when ``path`` is None)."""
    file = Path(path) if path is not None else DEFAULT_SCENARIO
    try:
        text_ = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(str(file), f"cannot read: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text_)
    except yaml.YAMLError as exc:
        raise ScenarioError(str(file), f"not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ScenarioError(str(file), "must be a YAML mapping at the top level")
    return data


def load_scenario(path: str | Path | None = None,
                  overrides: Mapping[str, Any] | None = None) -> Scenario:
    raw = load_raw(path)
    for key, value in (overrides or {}).items():
        apply_override(raw, key, value)
    return parse_scenario(raw, source=str(path or DEFAULT_SCENARIO))


# ---------------------------------------------------------------- overrides (sweeps)

# Short names for what people vary most; any dotted path works too (``*`` = every list item).
ALIASES: dict[str, tuple[str, ...]] = {
    "checkpoint_interval": ("jobs.*.checkpoint_interval",),
    "checkpoint_save": ("jobs.*.checkpoint_save",),
    "checkpoint_restore": ("jobs.*.checkpoint_restore",),
    "startup": ("jobs.*.startup",),
    "spares": ("cluster.partitions.*.spares",),
    "nodes": ("cluster.partitions.*.nodes", "jobs.*.nodes"),
    "failure_scale": ("failures.rate_scale",),
    "lemon_fraction": ("failures.lemons.fraction",),
    "duration": ("duration",),
    "ladder": ("control_plane.repair.ladder",),
    "bus_latency": ("bus.latency",),
    "duplicate": ("bus.duplicate",),
    "seed": ("seed",),
}


def parse_value(text_: str) -> Any:
    """A command-line value: YAML scalar; ``a+b+c`` is a list (commas separate sweep values)."""
    if "+" in text_ and not _DURATION_RE.match(text_):
        return [parse_value(part) for part in text_.split("+")]
    try:
        return yaml.safe_load(text_)
    except yaml.YAMLError:
        return text_


def apply_override(raw: dict[str, Any], key: str, value: Any) -> None:
    for path in ALIASES.get(key, (key,)):
        _set_path(raw, path.split("."), value, key)


def _set_path(node: Any, parts: list[str], value: Any, key: str) -> None:
    head, rest = parts[0], parts[1:]
    if head == "*":
        if not isinstance(node, list):
            raise ScenarioError(key, "'*' used where the scenario has no list")
        for item in node:
            _set_path(item, rest, value, key)
        return
    if isinstance(node, list):
        if not head.isdigit() or int(head) >= len(node):
            raise ScenarioError(key, f"no list item {head!r}")
        target: Any = node
        index: Any = int(head)
    elif isinstance(node, dict):
        target, index = node, head
    else:
        raise ScenarioError(key, f"cannot set {head!r} inside a {type(node).__name__}")
    if not rest:
        target[index] = copy.deepcopy(value)
        return
    if isinstance(target, dict) and target.get(index) is None:
        target[index] = [] if rest[0] == "*" or rest[0].isdigit() else {}
    _set_path(target[index], rest, value, key)
