"""The ``failures`` section of a scenario, parsed strictly into a
:class:`~simulator.failures.FailureCfg`: causes with their published counts or rates, their
signals and true fixes (or weighted variants of them), lifetimes, lemons, planned restarts, the
diurnal slowdown and stragglers. Errors name the key path, as everywhere in a scenario.
"""

from __future__ import annotations

from typing import Any

from simulator.failures import (
    FIXES,
    LLAMA3_DAYS,
    LLAMA3_NODES,
    LLAMA3_UNEXPECTED,
    RACK_GROUP,
    Cause,
    Diurnal,
    FailureCfg,
    Lemons,
    Lifetime,
    Planned,
    ScriptedFault,
    Signal,
    Stragglers,
    Variant,
)
from simulator.readers import (
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
from simulator.scenario_types import DEFAULT_SPEED_CHECK_INTERVAL_S

SIGNAL_KEYS = ("xid", "ecc_dbe", "row_remap_failure", "dcgm_level", "disk_used", "thermal_c",
               "speed_ratio", "heartbeat_lost")


def parse_signal(value: Any, path: str) -> Signal:
    if value is None or value == "none":
        return Signal()
    data = mapping(value, path)
    only_keys(data, path, SIGNAL_KEYS)
    xids = data.get("xid", [])
    if isinstance(xids, int) and not isinstance(xids, bool):
        xids = [xids]
    if not isinstance(xids, list):
        raise ScenarioError(join(path, "xid"), "must be an XID code or a list of them")
    flag = boolean(data.get("row_remap_failure", False), join(path, "row_remap_failure"))
    beat = boolean(data.get("heartbeat_lost", False), join(path, "heartbeat_lost"))
    return Signal(
        xids=tuple(integer(x, join(join(path, "xid"), i), low=1) for i, x in enumerate(xids)),
        ecc_dbe=integer(get(data, "ecc_dbe", 0), join(path, "ecc_dbe"), low=0),
        row_remap_failure=flag,
        dcgm_level=integer(get(data, "dcgm_level", 0), join(path, "dcgm_level"), low=0),
        disk_used=number(get(data, "disk_used", 0.0), join(path, "disk_used"), low=0, high=1),
        thermal_c=number(get(data, "thermal_c", 0.0), join(path, "thermal_c"), low=0),
        speed_ratio=number(get(data, "speed_ratio", 0.0), join(path, "speed_ratio"), low=0),
        heartbeat=beat,
    )


def parse_failures(value: Any, path: str) -> FailureCfg:
    data = mapping(value, path)
    only_keys(data, path, ("reference", "rate_scale", "causes", "lifetime", "lemons", "planned",
                           "diurnal", "stragglers", "scripted"))
    ref_path = join(path, "reference")
    ref = mapping(get(data, "reference", {}), ref_path)
    only_keys(ref, ref_path, ("nodes", "days"))
    ref_nodes = number(get(ref, "nodes", LLAMA3_NODES), join(ref_path, "nodes"), low=1)
    ref_days = number(get(ref, "days", LLAMA3_DAYS), join(ref_path, "days"), low=1e-9)
    node_days = ref_nodes * ref_days
    scale = number(get(data, "rate_scale", 1.0), join(path, "rate_scale"), low=0.0)

    causes_path = join(path, "causes")
    raw_causes = mapping(get(data, "causes", {}), causes_path)
    causes = tuple(_parse_cause(str(name), body, join(causes_path, str(name)), node_days, scale)
                   for name, body in raw_causes.items())

    lpath = join(path, "lifetime")
    life = mapping(get(data, "lifetime", {}), lpath)
    only_keys(life, lpath, ("distribution", "shape"))
    kind = get(life, "distribution", "exponential")
    if kind not in ("exponential", "weibull"):
        raise ScenarioError(join(lpath, "distribution"),
                            f"must be exponential or weibull, got {kind!r}")
    shape = number(get(life, "shape", 1.0), join(lpath, "shape"), low=0.05)

    mpath = join(path, "lemons")
    lem = mapping(get(data, "lemons", {}), mpath)
    only_keys(lem, mpath, ("fraction", "multiplier"))

    ppath = join(path, "planned")
    plan = mapping(get(data, "planned", {}), ppath)
    only_keys(plan, ppath, ("count", "per_day", "periodic"))
    if "count" in plan and "per_day" in plan:
        raise ScenarioError(ppath, "give either count (over the reference days) or per_day")
    if "per_day" in plan:
        planned_rate = number(plan["per_day"], join(ppath, "per_day"), low=0.0)
    else:
        planned_rate = number(get(plan, "count", 0), join(ppath, "count"), low=0.0) / ref_days
    periodic = boolean(get(plan, "periodic", False), join(ppath, "periodic"))

    dpath = join(path, "diurnal")
    diu = mapping(get(data, "diurnal", {}), dpath)
    only_keys(diu, dpath, ("amplitude", "peak_hour"))

    spath = join(path, "stragglers")
    strag = mapping(get(data, "stragglers", {}), spath)
    only_keys(strag, spath, ("per_1000_node_days", "ratio", "duration", "report_interval"))
    return FailureCfg(
        causes=causes,
        lifetime=Lifetime(kind, shape),
        lemons=Lemons(number(get(lem, "fraction", 0.0), join(mpath, "fraction"), low=0, high=1),
                      number(get(lem, "multiplier", 1.0), join(mpath, "multiplier"), low=1.0)),
        planned=Planned(planned_rate, periodic),
        diurnal=Diurnal(number(get(diu, "amplitude", 0.0), join(dpath, "amplitude"), low=0,
                               high=0.9),
                        number(get(diu, "peak_hour", 15.0), join(dpath, "peak_hour"), low=0,
                               high=24)),
        stragglers=Stragglers(
            number(get(strag, "per_1000_node_days", 0.0), join(spath, "per_1000_node_days"),
                   low=0) / 1000.0 * scale,
            dist(get(strag, "ratio", {"low": 0.55, "high": 0.85}), join(spath, "ratio"),
                 as_duration=False),
            dist(get(strag, "duration", {"median": 6 * 3600.0, "sigma": 0.7}),
                 join(spath, "duration")),
            duration(get(strag, "report_interval", DEFAULT_SPEED_CHECK_INTERVAL_S),
                     join(spath, "report_interval")),
        ),
        rate_scale=scale,
        reference_node_days=node_days,
        scripted=_parse_scripted(data.get("scripted"), join(path, "scripted"), causes),
    )


def _parse_scripted(value: Any, path: str, causes: tuple[Cause, ...]
                    ) -> tuple[ScriptedFault, ...]:
    """``scripted: [{at: 2h, node: 0, cause: faulty_gpu}, ...]``: the cause must be one of
    ``causes`` (a count of 0 keeps it out of the random faults); ``variant`` and ``fix``
    are optional. The partition is checked against the cluster by the scenario parser."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ScenarioError(path, "must be a list of {at, node, cause}")
    by_name = {c.name: c for c in causes}
    out: list[ScriptedFault] = []
    for i, item in enumerate(value):
        ipath = join(path, i)
        data = mapping(item, ipath)
        only_keys(data, ipath, ("at", "node", "partition", "cause", "variant", "fix"))
        for key in ("at", "node", "cause"):
            if key not in data:
                raise ScenarioError(join(ipath, key), "is required")
        name = text(data["cause"], join(ipath, "cause"))
        cause = by_name.get(name)
        if cause is None:
            raise ScenarioError(join(ipath, "cause"),
                                f"no cause {name!r} in failures.causes")
        variant = None
        if "variant" in data:
            variant = integer(data["variant"], join(ipath, "variant"), low=0)
            if variant >= len(cause.variants):
                raise ScenarioError(join(ipath, "variant"),
                                    f"{name!r} has {len(cause.variants)} variant(s)")
        fix = None
        if "fix" in data:
            fix = text(data["fix"], join(ipath, "fix"))
            if fix not in FIXES:
                raise ScenarioError(join(ipath, "fix"), f"must be one of {', '.join(FIXES)}")
        partition = text(data["partition"], join(ipath, "partition")) \
            if "partition" in data else None
        out.append(ScriptedFault(duration(data["at"], join(ipath, "at")),
                                 integer(data["node"], join(ipath, "node"), low=0), partition,
                                 name, variant, fix))
    return tuple(out)  # in the order written: error paths name these indexes


CAUSE_KEYS = ("label", "category", "count", "per_1000_node_days", "kills_job", "hang",
              "signal", "fix", "group", "variants", "slows")


def _parse_cause(name: str, value: Any, path: str, node_days: float, scale: float) -> Cause:
    data = mapping(value, path)
    only_keys(data, path, CAUSE_KEYS)
    if "count" in data and "per_1000_node_days" in data:
        raise ScenarioError(path, "give either count (over the reference) or per_1000_node_days")
    if "per_1000_node_days" in data:
        rate = number(data["per_1000_node_days"], join(path, "per_1000_node_days"), low=0) / 1e3
    else:
        rate = number(get(data, "count", 0), join(path, "count"), low=0) / node_days
    kills = boolean(get(data, "kills_job", True), join(path, "kills_job"))
    hang = boolean(get(data, "hang", False), join(path, "hang"))
    slows = number(get(data, "slows", 1.0), join(path, "slows"), low=1)
    if "variants" in data:
        for key in ("signal", "fix", "group"):
            if key in data:
                raise ScenarioError(join(path, key), "give it per variant when variants are set")
        vpath = join(path, "variants")
        raw = data["variants"]
        if not isinstance(raw, list) or not raw:
            raise ScenarioError(vpath, "must be a non-empty list")
        variants = tuple(_parse_variant(v, join(vpath, i), with_weight=True)
                         for i, v in enumerate(raw))
    else:
        variants = (_parse_variant({k: data[k] for k in ("signal", "fix", "group") if k in data},
                                   path, with_weight=False),)
    total = sum(v.weight for v in variants)
    if total <= 0:
        raise ScenarioError(path, "variant weights must add up to more than 0")
    label = get(data, "label", LLAMA3_UNEXPECTED.get(name, (name, "", 0))[0])
    category = get(data, "category", LLAMA3_UNEXPECTED.get(name, ("", "other", 0))[1])
    return Cause(name, text(label, join(path, "label")), text(category, join(path, "category")),
                 rate * scale, tuple(Variant(v.weight / total, v.signal, v.fix, v.group)
                                     for v in variants), kills, hang, slows)


def _parse_variant(value: Any, path: str, *, with_weight: bool) -> Variant:
    data = mapping(value, path)
    only_keys(data, path, ("weight", "signal", "fix", "group") if with_weight
              else ("signal", "fix", "group"))
    weight = number(get(data, "weight", 1.0), join(path, "weight"), low=0) if with_weight else 1.0
    fpath = join(path, "fix")
    raw_fix = get(data, "fix", "reboot")
    if isinstance(raw_fix, str):
        raw_fix = {raw_fix: 1.0}
    fix = mapping(raw_fix, fpath)
    only_keys(fix, fpath, FIXES)
    pairs = tuple((k, number(v, join(fpath, k), low=0)) for k, v in fix.items())
    total = sum(p for _, p in pairs)
    if total <= 0:
        raise ScenarioError(fpath, "probabilities must add up to more than 0")
    signal = parse_signal(data.get("signal"), join(path, "signal"))
    group = get(data, "group", 1)  # "rack": every node of the struck node's rack
    return Variant(weight, signal, tuple((k, p / total) for k, p in pairs),
                   RACK_GROUP if group == "rack" else integer(group, join(path, "group"), low=1))

