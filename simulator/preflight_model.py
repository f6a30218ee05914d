"""Preflight in the twin: the real scheduling handlers ask the twin's compute to
preflight a gang (``shared.service_layer.preflight.check``, the cluster's label
``mtc-preflight``); the twin prices it instead of running it.

* **time**: each preflight takes the mode's ``duration`` (chained when a gang is placed again
  after a culprit was excluded); the attempt's processes start after it, and the goodput
  accounting counts the window as the job's scheduling badput (``WAITING_FOR_CAPACITY``,
  cause ``preflight``), as on the embedded default where the preflight blocks the start;
* **catch**: a node of the gang with a fault on it (latent: its own checks may not have said
  so yet) is caught with the mode's probability ``catches``, drawn once per (node, fault): the
  same test misses the same fault again. A caught node fails its ring pairs' all-reduce, so
  the real policy (``shared.policies.preflight.culprits``) names it, it is reported
  (``CollectiveBandwidthLow``), excluded and the gang placed again.

Defaults (a scenario may set its own: ``cluster.preflight: {mode, duration, catches}``):
the durations are the wall times measured on the embedded default (docs/preflight.md: quick,
4 nodes, 4.2 s healthy and 9.4 s with a slow link: 10 s; thorough, 26.0 s and 42.4 s: 45 s), not a
GPU fleet's (a DCGM level 1 or 2 diagnostic takes minutes there: set ``duration``). The catch
shares (quick 0.5, thorough 0.9) are assumptions: no public figure gives them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.policies.preflight import (
    LABEL,
    MODES,
    NodeCheck,
    PairCheck,
    PreflightPlan,
    PreflightResult,
)
from simulator.clock import EPOCH_S
from simulator.fleet import Fleet
from simulator.readers import ScenarioError, duration, get, mapping, number, only_keys, text
from simulator.scenario_types import PreflightCfg
from simulator.streams import DETECT_DOMAIN

DEFAULTS = {"off": PreflightCfg(), "quick": PreflightCfg("quick", 10.0, 0.5),
            "thorough": PreflightCfg("thorough", 45.0, 0.9)}


def parse_preflight(value: Any, path: str) -> PreflightCfg:
    """``off`` | ``quick`` | ``thorough``, or a mapping with ``mode``, ``duration``,
    ``catches`` (the mode's defaults for what it leaves out)."""
    if value is False:  # (YAML reads a bare ``off`` as false)
        value = "off"
    data = {"mode": value} if isinstance(value, str) else dict(mapping(value, path))
    only_keys(data, path, ("mode", "duration", "catches"))
    mode = text(get(data, "mode", "off"), f"{path}.mode" if not isinstance(value, str) else path)
    if mode not in MODES:
        raise ScenarioError(path, f"must be one of {list(MODES)}, got {mode!r}")
    base = DEFAULTS[mode]
    took = duration(data["duration"], f"{path}.duration") if "duration" in data \
        else base.duration_s
    share = number(get(data, "catches", base.catches), f"{path}.catches", low=0, high=1)
    return PreflightCfg(mode, took, share)


def labels(cfg: PreflightCfg) -> dict[str, str]:
    """The cluster's labels for its preflight mode (none when off: the body as before)."""
    return {} if cfg.mode == "off" else {LABEL: cfg.mode}


def run(fleet: Fleet, cfg: PreflightCfg, job_id: str, node_ids: Sequence[str],
        plan: PreflightPlan) -> PreflightResult:
    now = float(fleet.env.now)
    start = max(now, fleet.preflight_until.get(job_id, now))
    end = start + cfg.duration_s
    fleet.preflight_until[job_id] = end
    caught = {nid for nid in node_ids if _caught(fleet, nid, cfg)}
    good, bad = plan.min_busbw_gbps * 10.0, 0.0
    n = len(node_ids)
    pairs = [] if n < 2 else [tuple(sorted({node_ids[i], node_ids[(i + 1) % n]}))
                              for i in range(n if n > 2 else 1)]
    collectives = (PairCheck(tuple(node_ids), bad if caught else good),
                   *(PairCheck(p, bad if caught & set(p) else good) for p in pairs))
    fleet.timeline.append((now, "preflight", job_id, ",".join(sorted(caught))))
    return PreflightResult(tuple(NodeCheck(nid, True, "simulated node") for nid in node_ids),
                           collectives, EPOCH_S + start, EPOCH_S + end,
                           detail=f"simulated {cfg.mode} preflight, {cfg.duration_s:g} s")


def _caught(fleet: Fleet, node_id: str, cfg: PreflightCfg) -> bool:
    node = fleet.nodes.get(node_id)
    if node is None or node.fault is None or node.deleted:
        return False
    rng = fleet.model.streams.rng(DETECT_DOMAIN, f"preflight:{node_id}", node.faults)
    return bool(rng.random() < cfg.catches)


def start_after(fleet: Fleet, job_id: str, now: float) -> float:
    """When an attempt starting now begins: after the preflight that just ran for it."""
    return max(now, fleet.preflight_until.pop(job_id, now))
