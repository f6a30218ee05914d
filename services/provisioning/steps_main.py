"""Cloud Function entry point ``steps``: the provisioning workflow's step endpoints and the tick.

    functions-framework --source services/provisioning/steps_main.py --target steps
"""

from __future__ import annotations

import flask
import functions_framework

from services.provisioning.steps_api import dispatch
from services.wiring.functions import runtime


@functions_framework.http
def steps(request: flask.Request) -> flask.Response:
    return dispatch(request, runtime())
