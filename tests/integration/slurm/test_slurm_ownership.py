"""SlurmCompute on the real cluster: whose drain it is, gangs, and scripts that stay data.

Each test drives its own SlurmCompute (own state dir, partition ``mtcown`` over n3-n4) and
puts n3/n4 back in service however it ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from shared.adapters.clock import SystemClock
from shared.adapters.compute.slurm.cli import SlurmCli, SlurmError
from shared.adapters.compute.slurm.compute import SlurmCompute
from shared.domain.events import JobWorkersExited, NodeHealthReported, NodeProvisioned
from shared.domain.model import Node, NodeRole, NodeState
from shared.ports import Gang, LaunchGroup
from tests.harness import Recorder

from .conftest import Cluster

pytestmark = pytest.mark.integration

NODES = ("n3", "n4")


def node(node_id: str) -> Node:
    return Node(node_id, "c", "pool", "train", NodeRole.WORKER, "a3-highgpu-8g", "NVIDIA_H100_80GB", 8,
                NodeState.PROVISIONING, 0.0)


def until(compute: SlurmCompute, done: Callable[[], bool], timeout_s: float, what: str) -> float:
    start = time.monotonic()
    while not done():
        if time.monotonic() - start > timeout_s:
            pytest.fail(f"timed out after {timeout_s:g}s waiting for {what}")
        compute.poll()
        time.sleep(0.1)
    return time.monotonic() - start


def operator_reports(rec: Recorder, node_id: str, ctype: str) -> list[dict[str, object]]:
    return [c for e in rec.of(NodeHealthReported) if e.node_id == node_id and e.source == "operator"
            for c in e.conditions if c["type"] == ctype]


def restore(slurm: SlurmCli) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        nodes = {n.name: n for n in slurm.nodes()}
        if all(nodes[n].available and not nodes[n].drained for n in NODES):
            return
        for name in NODES:
            if nodes[name].drained:
                with contextlib.suppress(SlurmError):
                    slurm.resume(name)
        time.sleep(0.5)


@pytest.fixture
def made(cluster: Cluster, tmp_path: Path) -> Iterator[tuple[Callable[[], SlurmCompute], Recorder]]:
    rec = Recorder()
    built: list[SlurmCompute] = []

    def make() -> SlurmCompute:
        compute = SlurmCompute(tmp_path / "state", rec, SystemClock(), slurm_conf=cluster.slurm_conf,
                               partition="mtcown", slurm_nodes=NODES, agent_probes=("xid",),
                               observe_interval_s=0.0)
        built.append(compute)
        return compute

    yield make, rec
    for compute in built:
        compute.kill_all()
        compute.close()
    restore(cluster.slurm)


def provision(compute: SlurmCompute, rec: Recorder, *ids: str) -> dict[str, str]:
    for node_id in ids:
        compute.provision_node(node(node_id))
    until(compute, lambda: len([e for e in rec.of(NodeProvisioned) if e.ok]) >= len(ids), 60, "provisioned")
    return compute.mapping()


def test_foreign_drain_is_not_undone(
    made: tuple[Callable[[], SlurmCompute], Recorder], cluster: Cluster
) -> None:
    make, rec = made
    compute = make()
    name = provision(compute, rec, "w0")["w0"]
    slurm = cluster.slurm
    assert slurm.node(name).reason.startswith("mtc: ")
    slurm._check(["scontrol", "update", f"nodename={name}", "state=drain", "reason=admin: bad fan"])
    until(compute, lambda: bool(operator_reports(rec, "w0", "DrainedByOperator")), 30, "foreign drain report")
    [report] = operator_reports(rec, "w0", "DrainedByOperator")
    assert report["status"] == "true" and "admin: bad fan" in str(report["reason"])
    compute.cordon("w0", "xid 79")  # must not overwrite the operator's reason
    compute.uncordon("w0")  # must not resume the operator's drain
    for _ in range(10):
        compute.poll()
        time.sleep(0.1)
    now = slurm.node(name)
    assert now.drained and now.reason == "admin: bad fan", now
    assert any(a.kind == "foreign-drain-kept" for a in compute.alerts())
    slurm._check(["scontrol", "update", f"nodename={name}", "state=resume"])
    until(compute, lambda: len(operator_reports(rec, "w0", "DrainedByOperator")) == 2, 30, "drain lifted")
    assert operator_reports(rec, "w0", "DrainedByOperator")[-1]["status"] == "false"


def test_admin_resume_of_mtc_drain_is_noticed(
    made: tuple[Callable[[], SlurmCompute], Recorder], cluster: Cluster
) -> None:
    make, rec = made
    compute = make()
    name = provision(compute, rec, "w1")["w1"]
    compute.cordon("w1", "xid 79: gpu fell off the bus")
    slurm = cluster.slurm
    until(compute, lambda: slurm.node(name).reason == "mtc: xid 79: gpu fell off the bus", 30, "mtc drain")
    slurm._check(["scontrol", "update", f"nodename={name}", "state=resume"])
    until(compute, lambda: bool(operator_reports(rec, "w1", "ResumedByOperator")), 30, "resume noticed")
    [report] = operator_reports(rec, "w1", "ResumedByOperator")
    assert report["status"] == "true" and "resumed by an operator" in str(report["reason"])
    assert any(a.kind == "operator-resume" for a in compute.alerts())
    until(compute, lambda: slurm.node(name).drained, 30, "drained again")  # the safe default
    assert slurm.node(name).reason == "mtc: xid 79: gpu fell off the bus"
    compute.uncordon("w1")  # mtc's own drain: mtc may lift it
    until(compute, lambda: not slurm.node(name).drained, 30, "resumed by mtc")
    assert len(operator_reports(rec, "w1", "ResumedByOperator")) == 1  # mtc's resume is not an operator's


TRAIN = """
import os, time
d = os.environ["AIP_CHECKPOINT_DIR"]
open(os.path.join(d, f"pid-{os.environ['RANK']}"), "w").write(str(os.getpid()))
print("PAYLOAD", repr(os.environ.get("PAYLOAD")), flush=True)
while True:
    time.sleep(0.1)
"""


def alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2 :].split()[0] not in ("Z", "X")


def test_one_rank_killed_ends_the_gang(
    made: tuple[Callable[[], SlurmCompute], Recorder], cluster: Cluster, tmp_path: Path
) -> None:
    make, rec = made
    compute = make()
    mapping = provision(compute, rec, "g0", "g1")
    for node_id in mapping:
        compute.uncordon(node_id)
    until(compute, lambda: all(cluster.slurm.node(n).available and not cluster.slurm.node(n).drained
                               for n in mapping.values()), 30, "nodes in service")
    out = tmp_path / "out"
    payload = "$(touch PWNED) `touch PWNED2`; touch PWNED3 'q' \"d\""
    group = LaunchGroup(0, 2, (sys.executable, "-c", TRAIN), (("PAYLOAD", payload),))
    compute.start_workers(Gang("gang", 1, ("g0", "g1"), (group,), str(out / "c"), str(out / "m"),
                               str(out / "t")))
    pids: dict[int, int] = {}

    def started() -> bool:
        for r in range(2):
            with contextlib.suppress(OSError, ValueError):
                pids[r] = int((out / "c" / f"pid-{r}").read_text())
        return len(pids) == 2

    until(compute, started, 60, "both ranks running")
    os.kill(pids[1], signal.SIGKILL)
    took = until(compute, lambda: not alive(pids[0]), 20, "rank 0 gone with the gang")
    print(f"\n[timing] rank 0 gone {took:.1f}s after rank 1 was killed", file=sys.stderr)
    until(compute, lambda: bool(rec.of(JobWorkersExited)), 30, "attempt over")
    for _ in range(5):
        compute.poll()
    [ended] = rec.of(JobWorkersExited)
    print(f"[gang] {ended}", file=sys.stderr)
    assert ended.exit_code == 137, ended
    assert "rank 1: 137" in ended.detail and "rank 1 failed first" in ended.detail
    log = compute.job_log("gang").read_text()
    assert f"PAYLOAD {payload!r}" in log
    for where in (compute.run_dir("gang", 1), Path.cwd(), out / "c"):
        assert not list(where.glob("PWNED*")), where
