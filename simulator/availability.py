"""How the fleet's capacity is bought: on-demand, spot, queued (a workload scheduler) or a
reservation, each with a price per node-hour; and the twin's side of it at run time.

The scenario's ``availability`` section (its own block, apart from the failure model):

```yaml
availability:
  mode: spot                    # on_demand (default) | spot | queued | reservation
  price_per_node_hour: 30.0     # what one node costs an hour in this mode (no default:
                                # without it the cost is unknown, never a made-up figure)
  spot:
    preemptions_per_node_day: 0.1   # each node's preemption clock (Poisson)
    notice: 30s                     # from the notice until the VM is gone
    detect: 1s                      # the agent reads the notice (metadata server poll)
    obtain: {median: 10m, sigma: 0.5}   # a new spot VM for a preempted one
  queued:
    wait: {median: 2h, sigma: 1.0}  # before the request is granted (all nodes at once)
    replacements: true              # each replacement queues again
  reservation:
    nodes: 68                   # reserved (billed) nodes; default: the cluster's, spares in
```

At run time (:class:`simulator.capacity.Capacity`): a spot node gets a ``PreemptionNotice`` health report from
the agent (the real triage table maps it to drain-and-replace: the job checkpoints in its
grace period and moves to a spare), and ``notice`` later the node is gone whether or not the
job got off it (progress since its last checkpoint is then lost). Queued capacity delays the
nodes' arrival (the cluster, and so the run, starts later; the wait is not billed). The
meter counts node-hours from the moment a VM exists to its deletion, its preemption or the
end of the run; a reservation is billed for all its nodes for the whole run. Preemptions
and queue waits draw from the availability's own random stream, never the failure stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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

MODES = ("on_demand", "spot", "queued", "reservation")
DEFAULT_NOTICE_S = 30.0  # GCE spot / preemptible VMs: 30 s from the ACPI soft off to stop
DEFAULT_DETECT_S = 1.0
DEFAULT_OBTAIN = {"median": 600.0, "sigma": 0.5}
DEFAULT_QUEUE_WAIT = {"median": 7200.0, "sigma": 1.0}


@dataclass(frozen=True)
class SpotCfg:
    preemptions_per_node_day: float = 0.0
    notice_s: float = DEFAULT_NOTICE_S
    detect_s: float = DEFAULT_DETECT_S
    obtain: Dist = field(default_factory=lambda: Dist("lognormal", 600.0, 0.5))


@dataclass(frozen=True)
class QueuedCfg:
    wait: Dist = field(default_factory=lambda: Dist("lognormal", 7200.0, 1.0))
    replacements: bool = True


@dataclass(frozen=True)
class AvailabilityCfg:
    mode: str = "on_demand"
    price_per_node_hour: float | None = None
    spot: SpotCfg = field(default_factory=SpotCfg)
    queued: QueuedCfg = field(default_factory=QueuedCfg)
    reserved_nodes: int | None = None  # None: the cluster's node count
    explicit: bool = False  # the scenario has the section (its run reports the cost)


def parse_availability(value: Any, path: str, cluster_nodes: int) -> AvailabilityCfg:
    if value is None:
        return AvailabilityCfg()
    data = mapping(value, path)
    only_keys(data, path, ("mode", "price_per_node_hour", "spot", "queued", "reservation"))
    mode = text(get(data, "mode", "on_demand"), join(path, "mode"))
    if mode not in MODES:
        raise ScenarioError(join(path, "mode"), f"must be one of {', '.join(MODES)}, "
                                                f"got {mode!r}")
    price = data.get("price_per_node_hour")
    sections = {"spot": "spot", "queued": "queued", "reservation": "reservation"}
    for key, wanted in sections.items():
        if key in data and mode != wanted:
            raise ScenarioError(join(path, key), f"only applies with mode: {wanted}")
    spath, qpath, rpath = join(path, "spot"), join(path, "queued"), join(path, "reservation")
    sdata = mapping(data.get("spot"), spath)
    only_keys(sdata, spath, ("preemptions_per_node_day", "notice", "detect", "obtain"))
    qdata = mapping(data.get("queued"), qpath)
    only_keys(qdata, qpath, ("wait", "replacements"))
    rdata = mapping(data.get("reservation"), rpath)
    only_keys(rdata, rpath, ("nodes",))
    reserved = rdata.get("nodes")
    return AvailabilityCfg(
        mode=mode,
        price_per_node_hour=None if price is None else number(
            price, join(path, "price_per_node_hour"), low=0.0),
        spot=SpotCfg(
            preemptions_per_node_day=number(get(sdata, "preemptions_per_node_day", 0.0),
                                            join(spath, "preemptions_per_node_day"), low=0.0),
            notice_s=duration(get(sdata, "notice", DEFAULT_NOTICE_S), join(spath, "notice")),
            detect_s=duration(get(sdata, "detect", DEFAULT_DETECT_S), join(spath, "detect")),
            obtain=dist(get(sdata, "obtain", DEFAULT_OBTAIN), join(spath, "obtain")),
        ),
        queued=QueuedCfg(
            wait=dist(get(qdata, "wait", DEFAULT_QUEUE_WAIT), join(qpath, "wait")),
            replacements=boolean(get(qdata, "replacements", True),
                                 join(qpath, "replacements")),
        ),
        reserved_nodes=None if reserved is None else integer(
            reserved, join(rpath, "nodes"), low=cluster_nodes),
        explicit=True,
    )


