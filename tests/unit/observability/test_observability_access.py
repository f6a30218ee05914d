"""``/metrics`` and ``/alerts.json`` of `mtc serve` are not the tenants': jobs run on the
server's host and share its network, so on loopback too both need a token, and a token sees
only the projects it is bound to (a job's token, or one read from a job, sees its project's
clusters and alerts, never another's). Built as `mtc serve` builds what it answers
(``services.cli.serve.application``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import flask
import pytest
import yaml
from werkzeug.test import Client, TestResponse

from services.api.auth import Authenticator, Principal
from services.api.security import TokenGuard
from services.api.tokens import LocalTokens
from services.cli.serve import application
from services.console.history import History
from services.observability import alerts
from services.observability.http import Observability, add_routes
from services.wiring.api import embedded_api
from services.wiring.control_loop import ControlLoop
from services.wiring.embedded import EmbeddedApp, embedded
from shared.adapters.docstore import API_RESOURCES
from tests.serving import ROOT, cluster_body
from tests.unit.api.conftest import AUTH, TOKEN, one_pass_config

PATHS = ("/metrics", "/alerts.json")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Client, EmbeddedApp]]:
    """What `mtc serve` (on its default loopback bind) answers, and its control plane."""
    app = embedded(tmp_path / "state", config=one_pass_config())
    ctx, _ = embedded_api(app, env_token=TOKEN)
    wsgi = application(app, ctx, ControlLoop(app), History(app.store), None)
    yield Client(wsgi), app
    wsgi.close()
    app.compute.kill_all()
    app.close()


def _cluster(client: Client, project: str, cluster_id: str) -> None:
    resp = client.post(f"/v1beta1/projects/{project}/locations/l/modelDevelopmentClusters"
                       f"?modelDevelopmentClusterId={cluster_id}", json=cluster_body(workers=1),
                       headers=AUTH)
    assert resp.status_code == 200, resp.json


def _alert_on(app: EmbeddedApp, project: str, cluster_id: str) -> None:
    """A firing alert on a project's cluster, stored as the controller stores one."""
    record = app.store.read(API_RESOURCES, {"kind": "cluster", "project": project,
                                            "id": cluster_id})[0]
    domain = str(record.get("domain") or record["id"])
    app.store.write(alerts.ALERTS, f"node_down:{domain}", {
        "kind": "node_down", "subject": domain, "summary": f"a node of {domain} is down",
        "severity": "WARNING", "cluster_id": domain, "node_id": None, "job_id": None,
        "details": {}, "state": alerts.FIRING, "first_at": 1.0, "last_sent_at": 1.0,
        "sent": 1, "resolved_at": None, "expire_at": None})


def _json(resp: TestResponse) -> Any:
    body = resp.json
    assert body is not None, resp.text
    return body


def _token(app: EmbeddedApp, name: str, role: str, project: str) -> dict[str, str]:
    tokens = LocalTokens(app.state_dir / "api-tokens.json")
    return {"Authorization": "Bearer " + tokens.create(f"token:{name}", role, project=project)}


def test_defect_5_metrics_and_alerts_need_a_token_on_loopback(
        served: tuple[Client, EmbeddedApp]) -> None:
    client, _ = served
    for path in PATHS:
        anonymous = client.get(path)
        assert anonymous.status_code == 401, (path, anonymous.text)
        assert _json(anonymous)["error"]["status"] == "UNAUTHENTICATED"
        assert "cluster" not in anonymous.text and "alerts" not in _json(anonymous)
        wrong = client.get(path, headers={"Authorization": "Bearer not-a-token"})
        assert wrong.status_code == 401, path
        assert client.get(f"{path}?project=p", headers={}).status_code == 401
        assert client.get(path, headers=AUTH).status_code == 200, path


def test_defect_5_a_token_sees_only_the_projects_it_is_bound_to(
        served: tuple[Client, EmbeddedApp]) -> None:
    client, app = served
    _cluster(client, "pa", "ca")
    _cluster(client, "pb", "cb")
    app.pump()
    _alert_on(app, "pa", "ca")
    _alert_on(app, "pb", "cb")
    job_of_b = _token(app, "bob", "editor", "pb")  # what a job of project pb could hold

    text = client.get("/metrics", headers=job_of_b).text  # no ?project=: its own projects
    assert 'cluster="cb"' in text
    assert 'cluster="ca' not in text
    assert "mtc_dead_letters" not in text and "mtc_bus_lag_seconds" not in text  # fleet-wide
    listed = _json(client.get("/alerts.json", headers=job_of_b))["alerts"]
    assert [a["cluster_id"] for a in listed if a["kind"] == "node_down"] == ["cb"]

    for path in PATHS:  # ?project= narrows, and only to a project the token is bound to
        assert client.get(f"{path}?project=pb", headers=job_of_b).status_code == 200
        denied = client.get(f"{path}?project=pa", headers=job_of_b)
        assert denied.status_code == 403, path
        assert "pa" in _json(denied)["error"]["message"]
        agent = client.get(path, headers=_token(app, "agent", "node-agent", "pb"))
        assert agent.status_code == 403, path  # a node agent's token views nothing

    fleet = client.get("/metrics", headers=AUTH).text  # the admin token sees every project
    assert 'cluster="ca"' in fleet and 'cluster="cb-' in fleet and "mtc_dead_letters" in fleet
    listed = _json(client.get("/alerts.json", headers=AUTH))["alerts"]
    assert sorted(a["cluster_id"][:2] for a in listed if a["kind"] == "node_down") == [
        "ca", "cb"]
    narrowed = client.get("/metrics?project=pa", headers=AUTH).text
    assert 'cluster="ca"' in narrowed and 'cluster="cb' not in narrowed


class _Tokens:
    """A token source with fixed principals (a Google identity bound to several projects
    by the policy is the real case)."""

    def __init__(self, principals: dict[str, Principal]) -> None:
        self.principals = principals

    def authenticate(self, token: str) -> Principal | None:
        return self.principals.get(token)


def test_a_principal_bound_to_several_projects_sees_each_and_no_other(
        served: tuple[Client, EmbeddedApp]) -> None:
    client, app = served
    for project in ("pa", "pb", "pc"):
        _cluster(client, project, "c")  # one id in three projects
    _cluster(client, "pb", "solo")
    app.pump()
    two = Principal("user:ann@example.com", (("pa", "viewer"), ("pb", "editor")))
    guard = TokenGuard(Authenticator([_Tokens({"ann": two})]))
    flask_app = flask.Flask(__name__)
    add_routes(flask_app, Observability(app.store, app.deps.clock, guard))
    ann: Any = {"Authorization": "Bearer ann"}
    text = flask_app.test_client().get("/metrics", headers=ann).get_data(as_text=True)
    # a shared id is told apart by project and location; one no other project has is as is
    assert 'cluster="pa/l/c"' in text and 'cluster="pb/l/c"' in text
    assert 'cluster="solo"' in text
    assert "pc/" not in text and 'cluster="c-' not in text
    one = flask_app.test_client().get("/metrics?project=pb", headers=ann).get_data(as_text=True)
    assert 'cluster="c"' in one and "pa/" not in one


def test_the_shipped_scrape_config_sends_a_token_and_loads_the_rules() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    (scrape,) = config["scrape_configs"]
    assert scrape["metrics_path"] == "/metrics"
    assert scrape["authorization"]["type"] == "Bearer"
    assert scrape["authorization"]["credentials_file"]
    for rules in config["rule_files"]:
        assert (ROOT / "deploy" / "prometheus" / rules).is_file()
