"""``/metrics?project=pb`` and ``/alerts.json?project=pb``
show project pb's clusters and jobs only, never project pa's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from services.api.http import create_app
from services.api.tokens import LocalTokens
from services.observability.http import Observability, add_routes
from services.wiring.api import embedded_api
from services.wiring.embedded import EmbeddedApp, embedded
from tests.serving import cluster_body
from tests.unit.api.conftest import AUTH, TOKEN, one_pass_config


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[FlaskClient, EmbeddedApp]]:
    app = embedded(tmp_path / "state", config=one_pass_config())
    ctx, _ = embedded_api(app, env_token=TOKEN)
    flask_app = create_app(ctx)
    add_routes(flask_app, Observability(app.store, app.deps.clock, ctx.guard,
                                        event_log=app.deps.event_log))
    yield flask_app.test_client(), app
    app.compute.kill_all()
    app.close()


def _cluster(client: FlaskClient, project: str, cluster_id: str) -> None:
    resp = client.post(f"/v1beta1/projects/{project}/locations/l/modelDevelopmentClusters"
                       f"?modelDevelopmentClusterId={cluster_id}", json=cluster_body(workers=1),
                       headers=AUTH)
    assert resp.status_code == 200, resp.json


def test_defect_3_metrics_and_alerts_are_limited_to_the_callers_project(
        served: tuple[FlaskClient, EmbeddedApp]) -> None:
    client, app = served
    _cluster(client, "pa", "ca")
    _cluster(client, "pb", "cb")
    app.pump()
    bob = {"Authorization": "Bearer " + LocalTokens(app.state_dir / "api-tokens.json").create(
        "token:bob", "editor", project="pb")}
    mine = client.get("/metrics?project=pb", headers=bob)
    assert mine.status_code == 200
    text = mine.get_data(as_text=True)
    assert 'cluster="cb"' in text
    assert 'cluster="ca"' not in text
    assert "mtc_dead_letters" not in text and "mtc_repairs_total" not in text  # fleet-wide
    theirs = client.get("/metrics?project=pa", headers=bob)
    assert theirs.status_code == 403
    own = client.get("/metrics", headers=bob)  # no project: the projects bob is bound to
    assert own.status_code == 200
    assert 'cluster="cb"' in own.get_data(as_text=True)
    assert 'cluster="ca"' not in own.get_data(as_text=True)
    admin = client.get("/metrics", headers=AUTH).get_data(as_text=True)
    # the fleet view names clusters by their domain ids: pa's (the first project's) are
    # its own, pb's are derived from (project, id) (services.api.ids)
    assert 'cluster="ca"' in admin and 'cluster="cb-' in admin
    alerts = client.get("/alerts.json?project=pb", headers=bob)
    assert alerts.status_code == 200
    assert all(a.get("cluster_id") in (None, "cb") for a in alerts.json["alerts"])
