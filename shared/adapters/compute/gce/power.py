"""Slurm power saving on Compute Engine: the ResumeProgram and SuspendProgram.

Slurm runs ``ResumeProgram HOSTLIST`` to power nodes up and ``SuspendProgram HOSTLIST`` to
power them down (``scripts/slurm/gce-resume``, ``gce-suspend`` exec this module). As Google's
Slurm-on-GCE tooling (slurm-gcp's ``resume.py``/``suspend.py``) does, the host list is
expanded with ``scontrol show hostnames``, each Slurm node is one instance of the same name,
its shape comes from its nodeset (the longest configured name prefix), and a node that
cannot be had before the deadline is set ``DOWN`` with the reason, so Slurm requeues its
job elsewhere and tries again later. The instances are made and deleted by ``GceCompute``
(its state file is shared with later runs: a stock-out left waiting is carried on by the next
resume, with its ``requestId``, never doubled).

Config (JSON, ``--config`` or ``$MTC_GCE_POWER_CONFIG``)::

    {"project": "p", "zone": "us-central1-a", "state_dir": "/var/lib/mtc/gce-power",
     "nodesets": {"c1-gpu": {"machine_type": "a3-highgpu-8g",
                             "accelerator_type": "NVIDIA_H100_80GB", "accelerator_count": 8,
                             "provisioning_model": "SPOT", "reservation": "",
                             "image": "projects/p/global/images/family/mtc-node"}}}

``api_endpoint`` (with ``"anonymous": true``, accepted only for a loopback endpoint) points
it at the test stand-in. Commands run as argv lists, never through a shell.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from shared.adapters.compute.gce.api import GceConfig, api_from_dict, config_from_dict
from shared.adapters.compute.gce.compute import GceCompute
from shared.domain.events import Event, NodeProvisioned
from shared.domain.model import Node, NodeRole, NodeState

log = logging.getLogger("mtc.gce_power")
Runner = Callable[[Sequence[str]], str]


class _Clock:
    def now(self) -> float:
        return time.time()


def run_scontrol(argv: Sequence[str]) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True,
                          timeout=30).stdout


def hostnames(hostlist: str, runner: Runner) -> list[str]:
    return [h for h in runner(["scontrol", "show", "hostnames", hostlist]).split() if h]


def nodeset_of(name: str, nodesets: Mapping[str, Any]) -> str | None:
    """The nodeset a Slurm node belongs to: the longest configured prefix of its name."""
    matches = [s for s in nodesets if name == s or name.startswith(s + "-") or
               (name.startswith(s) and name[len(s):].isdigit())]
    return max(matches, key=len) if matches else None


def load_config(path: Path) -> tuple[GceConfig, dict[str, Any]]:
    data = json.loads(path.read_text())
    if "state_dir" not in data:
        raise ValueError(f"{path}: missing 'state_dir'")
    # Slurm node name = instance name, as slurm-gcp has it
    return config_from_dict(data, pools_key="nodesets", name_prefix=""), data


def _node(name: str, nodeset: str, spec: Mapping[str, Any]) -> Node:
    return Node(name, str(spec.get("cluster_id", "slurm")), nodeset, nodeset, NodeRole.WORKER,
                str(spec["machine_type"]), spec.get("accelerator_type"),
                int(spec.get("accelerator_count", 0)), NodeState.PROVISIONING, time.time())


def resume(hostlist: str, config_path: Path, *, runner: Runner = run_scontrol,
           timeout_s: float = 300.0, poll_s: float = 0.5) -> int:
    """Create the instances of ``hostlist``; nodes not up by the deadline go DOWN."""
    config, data = load_config(config_path)
    names = hostnames(hostlist, runner)
    up: dict[str, NodeProvisioned] = {}

    def record(event: Event) -> None:
        if isinstance(event, NodeProvisioned):
            up[event.node_id] = event

    gce = GceCompute(Path(data["state_dir"]), record, _Clock(), api_from_dict(config, data),
                     wait_operations=True)
    down: dict[str, str] = {}
    try:
        for name in names:
            nodeset = nodeset_of(name, data["nodesets"])
            if nodeset is None:
                down[name] = "mtc: no nodeset configured for this node"
                continue
            if gce.running(name):  # Slurm asks again for a node that is up: nothing to do
                up[name] = NodeProvisioned(name, True, "running already")
                continue
            gce.provision_node(_node(name, nodeset, data["nodesets"][nodeset]))
        deadline = time.monotonic() + timeout_s
        wanted = [n for n in names if n not in down]
        while any(n not in up for n in wanted) and time.monotonic() < deadline:
            gce.poll()
            time.sleep(poll_s)
        for name in wanted:
            event = up.get(name)
            if event is None:
                waiting = [w.detail for w in gce.waits() if w.node_id == name]
                down[name] = "mtc: " + (f"waiting for capacity: {waiting[0]}" if waiting
                                        else f"not up after {timeout_s:g}s")
            elif not event.ok:
                down[name] = f"mtc: {event.detail}"
    finally:
        gce.close()
    for name, reason in down.items():
        log.error("resume %s failed: %s", name, reason)
        runner(["scontrol", "update", f"nodename={name}", "state=down",
                f"reason={reason[:200]}"])
    return 1 if down else 0


def suspend(hostlist: str, config_path: Path, *, runner: Runner = run_scontrol,
            timeout_s: float = 300.0, poll_s: float = 0.5) -> int:
    """Delete the instances of ``hostlist`` (what Slurm powers down)."""
    config, data = load_config(config_path)
    names = hostnames(hostlist, runner)
    gce = GceCompute(Path(data["state_dir"]), lambda event: None, _Clock(),
                     api_from_dict(config, data), wait_operations=True)
    try:
        for name in names:
            gce.delete_node(name)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(
                t["status"] == "active" for n in names for t in gce.tasks(n)):
            gce.poll()
            time.sleep(poll_s)
        left = [n for n in names if any(t["status"] == "active" for t in gce.tasks(n))]
    finally:
        gce.close()
    for name in left:
        log.error("suspend %s: instance not deleted after %gs", name, timeout_s)
    return 1 if left else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gce_power", description=__doc__.split("\n")[0])
    parser.add_argument("verb", choices=("resume", "suspend"))
    parser.add_argument("hostlist")
    parser.add_argument("--config", default=os.environ.get("MTC_GCE_POWER_CONFIG",
                                                           "/etc/mtc/gce-power.json"))
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    action = resume if args.verb == "resume" else suspend
    return action(args.hostlist, Path(args.config), timeout_s=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
