"""Scenario files: what the twin simulates, parsed strictly from YAML.

A scenario names the fleet (partitions of nodes plus spares), the training jobs, the failure
model (see ``simulator/failures.py``; its section is parsed by ``simulator/failure_config.py``),
repair and detection times, the simulated bus and the control-plane settings. Every value has a
default in ``simulator/scenario_types.py``, beside the dataclasses parsing returns; a scenario
file only says what differs. Parsing is validation: an unknown key or a bad value raises
:class:`ScenarioError` naming its path (``failures.causes.faulty_gpu.fix.rebot: unknown key``).

Durations are written ``90s``, ``15m``, ``2h``, ``54d``, ``1y`` or as plain seconds. A sampled
duration is either one such value (fixed) or a mapping: ``{median: 15m, sigma: 0.5}``
(lognormal), ``{low: 5m, high: 20m}`` (uniform) or ``{mean: 1h}`` (exponential).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from shared import yaml_text
from shared.domain.errors import ValidationError
from shared.domain.topology import SPARE_LAYOUTS
from shared.policies.repair import load_repair_config
from simulator.availability import parse_availability
from simulator.failure_config import parse_failures
from simulator.failures import ScriptedFault
from simulator.overrides import apply_override
from simulator.preflight_model import parse_preflight
from simulator.readers import (
    Dist,
    ScenarioError,
    boolean,
    dist,
    duration,
    get,
    integer,
    join,
    mapping,
    number,
    only_keys,
    text,
)
from simulator.recovery_config import check_recovery, durable_only, parse_recovery
from simulator.rollout_model import parse_rollout
from simulator.scenario_types import (
    DEFAULT_ACCELERATOR,
    DEFAULT_BUS_LATENCY_S,
    DEFAULT_CHECKPOINT_INTERVAL_S,
    DEFAULT_CHECKPOINT_RESTORE_S,
    DEFAULT_CHECKPOINT_SAVE_S,
    DEFAULT_CRASH_EXIT_S,
    DEFAULT_DETECT_MEDIAN_S,
    DEFAULT_DURATION_S,
    DEFAULT_GPUS_PER_NODE,
    DEFAULT_GRACE_PERIOD_S,
    DEFAULT_HANG_EXIT_S,
    DEFAULT_HEARTBEAT_TIMEOUT_S,
    DEFAULT_LAUNCH_FAIL_S,
    DEFAULT_MACHINE_TYPE,
    DEFAULT_MAX_EVENT_AGE_S,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_MFU_FRACTION,
    DEFAULT_PROVISION_MEDIAN_S,
    DEFAULT_REPAIR_MEDIAN_S,
    DEFAULT_REPORT_INTERVAL_S,
    DEFAULT_SEED,
    DEFAULT_STARTUP_S,
    DEFAULT_STEP_TIME_S,
    DEFAULT_VERIFY_INTERVAL_S,
    BusCfg,
    ClusterCfg,
    ControlPlaneCfg,
    JobCfg,
    PartitionCfg,
    RepairCfg,
    Scenario,
)
from simulator.team_queues import parse_queues

__all__ = [
    "DEFAULT_SCENARIO",
    "SCENARIO_DIR",
    "Scenario",
    "ScenarioError",
    "duration",
    "load_raw",
    "load_scenario",
    "parse_scenario",
]

SCENARIO_DIR = Path(__file__).parent / "scenarios"
DEFAULT_SCENARIO = SCENARIO_DIR / "llama3.yaml"



TOP_KEYS = ("name", "description", "seed", "duration", "cluster", "jobs", "failures", "repair",
            "detection", "bus", "control_plane", "checkpoint_events",
            # the capacity's mode and price (simulator.availability), apart from the rest
            "availability",
            # checkpoint tiers and recovery modes (simulator.recovery_config)
            "recovery",
            # a software rollout during the run (simulator.rollout_model)
            "rollout",
            # another scenario file this one starts from (its keys, deep-merged under these)
            "base")
DETECTION_KEYS = ("xid", "ecc", "dcgm", "disk", "thermal", "heartbeat", "speed")


def parse_cluster(value: Any, path: str) -> ClusterCfg:
    data = mapping(value, path)
    only_keys(data, path, ("cluster_id", "gpus_per_node", "machine_type", "accelerator",
                           "partitions", "provision", "preflight", "queues"))
    raw_parts = get(data, "partitions", [{"name": "train", "nodes": 64, "spares": 4}])
    if not isinstance(raw_parts, list) or not raw_parts:
        raise ScenarioError(join(path, "partitions"), "must be a non-empty list")
    parts: list[PartitionCfg] = []
    for i, item in enumerate(raw_parts):
        ppath = join(join(path, "partitions"), i)
        pdata = mapping(item, ppath)
        only_keys(pdata, ppath, ("name", "nodes", "spares", "nodes_per_rack", "spare_layout"))
        name = text(get(pdata, "name", f"p{i}"), join(ppath, "name"))
        nodes = integer(pdata.get("nodes"), join(ppath, "nodes"), low=1)
        spares = integer(get(pdata, "spares", 0), join(ppath, "spares"), low=0)
        if name in [p.name for p in parts]:
            raise ScenarioError(join(ppath, "name"), f"duplicate partition {name!r}")
        # ``nodes`` counts the nodes jobs may use; spares come on top
        per_rack = integer(get(pdata, "nodes_per_rack", 0), join(ppath, "nodes_per_rack"), low=0)
        layout = text(get(pdata, "spare_layout", "perPartition"), join(ppath, "spare_layout"))
        if layout not in SPARE_LAYOUTS:
            raise ScenarioError(join(ppath, "spare_layout"), f"must be one of {SPARE_LAYOUTS}")
        parts.append(PartitionCfg(name, nodes + spares, spares, per_rack, layout))
    return ClusterCfg(
        cluster_id=text(get(data, "cluster_id", "sim"), join(path, "cluster_id")),
        gpus_per_node=integer(get(data, "gpus_per_node", DEFAULT_GPUS_PER_NODE),
                              join(path, "gpus_per_node"), low=1),
        machine_type=text(get(data, "machine_type", DEFAULT_MACHINE_TYPE),
                          join(path, "machine_type")),
        accelerator=text(get(data, "accelerator", DEFAULT_ACCELERATOR),
                         join(path, "accelerator")),
        partitions=tuple(parts),
        provision=dist(get(data, "provision", {"median": DEFAULT_PROVISION_MEDIAN_S,
                                               "sigma": 0.3}), join(path, "provision")),
        preflight=parse_preflight(get(data, "preflight", "off"), join(path, "preflight")),
        queues=parse_queues(data.get("queues"), join(path, "queues"),
                            {p.name: p.nodes - p.spares for p in parts}),
    )


JOB_KEYS = ("name", "partition", "nodes", "step_time", "checkpoint_interval", "checkpoint_save",
            "checkpoint_restore", "startup", "warmup", "mfu", "work", "submit_at", "priority",
            "crash_exit", "hang_exit", "launch_fail", "max_restarts", "rank_progress",
            "team")


def parse_job(value: Any, path: str, cluster: ClusterCfg, index: int) -> JobCfg:
    data = mapping(value, path)
    only_keys(data, path, JOB_KEYS)
    partition = text(get(data, "partition", cluster.partitions[0].name), join(path, "partition"))
    part = next((p for p in cluster.partitions if p.name == partition), None)
    if part is None:
        raise ScenarioError(join(path, "partition"),
                            f"no partition {partition!r} in cluster.partitions")
    nodes = integer(get(data, "nodes", part.nodes - part.spares), join(path, "nodes"), low=1)
    if nodes > part.nodes:
        raise ScenarioError(join(path, "nodes"),
                            f"needs {nodes} nodes; partition {partition!r} has {part.nodes}")
    step = duration(get(data, "step_time", DEFAULT_STEP_TIME_S), join(path, "step_time"))
    if step <= 0:
        raise ScenarioError(join(path, "step_time"), "must be positive")
    interval = duration(get(data, "checkpoint_interval", DEFAULT_CHECKPOINT_INTERVAL_S),
                        join(path, "checkpoint_interval"))
    if interval < step:
        raise ScenarioError(join(path, "checkpoint_interval"),
                            f"must be at least one step ({step:g} s)")
    work = data.get("work")
    name = text(get(data, "name", f"job-{index}"), join(path, "name"))
    if not re.match(r"^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$", name):
        raise ScenarioError(join(path, "name"), "must be lowercase letters, digits, hyphens")
    return JobCfg(
        name=name,
        partition=partition,
        nodes=nodes,
        step_time_s=step,
        checkpoint_interval_s=interval,
        checkpoint_save_s=duration(get(data, "checkpoint_save", DEFAULT_CHECKPOINT_SAVE_S),
                                   join(path, "checkpoint_save")),
        checkpoint_restore_s=duration(get(data, "checkpoint_restore",
                                          DEFAULT_CHECKPOINT_RESTORE_S),
                                      join(path, "checkpoint_restore")),
        startup_s=duration(get(data, "startup", DEFAULT_STARTUP_S), join(path, "startup")),
        warmup_s=duration(get(data, "warmup", 0.0), join(path, "warmup")),
        mfu=number(get(data, "mfu", DEFAULT_MFU_FRACTION), join(path, "mfu"), low=0.0,
                   high=1.0),
        work_s=None if work is None else duration(work, join(path, "work")),
        submit_at_s=duration(get(data, "submit_at", 0.0), join(path, "submit_at")),
        priority=integer(get(data, "priority", 0), join(path, "priority")),
        crash_exit_s=duration(get(data, "crash_exit", DEFAULT_CRASH_EXIT_S),
                              join(path, "crash_exit")),
        hang_exit_s=duration(get(data, "hang_exit", DEFAULT_HANG_EXIT_S),
                             join(path, "hang_exit")),
        launch_fail_s=duration(get(data, "launch_fail", DEFAULT_LAUNCH_FAIL_S),
                               join(path, "launch_fail")),
        max_restarts=integer(get(data, "max_restarts", DEFAULT_MAX_RESTARTS),
                             join(path, "max_restarts"), low=0),
        rank_progress=boolean(get(data, "rank_progress", False), join(path, "rank_progress")),
        team="" if data.get("team") is None else text(data["team"], join(path, "team")),
    )


ACTIONS = ("reset_gpu", "reboot", "reimage", "replace")


def parse_repair(value: Any, path: str) -> RepairCfg:
    data = mapping(value, path)
    only_keys(data, path, ("durations", "mechanical_failure", "verify_interval", "instant"))
    dpath = join(path, "durations")
    raw = mapping(data.get("durations"), dpath)
    only_keys(raw, dpath, ACTIONS)
    durations = {a: dist(raw[a], join(dpath, a)) if a in raw
                 else Dist("lognormal", DEFAULT_REPAIR_MEDIAN_S[a], 0.3) for a in ACTIONS}
    mpath = join(path, "mechanical_failure")
    mraw = mapping(data.get("mechanical_failure"), mpath)
    only_keys(mraw, mpath, ACTIONS)
    mech = {a: number(get(mraw, a, 0.0), join(mpath, a), low=0.0, high=1.0) for a in ACTIONS}
    instant = boolean(get(data, "instant", False), join(path, "instant"))
    verify = 0.0 if instant else DEFAULT_VERIFY_INTERVAL_S
    return RepairCfg(durations, mech, duration(get(data, "verify_interval", verify),
                                               join(path, "verify_interval")), instant)


def parse_detection(value: Any, path: str) -> dict[str, Dist]:
    data = {k: v for k, v in mapping(value, path).items() if k != "report_interval"}
    only_keys(data, path, (*DETECTION_KEYS, "report_interval"))
    defaults: dict[str, Any] = {
        "xid": {"median": DEFAULT_DETECT_MEDIAN_S, "sigma": 0.5},
        "ecc": {"median": 30.0, "sigma": 0.5},
        "dcgm": {"median": 3600.0, "sigma": 0.5},  # found by the next periodic diagnostic
        "disk": {"median": 60.0, "sigma": 0.5},
        "thermal": {"median": 30.0, "sigma": 0.5},
        "heartbeat": {"low": 0.0, "high": 30.0},  # on top of the heartbeat timeout: tick phase
        "speed": {"median": 300.0, "sigma": 0.5},
    }
    return {k: dist(get(data, k, defaults[k]), join(path, k)) for k in DETECTION_KEYS}


def parse_bus(value: Any, path: str) -> BusCfg:
    data = mapping(value, path)
    only_keys(data, path, ("latency", "duplicate", "reorder", "reorder_delay", "retry_delay",
                           "max_deliveries"))
    return BusCfg(
        latency=dist(get(data, "latency", {"median": DEFAULT_BUS_LATENCY_S, "sigma": 0.5}),
                     join(path, "latency")),
        duplicate=number(get(data, "duplicate", 0.0), join(path, "duplicate"), low=0.0,
                         high=1.0),
        reorder=number(get(data, "reorder", 0.0), join(path, "reorder"), low=0.0, high=1.0),
        reorder_delay=dist(get(data, "reorder_delay", {"low": 0.1, "high": 2.0}),
                           join(path, "reorder_delay")),
        retry_delay_s=duration(get(data, "retry_delay", 10.0), join(path, "retry_delay")),
        max_deliveries=integer(get(data, "max_deliveries", 5), join(path, "max_deliveries"),
                               low=1),
    )


def parse_control_plane(value: Any, path: str) -> ControlPlaneCfg:
    data = mapping(value, path)
    only_keys(data, path, ("triage_table", "repair", "grace_period", "heartbeat_timeout",
                           "max_event_age", "backfill"))
    table = data.get("triage_table")
    if table is not None:
        table = text(table, join(path, "triage_table"))
    repair = dict(mapping(data.get("repair"), join(path, "repair")))
    try:
        load_repair_config(repair)
    except ValidationError as exc:
        raise ScenarioError(join(join(path, "repair"), exc.path), exc.reason) from None
    backfill = boolean(get(data, "backfill", False), join(path, "backfill"))
    return ControlPlaneCfg(
        triage_table=table,
        repair=repair,
        grace_period_s=duration(get(data, "grace_period", DEFAULT_GRACE_PERIOD_S),
                                join(path, "grace_period")),
        heartbeat_timeout_s=duration(get(data, "heartbeat_timeout", DEFAULT_HEARTBEAT_TIMEOUT_S),
                                     join(path, "heartbeat_timeout")),
        max_event_age_s=duration(get(data, "max_event_age", DEFAULT_MAX_EVENT_AGE_S),
                                 join(path, "max_event_age")),
        backfill=backfill,
    )


def parse_scenario(data: Any, *, source: str = "") -> Scenario:
    top = mapping(data, "")
    only_keys(top, "", TOP_KEYS)
    cluster = parse_cluster(top.get("cluster"), "cluster")
    raw_jobs = get(top, "jobs", [{}])
    if not isinstance(raw_jobs, list) or not raw_jobs:
        raise ScenarioError("jobs", "must be a non-empty list")
    jobs = tuple(parse_job(j, join("jobs", i), cluster, i) for i, j in enumerate(raw_jobs))
    names = [j.name for j in jobs]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ScenarioError(join(join("jobs", i), "name"), f"duplicate job {name!r}")
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
    failures = parse_failures(top.get("failures"), "failures")
    _check_scripted(failures.scripted, cluster)
    recovery = parse_recovery(top.get("recovery"), "recovery")
    check_recovery(recovery, jobs, events)
    if recovery is not None and recovery.tiers == ("durable",):  # untiered, these sizes
        jobs = tuple(durable_only(recovery, j, cluster.gpus_per_node) for j in jobs)
    detection = mapping(top.get("detection"), "detection")
    report_interval = duration(get(detection, "report_interval", DEFAULT_REPORT_INTERVAL_S),
                               "detection.report_interval")
    if report_interval <= 0:
        raise ScenarioError("detection.report_interval", "must be positive")
    return Scenario(
        name=text(name, "name"),
        description=str(get(top, "description", "")).strip(),
        seed=integer(get(top, "seed", DEFAULT_SEED), "seed", low=0),
        duration_s=duration(get(top, "duration", DEFAULT_DURATION_S), "duration"),
        cluster=cluster,
        jobs=jobs,
        failures=failures,
        repair=parse_repair(top.get("repair"), "repair"),
        detection=parse_detection(top.get("detection"), "detection"),
        bus=parse_bus(top.get("bus"), "bus"),
        control_plane=parse_control_plane(top.get("control_plane"), "control_plane"),
        checkpoint_events=events,
        report_interval_s=report_interval,
        raw=copy.deepcopy(dict(top)),
        availability=parse_availability(top.get("availability"), "availability",
                                        cluster.nodes),
        recovery=recovery,
        rollout=parse_rollout(top.get("rollout"), "rollout"),
    )


def _check_scripted(scripted: tuple[ScriptedFault, ...], cluster: ClusterCfg) -> None:
    for i, spec in enumerate(scripted):
        path = join(join("failures", "scripted"), i)
        part = cluster.partitions[0] if spec.partition is None else next(
            (p for p in cluster.partitions if p.name == spec.partition), None)
        if part is None:
            raise ScenarioError(join(path, "partition"),
                                f"no partition {spec.partition!r} in cluster.partitions")
        if spec.node >= part.nodes:
            raise ScenarioError(join(path, "node"),
                                f"partition {part.name!r} has nodes 0..{part.nodes - 1}")


def load_raw(path: str | Path | None = None, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The YAML of a scenario file (the default Llama 3 one when ``path`` is None). A file
    with ``base: other.yaml`` (relative to it) is that file with this one's keys merged over
    it, mappings key by key (``llama3-tiers.yaml``: Llama 3 plus a ``recovery`` block)."""
    file = resolve(path) if path is not None else DEFAULT_SCENARIO
    data = _read_yaml(file)
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ScenarioError("base", "must be a scenario file name")
    parent = (file.parent / base).resolve()
    if parent in _seen or parent == file.resolve():
        raise ScenarioError("base", f"{base!r} includes itself")
    return _merge(load_raw(parent, (*_seen, file.resolve())), data)


def packaged() -> list[Path]:
    """The scenarios that ship with mtc (``mtc sim scenarios``), by name."""
    return sorted(SCENARIO_DIR.glob("*.yaml"))


def resolve(path: str | Path) -> Path:
    """A scenario file: ``path`` as given when it exists, else a packaged scenario of that
    name (``llama3``, ``llama3.yaml``), so ``mtc sim run llama3`` works from any directory;
    otherwise the path as given (reading it says what is wrong, with the names to use)."""
    file = Path(path)
    if file.is_file():
        return file
    name = file.name if file.suffix in (".yaml", ".yml") else f"{file.name}.yaml"
    shipped = SCENARIO_DIR / name
    if len(file.parts) <= 2 and shipped.exists():
        return shipped
    return file


def _merge(under: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(under)
    for key, value in over.items():
        old = out.get(key)
        out[key] = _merge(old, value) if isinstance(old, dict) and isinstance(value, dict) \
            else value
    return out


def _read_yaml(file: Path) -> dict[str, Any]:
    try:
        text_ = file.read_text(encoding="utf-8")
    except OSError as exc:
        names = ", ".join(p.stem for p in packaged())
        raise ScenarioError(str(file), f"cannot read: {exc.strerror or exc} (a file, or a "
                            f"packaged scenario by name: {names}; `mtc sim scenarios`)") from None
    try:
        data = yaml_text.safe_load(text_)
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
