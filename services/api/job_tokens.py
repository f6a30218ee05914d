"""A job's own credential: short-lived, signed, good for its own job in its own project.

A running job may call the API (read its own state, cancel itself) without any secret of
the server: the compute gives each rank a token file (``$MTC_JOB_TOKEN_FILE``) that the
control plane rewrites before it expires, as Kubernetes projects a service account token.
The token is ``mtcjob_<payload>.<signature>``: the payload names the job's resource
(``projects/P/locations/L/customJobs/ID``) and an expiry, the signature is HMAC-SHA256 under a
key of this deployment's (``<state>/job-token.key``, 0600, which no job sees). Nothing is
stored per token, so one cannot be revoked before it expires (``TTL_S``); a job that ended
gets no new one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from services.api.auth import Principal

PREFIX = "mtcjob_"
KEY_FILE = "job-token.key"
TTL_S = 3600.0
ROLE = "job"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def load_key(state_dir: Path) -> bytes:
    """The deployment's signing key, made on first use (0600 from the first byte)."""
    path = state_dir / KEY_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_bytes()
        if len(key) < 32:
            raise ValueError(f"{path} is damaged (shorter than 32 bytes); remove it to make "
                             "a new key (jobs' tokens then renew)") from None
        return key
    key = secrets.token_bytes(32)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


class JobTokens:
    """Mints and verifies job tokens (a ``TokenSource``); ``now``: the clock, in seconds."""

    def __init__(self, key: bytes, now: Callable[[], float] = time.time,
                 ttl_s: float = TTL_S) -> None:
        self._key = key
        self._now = now
        self.ttl_s = ttl_s

    def _sign(self, payload: bytes) -> bytes:
        return hmac.new(self._key, payload, hashlib.sha256).digest()

    def mint(self, job_name: str) -> tuple[str, float]:
        """A token for the job ``projects/P/locations/L/customJobs/ID`` and its expiry."""
        expires = self._now() + self.ttl_s
        payload = json.dumps({"job": job_name, "exp": expires}, separators=(",", ":")).encode()
        return f"{PREFIX}{_b64(payload)}.{_b64(self._sign(payload))}", expires

    def authenticate(self, token: str) -> Principal | None:
        """The job's principal, bound to its project with the ``job`` role and restricted to
        its own resource; None for anything else (not ours, altered, expired)."""
        if not token.startswith(PREFIX) or token.count(".") != 1:
            return None
        body, sig = token[len(PREFIX):].split(".")
        try:
            payload, signature = _unb64(body), _unb64(sig)
        except ValueError:
            return None
        if not hmac.compare_digest(signature, self._sign(payload)):
            return None
        try:
            claims = json.loads(payload)
            job, expires = str(claims["job"]), float(claims["exp"])
        except (ValueError, KeyError, TypeError):
            return None
        parts = job.split("/")
        if expires <= self._now() or len(parts) != 6 or parts[0] != "projects":
            return None
        return Principal(f"job:{job}", ((parts[1], ROLE),), resource=job)
