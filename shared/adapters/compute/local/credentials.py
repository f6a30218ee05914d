"""A job's own API credential on the node: a token file kept fresh while the job runs.

Each rank of a job the API knows gets ``MTC_JOB_TOKEN_FILE`` (a file holding a token good
for its own job only, for an hour: ``services.api.job_tokens``), ``MTC_JOB_NAME`` (the job's
resource name) and, where the server told where it listens, ``MTC_API`` (its URL). The
file lives in ``<root>/<job>/token``; a sandboxed rank sees that directory, read-only, and
no other job's. ``refresh`` rewrites a
token past half its life for every job with a live attempt, and removes the files of jobs
that have none once their token has expired (the directory is bounded by the live jobs).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mtc_program.protocol import JOB_NAME, JOB_TOKEN_FILE
from shared.adapters.compute.protocol import safe_name

TOKEN_FILE_ENV = JOB_TOKEN_FILE
NAME_ENV = JOB_NAME
API_ENV = "MTC_API"


@dataclass(frozen=True)
class Credential:
    token: str
    expires_at: float  # seconds since the epoch
    lifetime_s: float
    job_name: str  # the job's resource name: projects/P/locations/L/customJobs/ID
    endpoint: str | None = None  # the API's URL, where it is known


# a job's domain id -> its credential, or None: the job has none (not created by the API)
Issue = Callable[[str], Credential | None]


class JobCredentials:
    def __init__(self, root: Path, issue: Issue | None, now: Callable[[], float]) -> None:
        self.root = root
        self._issue = issue
        self._now = now

    def directory(self, job_id: str) -> Path:
        return self.root / safe_name(job_id)

    def env(self, job_id: str) -> dict[str, str]:
        """The rank's variables (a fresh token written first); nothing for a job with none."""
        credential = self._write(job_id)
        if credential is None:
            return {}
        return {TOKEN_FILE_ENV: str(self.directory(job_id) / "token"),
                NAME_ENV: credential.job_name,
                **({API_ENV: credential.endpoint} if credential.endpoint else {})}

    def read_only(self, job_id: str) -> list[str]:
        """What a sandboxed rank of ``job_id`` is given to read: its credential's directory."""
        where = self.directory(job_id)
        return [str(where)] if where.is_dir() else []

    def _write(self, job_id: str) -> Credential | None:
        if self._issue is None:
            return None
        credential = self._issue(job_id)
        if credential is None:
            return None
        where = self.directory(job_id)
        where.mkdir(mode=0o755, parents=True, exist_ok=True)
        for name, text in (("token", credential.token),
                           ("expires", f"{credential.expires_at} {credential.lifetime_s}")):
            tmp = where / f".{name}.tmp"
            tmp.write_text(text + "\n")
            os.chmod(tmp, 0o644)  # the job's uid reads it; only its namespace sees the directory
            os.replace(tmp, where / name)  # a rank reading it sees the old token or the new
        return credential

    def refresh(self, db: sqlite3.Connection) -> None:
        """Renew the tokens of jobs with a live attempt; drop expired ones of the others."""
        if self._issue is None or not self.root.is_dir():
            return
        live = {safe_name(r["job_id"]): r["job_id"] for r in db.execute(
            "SELECT DISTINCT job_id FROM attempts WHERE finalized = 0")}
        now = self._now()
        for where in self.root.iterdir():
            try:
                expires, lifetime = map(float, (where / "expires").read_text().split())
            except (OSError, ValueError):
                expires, lifetime = 0.0, 0.0
            if where.name in live:
                if expires - now < lifetime / 2:
                    self._write(live[where.name])
            elif expires <= now:
                with contextlib.suppress(OSError):
                    shutil.rmtree(where)
