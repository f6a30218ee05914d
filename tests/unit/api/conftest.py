"""An embedded control plane behind the real Flask app, driven with Flask's test client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from services.api.http import create_app
from services.wiring.api import embedded_api
from services.wiring.embedded import EmbeddedApp, embedded
from shared.config import ControlPlaneConfig
from tests.serving import PARENT, cluster_body

TOKEN = "unit-admin"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Api:
    def __init__(self, client: FlaskClient, app: EmbeddedApp) -> None:
        self.client = client
        self.app = app

    def call(self, method: str, path: str, body: Any = None, *, headers: Any = None,
             **kw: Any) -> Any:
        return self.client.open(path, method=method, json=body,
                                headers=AUTH if headers is None else headers, **kw)

    def cluster(self, cluster_id: str = "c1", **kw: Any) -> dict[str, Any]:
        resp = self.call("POST", f"/v1beta1/{PARENT}/modelDevelopmentClusters"
                         f"?modelDevelopmentClusterId={cluster_id}", cluster_body(**kw))
        assert resp.status_code == 200, resp.json
        return self.done(resp.json)

    def done(self, op: dict[str, Any]) -> dict[str, Any]:
        """The Operation ``op`` once it is done (waited on with ``:wait``)."""
        for _ in range(200):
            if op["done"]:
                return op
            op = self.call("POST", f"/v1beta1/{op['name']}:wait", {"timeout": "5s"}).json
        raise AssertionError(op)

    def until(self, predicate: Callable[[], Any], timeout: float = 30.0,
              about: str = f"/v1/{PARENT}/customJobs") -> Any:
        """``predicate()``'s first truthy value, the bus pumped between tries; past
        ``timeout`` the test fails with the GET of ``about`` (a path: the jobs) as its
        message."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.app.pump(budget_s=0.3)
            value = predicate()
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError("timed out: " + str(self.call("GET", about).json))


def one_pass_config() -> ControlPlaneConfig:
    """The embedded default, but a node serves after one healthy report, not two: its agent
    reports every second, so hysteresis made every cluster a test creates take a second to be
    READY, most of these tests' time. Hysteresis itself is tested with the repair policy and
    the handlers; nothing here depends on it."""
    config = ControlPlaneConfig()
    return replace(config, repair=replace(config.repair, return_after_passes=1))


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    app = embedded(tmp_path / "state", config=one_pass_config())
    ctx, _ = embedded_api(app, env_token=TOKEN)
    yield Api(create_app(ctx).test_client(), app)
    app.compute.kill_all()
    app.close()
