"""Token sources: local API tokens (the embedded default) and Google-signed ID tokens.

Local tokens live in a 0600 JSON file that holds only their sha256, so a copy of the file
(or a backup) grants nothing. Google ID tokens are verified against Google's published certs
and bound to roles by the ``PolicyStore``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from services.api.auth import PolicyStore, Principal, permissions_of
from services.api.errors import ApiError
from shared.domain.errors import StateError

log = logging.getLogger(__name__)

TOKEN_PREFIX = "mtc_"
ADMIN_PRINCIPAL = "token:admin"  # the token ensure_admin mints
ENV_PRINCIPAL = "token:env-admin"  # MTC_API_TOKEN's
_FORMAT_VERSION = 1


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _tighten(path: Path) -> None:
    """A secret file others can read is fixed, loudly, rather than trusted as is."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("%s was readable by group/others (mode %o); setting it to 0600", path, mode)
        os.chmod(path, 0o600)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` atomically (temp file + rename) with mode 0600 from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask can only narrow it, but be explicit
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _new_record(principal: str, role: str, project: str) -> tuple[str, dict[str, Any]]:
    """A fresh token and the record that stores its hash; the role is checked first."""
    permissions_of(role)  # ValueError on an unknown role, before anything is written
    if not principal or not project:
        raise ValueError("principal and project must be non-empty")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, {"id": "tok-" + secrets.token_hex(6), "sha256": _sha256(token),
                   "principal": principal, "bindings": [[project, role]],
                   "createdAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}


def _parse(text: str, path: Path) -> list[dict[str, Any]]:
    """The token records of ``text``, or a StateError naming ``path`` and the way out."""
    way_out = ("restore it from a backup, or move it aside and mint tokens again with "
               "`mtc token create` (every token in it stops working)")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise StateError(f"{path} is damaged (not JSON: {exc}); {way_out}") from None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list) or not all(
            isinstance(r, dict) and isinstance(r.get("sha256"), str)
            and isinstance(r.get("principal"), str) for r in tokens):
        raise StateError(f"{path} is damaged (expected {{\"tokens\": [records with sha256 "
                         f"and principal]}}); {way_out}")
    return list(tokens)


class LocalTokens:
    """API tokens in ``path`` (e.g. ``<state_dir>/api-tokens.json``): records of
    ``{id, sha256, principal, bindings, createdAt}``, never the tokens themselves.

    The file is re-read when it changes, so tokens minted or revoked by another process
    (the CLI) take effect in a running server; writers serialize on a lock file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._records: list[dict[str, Any]] = []
        self._stamp: tuple[int, int, int] | None = None
        self._env_hash: str | None = None

    # -- the file
    def _load(self) -> list[dict[str, Any]]:
        """The records, re-read only when the file's (inode, mtime, size) changed."""
        with self._lock:
            try:
                st = self.path.stat()
            except FileNotFoundError:
                self._records, self._stamp = [], None
                return self._records
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                _tighten(self.path)
                try:
                    self._records = _parse(self.path.read_text(encoding="utf-8"), self.path)
                except StateError:
                    if self._stamp is None:
                        raise  # at start: refuse, naming the file
                    # damaged under a running server: the last good records stay in force
                    log.error("%s changed and is damaged; the tokens read before stay in "
                              "force until it is repaired", self.path)
                self._stamp = stamp
            return self._records

    @contextlib.contextmanager
    def _editing(self) -> Iterator[list[dict[str, Any]]]:
        """Read-modify-write under a cross-process lock, so two writers never lose an edit."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        with self._lock:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._stamp = None  # re-read: another process may have written since
                records = [dict(r) for r in self._load()]
                yield records
                _write_private(self.path, json.dumps(
                    {"version": _FORMAT_VERSION, "tokens": records}, indent=2, sort_keys=True) + "\n")
                self._stamp = None
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)

    # -- management
    def create(self, principal: str, role: str, project: str = "*") -> str:
        """Mint a token for ``principal`` with ``role`` on ``project``; the only time it is seen."""
        token, record = _new_record(principal, role, project)
        with self._editing() as records:
            records.append(record)
        return token

    def revoke(self, token_id: str) -> bool:
        """Remove the token ``token_id``; False when there was none."""
        with self._editing() as records:
            kept = [r for r in records if r["id"] != token_id]
            found = len(kept) != len(records)
            records[:] = kept
        return found

    def list(self) -> list[dict[str, Any]]:
        """The records without their hashes."""
        return [{k: v for k, v in r.items() if k != "sha256"} for r in self._load()]

    def ensure_admin(self, env_token: str | None, token_file: Path) -> Path:
        """Make sure someone can administer the server; returns ``token_file``.

        ``env_token`` (``MTC_API_TOKEN``) is an admin token for "*" held in memory only and
        nothing is written. Otherwise, when no admin-for-"*" token exists, one is minted and its
        plaintext written to ``token_file`` (0600) for whoever started the server. A later call
        keeps the existing token and file: the plaintext cannot be recovered from the hash.
        """
        if env_token:
            self._env_hash = _sha256(env_token)
            return token_file
        minted = None
        with self._editing() as records:  # check and mint under the lock: one admin, not two
            if not any(["*", "admin"] in r.get("bindings", []) for r in records):
                minted, record = _new_record(ADMIN_PRINCIPAL, "admin", "*")
                records.append(record)
        if minted is not None:
            _write_private(token_file, minted + "\n")
            log.info("minted an admin API token; it is in %s", token_file)
        elif token_file.exists():
            _tighten(token_file)
        else:
            log.warning("an admin token exists but %s is gone; revoke it to mint a new one",
                        token_file)
        return token_file

    # -- TokenSource
    def authenticate(self, token: str) -> Principal | None:
        """The token's Principal; hashes are compared in constant time, against every record."""
        digest = _sha256(token)
        found: Principal | None = None
        if self._env_hash is not None and hmac.compare_digest(self._env_hash, digest):
            found = Principal(ENV_PRINCIPAL, (("*", "admin"),))
        for r in self._load():
            if hmac.compare_digest(str(r.get("sha256", "")), digest) and found is None:
                found = Principal(r["principal"], tuple((p, role) for p, role in r["bindings"]))
        return found


# --- Google ID tokens

GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"
GOOGLE_ISSUERS = ("accounts.google.com", "https://accounts.google.com")


class _CachedCerts:
    """A ``google.auth.transport.Request`` that caches the certs response: without it every
    API call would fetch Google's certs."""

    def __init__(self, request: Callable[..., Any], ttl_s: float) -> None:
        self._request = request
        self._ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cached: dict[str, tuple[float, Any]] = {}

    def __call__(self, url: str, method: str = "GET", **kwargs: Any) -> Any:
        with self._lock:
            hit = self._cached.get(url)
            if hit is not None and time.monotonic() - hit[0] < self._ttl_s:
                return hit[1]
        response = self._request(url, method=method, **kwargs)
        if getattr(response, "status", None) == 200:
            with self._lock:
                self._cached[url] = (time.monotonic(), response)
        return response


class GoogleTokenVerifier:
    """Verifies Google-signed ID tokens (``gcloud auth print-identity-token``, a service
    account's metadata-server token) and names their ``email`` as a member.

    ``audience`` None skips the audience check: any Google ID token of that identity, minted
    for any application, is then accepted; set it outside local experiments.
    """

    def __init__(self, audience: str | None, *, request: Callable[..., Any] | None = None,
                 certs_url: str | None = None, issuers: Sequence[str] = GOOGLE_ISSUERS,
                 clock_skew_s: int = 10, certs_ttl_s: float = 300.0) -> None:
        if audience is None:
            log.warning("Google ID tokens are accepted for any audience; set one to prevent replay")
        self.audience = audience
        self.certs_url = certs_url or GOOGLE_CERTS_URL
        self._issuers = tuple(issuers)
        self._clock_skew_s = clock_skew_s
        self._certs_ttl_s = certs_ttl_s
        self._given_request = request
        self._request: _CachedCerts | None = None  # built on first use: no client at import

    def _transport(self) -> _CachedCerts:
        if self._request is None:
            base = self._given_request
            if base is None:
                from google.auth.transport.requests import Request
                base = Request()
            self._request = _CachedCerts(base, self._certs_ttl_s)
        return self._request

    def verify(self, token: str) -> str | None:
        """The member ("user:<email>" or "serviceAccount:<email>"), or None for a token that
        is not a valid Google ID token for this audience; a 503 when the certs are unreachable."""
        if token.count(".") != 2:
            return None  # not a JWT (a local token): skip the certs fetch
        from google.auth import exceptions
        from google.oauth2 import id_token
        try:
            claims = id_token.verify_token(token, cast(Any, self._transport()), audience=self.audience,
                                           certs_url=self.certs_url,
                                           clock_skew_in_seconds=self._clock_skew_s)
        except exceptions.TransportError as e:
            raise ApiError("UNAVAILABLE", "The service is currently unavailable.") from e
        except (ValueError, TypeError, exceptions.GoogleAuthError) as e:
            log.info("rejected a Google ID token: %s", e)
            return None
        email = claims.get("email")
        if claims.get("iss") not in self._issuers or not isinstance(email, str) or not email:
            return None
        if claims.get("email_verified") is False:
            return None
        kind = "serviceAccount" if email.endswith(".gserviceaccount.com") else "user"
        return f"{kind}:{email}"


class GoogleTokens:
    """A TokenSource: a verified Google identity with its bindings from the policy (possibly
    none: authenticated, then denied)."""

    def __init__(self, verifier: GoogleTokenVerifier, policy: PolicyStore) -> None:
        self._verifier = verifier
        self._policy = policy

    def authenticate(self, token: str) -> Principal | None:
        member = self._verifier.verify(token)
        if member is None:
            return None
        return Principal(member, self._policy.bindings_for(member))
