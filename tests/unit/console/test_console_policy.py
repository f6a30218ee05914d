"""The console shows a candidate triage table's diff by cause: the data endpoint answers it
(with the API's auth), the page has its section and script, and the script's pure renderer
turns the endpoint's answer into the cells shown (run under node where it is installed)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.api.http import create_app
from services.console.app import STATIC, register
from services.wiring.api import embedded_api
from services.wiring.embedded import embedded
from tests.candidates import CAUSE, rollout
from tests.serving import PARENT
from tests.unit.api.conftest import AUTH, TOKEN, Api, one_pass_config

C = f"/v1beta1/{PARENT}/modelDevelopmentClusters/c1"
NAME = C.removeprefix("/v1beta1/")


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Api]:
    app = embedded(tmp_path / "state", config=one_pass_config())
    ctx, _ = embedded_api(app, env_token=TOKEN)
    flask_app = create_app(ctx)
    register(flask_app, ctx)
    yield Api(flask_app.test_client(), app)
    app.compute.kill_all()
    app.close()


def _shadowed(api: Api) -> dict[str, Any]:
    api.cluster(workers=3)
    guard = {"max_out_of_service_fraction": 0.0, "min_out_of_service_allowed": 0}
    assert api.call("POST", f"{C}/triagePolicy:configure",
                    {**rollout(), "repair": guard, "reason": "shadow it"}).status_code == 200
    first, second = [n["nodeId"] for n in api.call("GET", f"{C}/nodes").json["nodes"]
                     if n["role"] == "worker"][:2]
    for node, code in ((first, 13), (second, 79)):
        assert api.call("POST", f"{C}/nodes/{node}:reportHealth",
                        {"xids": [code]}).status_code == 200
    api.app.pump()
    got = api.client.get("/console/api/policy", query_string={"cluster": NAME}, headers=AUTH)
    assert got.status_code == 200, got.json
    return got.json  # type: ignore[no-any-return]


def test_the_console_serves_the_diff_by_cause(console: Api) -> None:
    view = _shadowed(console)
    assert view["diff"]["causes"] == [CAUSE]
    assert console.client.get("/console/api/policy",
                              query_string={"cluster": NAME}).status_code == 401
    page = console.client.get("/console").get_data(as_text=True)
    assert 'id="policy-diff"' in page and "console-policy.js" in page
    assert console.client.get("/console/static/console-policy.js").status_code == 200


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_rendered_panel_names_the_cause(console: Api, tmp_path: Path) -> None:
    view = _shadowed(console)
    script = (f"const {{policyPanel}} = require({json.dumps(str(STATIC / 'console-policy.js'))});"
              f"process.stdout.write(JSON.stringify(policyPanel({json.dumps(view)})));")
    done = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == 0, done.stderr
    panel = json.loads(done.stdout)
    assert panel["shown"] is True and panel["summary"].startswith(
        "would decide differently: 1 of 2")
    assert CAUSE in panel["summary"]
    [row] = panel["rows"]
    assert row[:4] == [CAUSE, "1", f"{CAUSE}: restart_job", f"{CAUSE}: reset_gpu"]
    [repair] = panel["repairRows"]
    assert repair[:4] == ["gpu_fell_off_bus", "1", "repair: reboot", "hold: reboot"]
    none = json.loads(subprocess.run(
        ["node", "-e", script.replace(json.dumps(view), json.dumps({"policy": None}))],
        capture_output=True, text=True, timeout=30, check=True).stdout)
    assert none["shown"] is False and none["rows"] == [] and none["repairRows"] == []
