"""`mtc node fault` injects only faults a node could report, on a worker that is there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.cli.main import main
from services.wiring.embedded import embedded
from shared.adapters.compute.local.nodes import LocalNodes
from shared.domain.errors import NotFound, ValidationError
from shared.domain.faults import FaultRequest, check_fault_target, validate_fault
from shared.domain.model import Node, NodeRole, NodeState


def _node(node_id: str, role: NodeRole = NodeRole.WORKER,
          state: NodeState = NodeState.IDLE) -> Node:
    return Node(node_id, "c", "gpu" if role is NodeRole.WORKER else "login", "train", role,
                "a3-highgpu-8g", "NVIDIA_H100_80GB", 8, state, 0.0)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list[Any]]:
    """A state dir with a worker, a login node and a retired worker; inject_fault recorded."""
    app = embedded(tmp_path)
    try:
        with app.transaction() as uow:
            for node in (_node("w0"), _node("login0", NodeRole.LOGIN),
                         _node("gone", state=NodeState.RETIRED)):
                uow.nodes.add(node)
    finally:
        app.close()
    injected: list[Any] = []
    monkeypatch.setattr(LocalNodes, "inject_fault",
                        lambda self, node_id, conditions: injected.append((node_id, conditions)))
    monkeypatch.delenv("MTC_STATE_DIR", raising=False)
    return tmp_path, injected


NONSENSE = [
    (["w0", "--ecc-dbe", "-3"], "--ecc-dbe"),
    (["w0", "--ecc-dbe", "0"], "--ecc-dbe"),
    (["w0", "--disk", "5"], "--disk"),  # "500 %"
    (["w0", "--disk", "-0.1"], "--disk"),
    (["w0", "--slow", "-2"], "--slow"),  # got the node replaced
    (["w0", "--slow", "0"], "--slow"),
    (["w0", "--slow", "1.5"], "--slow"),  # faster than baseline is not slow
    (["w0", "--slow", "nan"], "--slow"),
    (["w0", "--thermal", "-40"], "--thermal"),
    (["w0", "--thermal", "900"], "--thermal"),
    (["w0", "--thermal", "inf"], "--thermal"),
    (["w0", "--xid", "0"], "--xid"),
    (["w0", "--xid", "-79"], "--xid"),
    (["w0", "--xid", "79", "--xid", "100000"], "--xid"),
    (["w0", "--dcgm-fail", "7"], "--dcgm-fail"),
    (["w0", "--xid", "79", "--disk", "2"], "--disk"),  # one bad option spoils the report
    (["login0", "--xid", "79"], "login0"),
    (["gone", "--xid", "79"], "gone"),
    (["nobody", "--xid", "79"], "nobody"),
    (["w0"], "at least one fault"),
]


def test_nonsense_faults_are_rejected(state: tuple[Path, list[Any]],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    state_dir, injected = state
    for argv, named in NONSENSE:
        capsys.readouterr()
        try:
            code = main(["--state-dir", str(state_dir), "node", "fault", *argv])
        except SystemExit as exc:  # argparse's own refusals (e.g. --dcgm-fail choices)
            code = int(exc.code or 0)
        err = capsys.readouterr().err
        assert code == 2, (argv, err)
        assert named in err, (argv, err)
        assert injected == [], argv
    # and sense still goes through
    assert main(["--state-dir", str(state_dir), "node", "fault", "w0", "--xid", "79",
                 "--ecc-dbe", "2", "--disk", "0.97", "--slow", "0.5", "--thermal", "95",
                 "--dcgm-fail", "2"]) == 0
    [(node_id, conditions)] = injected
    assert node_id == "w0" and len(conditions) == 6


def test_the_fault_rules_are_one_pure_validator() -> None:
    ok = FaultRequest(xids=(1, 79, 200), ecc_dbe=1, dcgm_level=4, thermal_c=0.0,
                      disk_used_fraction=1.0, slow_ratio=1.0)
    assert validate_fault(ok) is ok
    with pytest.raises(ValidationError) as exc:
        validate_fault(FaultRequest(slow_ratio=-2.0))
    assert exc.value.path == "slow_ratio"  # field names are the caller's: the default is the field
    with pytest.raises(ValidationError) as exc:
        validate_fault(FaultRequest(xids=(201,)), {"xids": "xidCodes"})
    assert exc.value.path == "xidCodes"
    with pytest.raises(ValidationError):
        validate_fault(FaultRequest(ecc_dbe=True))  # a bool is not a count
    with pytest.raises(NotFound):
        check_fault_target(None, "x")
    assert check_fault_target(_node("w"), "w").node_id == "w"
    for node in (_node("l", NodeRole.LOGIN), _node("r", state=NodeState.RETIRED)):
        with pytest.raises(ValidationError):
            check_fault_target(node, node.node_id)
