"""The recovery pins through the API: a cluster's ``mtc-recovery-mode`` label
reaches the cluster the policy reads; a bad one is a 400 naming the field, nothing made."""

from __future__ import annotations

from tests.serving import PARENT, cluster_body
from tests.unit.api.conftest import Api

CLUSTERS = f"/v1beta1/{PARENT}/modelDevelopmentClusters"


def test_a_cluster_pin_reaches_the_cluster(api: Api) -> None:
    body = {**cluster_body(), "labels": {"mtc-recovery-mode": "requeue", "team": "x"}}
    resp = api.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=c1", body)
    assert resp.status_code == 200, resp.json
    with api.app.transaction() as uow:
        cluster = uow.clusters.get("c1")
    assert cluster is not None and dict(cluster.spec.labels) == {"mtc-recovery-mode": "requeue"}


def test_a_bad_cluster_pin_is_refused(api: Api) -> None:
    body = {**cluster_body(), "labels": {"mtc-recovery-mode": "fastest"}}
    resp = api.call("POST", f"{CLUSTERS}?modelDevelopmentClusterId=c2", body)
    assert resp.status_code == 400 and "labels.mtc-recovery-mode" in str(resp.json)
    with api.app.transaction() as uow:
        assert uow.clusters.get("c2") is None


def test_a_bad_job_pin_is_refused(api: Api) -> None:
    api.cluster("c1")
    from tests.cli_support import job_body
    body = {**job_body(10, "c1"), "labels": {"mtc-min-replicas": "0"}}  # Vertex's pool layout
    resp = api.call("POST", f"/v1beta1/{PARENT}/customJobs", body)
    assert resp.status_code == 400 and "labels.mtc-min-replicas" in str(resp.json)
