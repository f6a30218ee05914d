"""When the workflow drives provisioning, the provisioning service starts one execution of
mtc-provision-cluster per cluster generation through the Workflows executions client (a fake
at the boundary: it keeps the real CreateExecutionRequest the library would send)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud.workflows import executions_v1

from services.job_submission import commands as job_commands
from shared.adapters.workflows import CloudWorkflows
from shared.domain.errors import TransientError
from shared.domain.model import ClusterState
from tests.harness import CLUSTER, Plane


class FakeExecutions:
    def __init__(self, fail: Exception | None = None) -> None:
        self.requests: list[executions_v1.CreateExecutionRequest] = []
        self.fail = fail

    def create_execution(self, *, request: executions_v1.CreateExecutionRequest,
                         timeout: float) -> executions_v1.Execution:
        assert isinstance(request, executions_v1.CreateExecutionRequest)
        if self.fail is not None:
            raise self.fail
        self.requests.append(request)
        return executions_v1.Execution(name=f"{request.parent}/executions/e{len(self.requests)}")


def workflow_plane(client: Any) -> Plane:
    plane = Plane()
    runner = CloudWorkflows("proj", "europe-west1", client=client)
    plane.deps = replace(plane.deps, workflows=runner,
                         config=replace(plane.deps.config, provisioning="workflow"))
    return plane


def test_a_created_cluster_starts_one_execution_with_its_generation() -> None:
    client = FakeExecutions()
    plane = workflow_plane(client)
    plane.api(job_commands.create_cluster, CLUSTER)
    plane.deliver()
    [request] = client.requests
    assert request.parent == "projects/proj/locations/europe-west1/workflows/mtc-provision-cluster"
    assert json.loads(request.execution.argument) == {"cluster_id": "c1", "generation": 1}
    assert plane.compute.provisioned == []  # the workflow's steps make the nodes, not events
    with plane.uow() as uow:
        cluster = uow.clusters.get("c1")
    assert cluster is not None and cluster.state is ClusterState.PROVISIONING


def test_events_mode_starts_no_workflow() -> None:
    client = FakeExecutions()
    plane = workflow_plane(client)
    plane.deps = replace(plane.deps, config=replace(plane.deps.config, provisioning="events"))
    plane.api(job_commands.create_cluster, CLUSTER)
    plane.deliver()
    assert client.requests == [] and plane.compute.provisioned


def test_an_unavailable_workflows_api_is_transient_and_redelivered() -> None:
    runner = CloudWorkflows("p", "l", client=FakeExecutions(gexc.ServiceUnavailable("down")))
    with pytest.raises(TransientError):
        runner.start({"cluster_id": "c1", "generation": 1})
    with pytest.raises(gexc.PermissionDenied):
        CloudWorkflows("p", "l", client=FakeExecutions(gexc.PermissionDenied("no"))).start({})
