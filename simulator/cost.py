"""Cost per useful GPU-hour: what the capacity cost over what training kept.

cost = node-hours billed (spares and nodes in repair included; a reservation's whole size for
the whole run) x the mode's price per node-hour; useful GPU-hours = the goodput accounting's
productive time (kept training compute, fleet-wide) in GPU-hours. Without a price the cost is
unknown (``None``), never zero. Pure arithmetic over the run's totals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.availability import AvailabilityCfg

HOUR = 3600.0


@dataclass(frozen=True)
class CostInputs:
    node_hours_metered: float  # VM-hours the meter counted (existence, not use)
    run_hours: float  # from the create request to the end of the run
    cluster_nodes: int
    productive_gpu_s: float  # the accounting's fleet productive GPU-seconds


def billed_node_hours(cfg: AvailabilityCfg, inputs: CostInputs) -> float:
    if cfg.mode == "reservation":
        return (cfg.reserved_nodes or inputs.cluster_nodes) * inputs.run_hours
    return inputs.node_hours_metered


def cost_summary(cfg: AvailabilityCfg, inputs: CostInputs) -> dict[str, Any]:
    node_h = billed_node_hours(cfg, inputs)
    useful = inputs.productive_gpu_s / HOUR
    price = cfg.price_per_node_hour
    cost = None if price is None else node_h * price
    return {
        "mode": cfg.mode,
        "price_per_node_hour": price,
        "node_hours": node_h,
        "useful_gpu_hours": useful,
        "cost": cost,
        "cost_per_useful_gpu_hour": None if cost is None or useful <= 0 else cost / useful,
    }
