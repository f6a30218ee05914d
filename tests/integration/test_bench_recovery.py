"""`mtc bench recovery` end to end on the embedded default: a two-fault trace, real ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from services.cli.main import main

pytestmark = pytest.mark.slow  # real worker subprocesses

TRACE = {
    "version": 1, "name": "e2e", "cluster": {"nodes": 2, "spares": 1, "repair": 2},
    "job": {"replicas": 2, "min_replicas": 1, "step_time": 0.05, "checkpoint_every": 5},
    "faults": [{"kind": "app_crash", "after_step": 10, "target": {"rank": 1}},
               {"kind": "xid_79", "at": 1, "target": {"rank": 0}}],
}
MODES = {"requeue", "in_place", "hot_swap", "scale_down"}


def test_two_faults_are_played_and_scored(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    trace = tmp_path / "e2e.yaml"
    trace.write_text(yaml.safe_dump(TRACE))
    code = main(["--state-dir", str(tmp_path / "state"), "bench", "recovery", "--target",
                 "embedded", "--trace", str(trace), "--json", "--timeout", "60",
                 "--out", str(tmp_path / "out")])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    [run] = doc["runs"]
    assert run["target"] == "embedded" and run["label"] == "chosen"
    crash, xid = run["incidents"]
    assert (crash["kind"], xid["kind"]) == ("app_crash", "xid_79")
    assert crash["step_at_fault"] >= 10  # played once the job had reached step 10
    for inc in (crash, xid):
        assert inc["detected_s"] is not None and 0 <= inc["detected_s"] < inc["recovered_s"]
        assert inc["stopped"] and inc["mode"] in MODES
        assert inc["steps_lost"] is not None and inc["steps_lost"] >= 0
    assert xid["detected_by"] == "diagnosis"  # the node's XID, diagnosed
    assert 0 < run["goodput"]["runtime_goodput"] < 1 and run["goodput"]["restarts"] >= 2
    assert (tmp_path / "out" / "recovery-bench.png").stat().st_size > 0
    saved = json.loads((tmp_path / "out" / "recovery-bench.json").read_text())
    assert saved["runs"] == doc["runs"]


def test_both_targets_choose_the_same_modes_on_the_default_trace(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Live, then the twin with the live run's fitted costs and policy inputs (~40 s). Where
    the live policy weighed modes (it recorded its expectation) the twin chooses the same;
    a live crash before the control plane heard of any tier entry is the plain requeue
    with nothing to weigh (the tier heartbeat's race), which the twin does not replay."""
    code = main(["--state-dir", str(tmp_path / "state"), "bench", "recovery", "--target",
                 "both", "--json", "--timeout", "60"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    live, twin = doc["runs"]
    assert (live["target"], twin["target"]) == ("embedded", "twin")
    assert twin["costs"]["sigterm_save"] == "durable"  # measured live, fed to the twin
    rows = doc["twin_vs_live"]
    assert [x["kind"] for x in rows] == [i["kind"] for i in live["incidents"]]
    weighed = {i["index"] for i in live["incidents"] if i["expected_lost_s"] is not None}
    assert weighed  # the xid_13 at least: in place, weighed against a requeue
    (tmp_path / "both.json").write_text(json.dumps(doc, indent=1))
    for x in rows:
        if x["index"] in weighed:
            assert x["same_mode"], x
        # a live incident not recovered within the bench's window (a loaded machine) has no
        # ratio; one that has must be a real one
        assert x["twin_over_live"] is None or x["twin_over_live"] > 0, x
    assert any(x["twin_over_live"] is not None for x in rows), rows
