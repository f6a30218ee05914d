"""The preflight mode through the API: a cluster's ``mtc-preflight`` label reaches the
cluster the scheduler reads; a bad one is a 400 naming the field, nothing made."""

from __future__ import annotations

from tests.serving import PARENT, cluster_body
from tests.unit.api.conftest import Api

CLUSTERS = f"/v1beta1/{PARENT}/modelDevelopmentClusters"


def test_the_preflight_mode_reaches_the_cluster(api: Api) -> None:
    body = {**cluster_body(), "labels": {"mtc-preflight": "thorough", "team": "x"}}
    resp = api.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=c1", body)
    assert resp.status_code == 200, resp.json
    with api.app.transaction() as uow:
        cluster = uow.clusters.get("c1")
    assert cluster is not None and dict(cluster.spec.labels) == {"mtc-preflight": "thorough"}


def test_a_bad_preflight_mode_is_refused(api: Api) -> None:
    body = {**cluster_body(), "labels": {"mtc-preflight": "always"}}
    resp = api.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=c2", body)
    assert resp.status_code == 400 and "labels.mtc-preflight" in str(resp.json)
    with api.app.transaction() as uow:
        assert uow.clusters.get("c2") is None
