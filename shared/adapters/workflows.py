"""Starting the provisioning workflow on Cloud Workflows (the ``WorkflowRunner`` port).

When the workflow drives provisioning (``ControlPlaneConfig.provisioning == "workflow"``),
the provisioning service starts one execution of ``mtc-provision-cluster`` per cluster
generation through the Workflows executions API (``google-cloud-workflows``); the execution
calls the step endpoints, polls and rolls back. The client is made on first use, or injected
(tests pass a fake at the boundary and read the real ``CreateExecutionRequest``).

Delivery is at least once, so an execution may be started twice for one generation; the
workflow's steps are idempotent and its ``validate`` step lets only a generation still being
provisioned proceed, so a second execution changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shared.domain.errors import TransientError

WORKFLOW = "mtc-provision-cluster"  # deploy/cloudbuild.py's name for provision_cluster


class CloudWorkflows:
    """``WorkflowRunner`` over the Workflows executions API."""

    def __init__(self, project: str, location: str, workflow: str = WORKFLOW, *,
                 client: Any = None, timeout_s: float = 30.0) -> None:
        self.parent = f"projects/{project}/locations/{location}/workflows/{workflow}"
        self._client = client
        self._timeout = timeout_s

    def _executions(self) -> Any:
        if self._client is None:
            from google.cloud.workflows import executions_v1

            self._client = executions_v1.ExecutionsClient()
        return self._client

    def start(self, argument: Mapping[str, Any]) -> str:
        """Start an execution with ``argument`` (the workflow's ``args``); its name."""
        from google.api_core import exceptions as gexc
        from google.cloud.workflows import executions_v1

        request = executions_v1.CreateExecutionRequest(
            parent=self.parent,
            execution=executions_v1.Execution(argument=json.dumps(dict(argument),
                                                                  sort_keys=True)))
        try:
            execution = self._executions().create_execution(request=request,
                                                            timeout=self._timeout)
        except (gexc.ServiceUnavailable, gexc.InternalServerError, gexc.TooManyRequests,
                gexc.DeadlineExceeded) as exc:
            raise TransientError(f"starting {self.parent}: {exc}") from exc
        return str(execution.name)
