"""The embedded wiring's issuer of jobs' own API credentials (``services.api.job_tokens``).

A job the customJobs API created gets a token for its own resource name, minted with the
deployment's key; the API's URL comes from ``<state>/api-endpoint``, which ``mtc serve``
writes once it listens (a job started where no server listens gets a token and no URL).
"""

from __future__ import annotations

from pathlib import Path

from services.api.context import RESOURCES
from services.api.job_tokens import JobTokens, load_key
from shared.adapters.compute.local.credentials import Credential, Issue
from shared.ports import DocStore

ENDPOINT_FILE = "api-endpoint"


def endpoint(state_dir: Path) -> str | None:
    try:
        return (state_dir / ENDPOINT_FILE).read_text().strip() or None
    except OSError:
        return None


def issuer(state_dir: Path, store: DocStore) -> Issue:
    tokens = JobTokens(load_key(state_dir))

    def issue(job_id: str) -> Credential | None:
        # the API's record of the job (custom_jobs.domain_job_id, reversed); a plain read:
        # the caller may be inside the store's transaction (a job's start)
        domain = job_id[3:] if job_id.startswith("cj-") and job_id[3:].isdigit() else job_id
        found = store.read(RESOURCES, {"kind": "customJob", "domain": domain})
        if not found:
            return None  # not a job the API created (a tuning trial, a CLI job)
        record = found[0]
        name = f"{record['parent']}/customJobs/{record['id']}"
        token, expires = tokens.mint(name)
        return Credential(token, expires, tokens.ttl_s, name, endpoint(state_dir))

    return issue
