"""Cloud Functions loads ``main.py`` at the root of the uploaded source (``--source=.``) and
calls the function named by ``--entry-point``: every entry point is defined once, in
``services/functions.py``, and only re-exported here. functions-framework knows each one's
signature from the decorator that registered it under that name.

    functions-framework --source main.py --target api
"""

from services.functions import (
    ENTRY_POINTS,
    api,
    checkpoint_resume,
    health_triage,
    job_submission,
    observability,
    pipelines,
    provisioning,
    repair,
    steps,
    tuning,
)

__all__ = ["ENTRY_POINTS", "api", "checkpoint_resume", "health_triage", "job_submission",
           "observability", "pipelines", "provisioning", "repair", "steps", "tuning"]
