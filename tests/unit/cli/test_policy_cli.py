"""`mtc policy`: configure a candidate triage table, see its shadow diff on live traffic, and
the same causes from the recorded history offline (`mtc policy diff`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from services.api.http import create_app
from services.cli.main import main
from services.wiring.api import embedded_api
from services.wiring.embedded import embedded
from tests.candidates import CAUSE, packaged, stricter_xid13
from tests.serving import PARENT
from tests.unit.api.conftest import TOKEN, Api, one_pass_config

C = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1"


def _with_api(state: Path, fn: Callable[[Api], Any]) -> Any:
    app = embedded(state, config=one_pass_config())
    try:
        ctx, _ = embedded_api(app, env_token=TOKEN)
        return fn(Api(create_app(ctx).test_client(), app))
    finally:
        app.compute.kill_all()
        app.close()


def _xid13_on_a_worker(api: Api) -> str:
    """XID 13 on one worker (the candidate table differs), 79 on another (the candidate
    repair configuration's guard would hold its reboot)."""
    node, other = [n["nodeId"] for n in api.call("GET", f"{C}/nodes").json["nodes"]
                   if n["role"] == "worker"][:2]
    for target, code in ((node, 13), (other, 79)):
        assert api.call("POST", f"{C}/nodes/{target}:reportHealth",
                        {"xids": [code]}).status_code == 200
    api.app.pump()
    return node


def _write(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))  # JSON is YAML: the table file as an operator may write it
    return path


def test_policy_configure_show_and_offline_diff(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("MTC_API", "MTC_STATE_DIR", "MTC_PROJECT", "MTC_LOCATION"):
        monkeypatch.delenv(key, raising=False)
    state = tmp_path / "state"
    where = ["--state-dir", str(state), "--project", PARENT.split("/")[1],
             "--location", PARENT.split("/")[3]]
    _with_api(state, lambda api: api.cluster(workers=3))
    candidate = _write(tmp_path / "candidate.yaml", stricter_xid13())
    repair = _write(tmp_path / "repair.yaml", {"max_out_of_service_fraction": 0.0,
                                               "min_out_of_service_allowed": 0})
    assert main([*where, "policy", "configure", "c1", "--candidate", str(candidate),
                 "--repair", str(repair), "--stage", "shadow",
                 "--reason", "try the stricter row"]) == 0
    capsys.readouterr()
    node = _with_api(state, _xid13_on_a_worker)

    assert main([*where, "--json", "policy", "show", "c1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["diff"]["causes"] == [CAUSE] and shown["diff"]["rows"][0]["nodes"] == [node]
    assert shown["policy"]["stages"] == [{"stage": "shadow", "cause": "*", "partition": "*"}]
    assert main([*where, "policy", "show", "c1"]) == 0
    table = capsys.readouterr().out
    assert CAUSE in table and "reset_gpu" in table and "1 of 2 reports" in table
    assert "gpu_fell_off_bus" in table and "hold: reboot" in table

    # the same history, recorded, offline: the same cause; the packaged table itself: none
    assert main(["--json", "policy", "diff", str(state), "--candidate", str(candidate)]) == 0
    offline = json.loads(capsys.readouterr().out)
    assert offline["causes"] == [CAUSE] and offline["rows"][0]["nodes"] == [node]
    same = _write(tmp_path / "same.yaml", packaged())
    assert main(["policy", "diff", str(state), "--candidate", str(same)]) == 0
    assert "would treat differently: none" in capsys.readouterr().out

    bad = _write(tmp_path / "bad.yaml", {"version": 9})
    assert main([*where, "policy", "configure", "c1", "--candidate", str(bad),
                 "--reason", "x"]) == 2
    assert "candidate.version" in capsys.readouterr().err
