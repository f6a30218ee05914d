"""One ``Compute`` from two: Compute Engine makes the machines, another adapter runs the work.

On Google Cloud the machines' lifecycle (create, reset, reboot, reimage, replace, delete,
maintenance) is Compute Engine's (``GceCompute``) and the workers on them run through Slurm
(``SlurmCompute``) or, on one host, as local processes (``LocalCompute``). ``MachinesAndWorkers``
routes each port call to the side that owns it:

* ``provision_node``, ``start_repair``: the machines. A provisioned instance is handed to the
  workers side (its ``provision_node``: a Slurm node mapped and resumed, a local record), and
  the node is reported up by the workers side once it can take work: one ``NodeProvisioned``
  per node, when both halves are ready. A failed provisioning is the machines' report.
* ``cordon``, ``uncordon``: both (the workers side fences: a Slurm drain; the machines side
  keeps the reason a replace reports to Compute Engine as the host's fault).
* ``delete_node``: both (the workers side lets go first, then the instance is deleted).
* ``start_workers``, ``signal_workers``, ``stop_workers``, ``start_deep_check``: the workers
  (deep checks run on the machine through the workers' scheduler).

The workers side declares what it must offer (``Workers``: the port, deep checks, ``poll``
and ``close``); both adapters used here do, so nothing is probed at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from shared.adapters.compute.gce.api import api_from_dict, config_from_dict
from shared.adapters.compute.gce.compute import GceCompute
from shared.domain.health import RepairAction
from shared.domain.model import Node
from shared.ports import Clock, Closeable, Compute, DeepChecks, Emitter, Gang


class Workers(Compute, DeepChecks, Closeable, Protocol):
    """The workers side: the port with deep checks, polled and closed by its owner."""

    def poll(self) -> None: ...


class MachinesAndWorkers:
    """The ``Compute`` port over ``GceCompute`` (machines) and a workers adapter."""

    def __init__(self, machines: GceCompute, workers: Workers) -> None:
        self.machines = machines
        self.workers = workers
        machines.on_ready = workers.provision_node

    def provision_node(self, node: Node) -> None:
        self.machines.provision_node(node)

    def cordon(self, node_id: str, reason: str) -> None:
        self.machines.cordon(node_id, reason)
        self.workers.cordon(node_id, reason)

    def uncordon(self, node_id: str) -> None:
        self.machines.uncordon(node_id)
        self.workers.uncordon(node_id)

    def delete_node(self, node_id: str) -> None:
        self.workers.delete_node(node_id)
        self.machines.delete_node(node_id)

    def start_repair(self, node_id: str, action: RepairAction, attempt: int) -> None:
        self.machines.start_repair(node_id, action, attempt)

    def start_workers(self, gang: Gang) -> None:
        self.workers.start_workers(gang)

    def start_deep_check(self, node_id: str, attempt: int) -> None:
        """The checks run on the machine through the workers' scheduler (Slurm: srun in a
        maintenance reservation), not through the Compute Engine API."""
        self.workers.start_deep_check(node_id, attempt)

    def signal_workers(self, job_id: str, attempt: int, grace_s: float) -> None:
        self.workers.signal_workers(job_id, attempt, grace_s)

    def stop_workers(self, job_id: str, attempt: int) -> None:
        self.workers.stop_workers(job_id, attempt)

    def poll(self) -> None:
        """The machines first (a node they finished is handed over in the same poll)."""
        self.machines.poll()
        self.workers.poll()

    def close(self) -> None:
        self.machines.close()
        self.workers.close()


def gce_over_slurm(state_dir: Path, emit: Emitter, clock: Clock, *, gce: Mapping[str, Any],
                   slurm_conf: str | None = None, **slurm_options: Any) -> MachinesAndWorkers:
    """Compute Engine machines with Slurm workers (the executor on a cluster in the cloud):
    ``gce`` is the ``config_from_dict`` document (project, zone, pools by mtc pool id, and
    ``GceCompute`` timings under ``"options"``)."""
    from shared.adapters.compute.slurm.compute import SlurmCompute

    config = config_from_dict(gce)
    machines = GceCompute(Path(state_dir) / "gce", emit, clock, api_from_dict(config, gce),
                          **dict(gce.get("options") or {}))
    workers = SlurmCompute(Path(state_dir) / "slurm", emit, clock, slurm_conf=slurm_conf,
                           **slurm_options)
    return MachinesAndWorkers(machines, workers)
