"""Cloud Functions entry points for deployment from the repository root (``--source=.``).

Cloud Functions loads ``main.py`` at the root of the uploaded source and calls the function
named by ``--entry-point``. functions-framework decides the signature from the decorator
registered under that name, so each service gets its own decorated entry point here (the
services' own ``handle`` all share one name). Each delegates to the service's ``main.py``,
which stays the entry point for ``functions-framework --source services/<svc>/main.py``.
"""

from __future__ import annotations

import flask
import functions_framework
from cloudevents.http import CloudEvent
from flask.typing import ResponseReturnValue

from services.checkpoint_resume import main as _checkpoint_resume
from services.health_triage import main as _health_triage
from services.job_submission import main as _job_submission
from services.observability import main as _observability
from services.pipelines import main as _pipelines
from services.provisioning import main as _provisioning
from services.provisioning import steps_main as _steps
from services.repair import main as _repair
from services.tuning import main as _tuning


@functions_framework.cloud_event
def provisioning(cloud_event: CloudEvent) -> None:
    _provisioning.handle(cloud_event)


@functions_framework.cloud_event
def health_triage(cloud_event: CloudEvent) -> None:
    _health_triage.handle(cloud_event)


@functions_framework.cloud_event
def repair(cloud_event: CloudEvent) -> None:
    _repair.handle(cloud_event)


@functions_framework.cloud_event
def checkpoint_resume(cloud_event: CloudEvent) -> None:
    _checkpoint_resume.handle(cloud_event)


@functions_framework.cloud_event
def job_submission(cloud_event: CloudEvent) -> None:
    _job_submission.handle(cloud_event)


@functions_framework.cloud_event
def observability(cloud_event: CloudEvent) -> None:
    _observability.handle(cloud_event)


@functions_framework.cloud_event
def tuning(cloud_event: CloudEvent) -> None:
    _tuning.handle(cloud_event)


@functions_framework.cloud_event
def pipelines(cloud_event: CloudEvent) -> None:
    _pipelines.handle(cloud_event)


@functions_framework.http
def api(request: flask.Request) -> ResponseReturnValue:
    return _job_submission.api(request)


@functions_framework.http
def steps(request: flask.Request) -> ResponseReturnValue:
    return _steps.steps(request)


# entry point -> (deployed function name suffix, signature): what cloudbuild.yaml deploys
ENTRY_POINTS: dict[str, str] = {
    "provisioning": "cloudevent",
    "health_triage": "cloudevent",
    "repair": "cloudevent",
    "checkpoint_resume": "cloudevent",
    "job_submission": "cloudevent",
    "observability": "cloudevent",
    "tuning": "cloudevent",
    "pipelines": "cloudevent",
    "api": "http",
    "steps": "http",
}
