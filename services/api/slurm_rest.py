"""The Slurm Job API: ``POST v1beta1/{cluster}:callSlurmRestApi`` proxied to the cluster's
slurmrestd.

``{method: HTTP_METHOD_GET|HTTP_METHOD_POST|HTTP_METHOD_DELETE, path, body}`` in,
``{status, structuredBody}`` out: slurmrestd's HTTP status and JSON answer. mtc authenticates
and authorizes the caller first (``aiplatform.modelDevelopmentClusters.run``, editor and up;
the HTTP layer audits the call). The path must stay inside the Slurm REST API of the version
the cluster's slurmrestd serves (``/slurm/v0.0.38/...`` for Debian's 22.05: ``slurmrestd -s
list``): no other prefix, no ``..``, no ``//``, no query; anything else is a 400 naming
``path``. GET and DELETE take no body.

slurmrestd runs with ``rest_auth/jwt``. The JWT is minted on the server (``scontrol token
username=<user> lifespan=<s>``, with the cluster's ``SLURM_CONF``), cached until shortly before
it expires, sent only to slurmrestd, and never written to a log, an error or an answer. Jobs
submitted this way run as that one Slurm user (``MTC_SLURMRESTD_USER``, default the server's
own user): mtc's principals are not Unix accounts here.

Where slurmrestd is, per cluster, from configuration (``SlurmRestConfig.from_env``):
``MTC_SLURMRESTD_URLS`` (a JSON object ``{cluster id: URL}``) and ``MTC_SLURMRESTD_URL`` (any
other cluster); ``MTC_SLURM_CONF`` (else ``SLURM_CONF``) for ``scontrol token``. A cluster
without one answers FAILED_PRECONDITION; a slurmrestd that does not answer, UNAVAILABLE.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.api import ids
from services.api.clusters import COLLECTION, KIND
from services.api.context import ApiContext, load_record
from services.api.errors import ApiError, invalid
from services.api.names import Parent
from services.api.wire.slurm_rest import CallSlurmRestApiRequest, CallSlurmRestApiResponse
from services.api.wiremodel import parse_message

API_VERSION = "v0.0.38"  # the only OpenAPI plugin of Debian's slurmrestd 22.05 that needs no slurmdbd
PATH_PATTERN = re.compile(r"^/slurm/(?P<version>v\d+\.\d+\.\d+)/[A-Za-z0-9_.\-/]*$")
METHODS = {"HTTP_METHOD_GET": "GET", "HTTP_METHOD_POST": "POST", "HTTP_METHOD_DELETE": "DELETE"}
TOKEN_LIFESPAN_S = 900
TOKEN_REFRESH_S = 120  # mint a new token this long before the old one expires
MAX_ANSWER_BYTES = 8 * 1024 * 1024
TIMEOUT_S = 30.0

TokenMinter = Callable[[str, int], str]  # (user, lifespan_s) -> JWT


def scontrol_token(slurm_conf: str | None, timeout_s: float = 15.0) -> TokenMinter:
    """Mint with ``scontrol token`` (argv, no shell); its output is ``SLURM_JWT=<token>``."""

    def mint(user: str, lifespan_s: int) -> str:
        env = dict(os.environ)
        if slurm_conf:
            env["SLURM_CONF"] = slurm_conf
        try:
            proc = subprocess.run(
                ["scontrol", "token", f"username={user}", f"lifespan={int(lifespan_s)}"],
                capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ApiError("UNAVAILABLE", f"could not mint a Slurm token: {type(exc).__name__}") from None
        token = proc.stdout.strip().removeprefix("SLURM_JWT=")
        if proc.returncode != 0 or not token or "\n" in token:
            reason = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
            raise ApiError("UNAVAILABLE", f"could not mint a Slurm token: {reason}")
        return token

    return mint


@dataclass
class CachedToken:
    """A JWT reused until ``TOKEN_REFRESH_S`` before it expires (one per server process)."""

    mint: TokenMinter
    user: str
    lifespan_s: int = TOKEN_LIFESPAN_S
    clock: Callable[[], float] = time.monotonic
    _token: str = field(default="", repr=False)
    _expires: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def get(self) -> str:
        with self._lock:
            now = self.clock()
            if not self._token or now >= self._expires - TOKEN_REFRESH_S:
                self._token = self.mint(self.user, self.lifespan_s)
                self._expires = now + self.lifespan_s
            return self._token


@dataclass(frozen=True)
class SlurmRestTarget:
    url: str  # http://127.0.0.1:PORT
    user: str
    token: Callable[[], str] = field(repr=False)
    version: str = API_VERSION


@dataclass
class SlurmRestConfig:
    """Which slurmrestd serves which cluster (see the module docstring)."""

    urls: Mapping[str, str]
    default_url: str | None
    user: str
    token: CachedToken

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SlurmRestConfig:
        env = os.environ if env is None else env
        raw = env.get("MTC_SLURMRESTD_URLS", "").strip()
        try:
            urls = json.loads(raw) if raw else {}
        except ValueError:
            urls = None
        if not isinstance(urls, dict) or not all(isinstance(v, str) for v in urls.values()):
            raise ValueError("MTC_SLURMRESTD_URLS must be a JSON object of cluster id to URL")
        user = env.get("MTC_SLURMRESTD_USER", "").strip() or getpass.getuser()
        conf = env.get("MTC_SLURM_CONF", "").strip() or env.get("SLURM_CONF", "").strip() or None
        return cls(urls, env.get("MTC_SLURMRESTD_URL", "").strip() or None, user,
                   CachedToken(scontrol_token(conf), user))

    def target(self, cluster_id: str, shown: str | None = None) -> SlurmRestTarget | None:
        """``cluster_id``: the domain's (services.api.ids; MTC_SLURMRESTD_URLS names those);
        ``shown``: the caller's, for the error."""
        url = self.urls.get(cluster_id) or self.default_url
        if not url:
            return None
        if not re.match(r"^https?://[^/?#@\s]+$", url):
            raise ApiError("FAILED_PRECONDITION", f"the slurmrestd address of cluster "
                           f"{shown or cluster_id} is not an http(s)://host:port URL")
        return SlurmRestTarget(url.rstrip("/"), self.user, self.token.get)


_DEFAULT: SlurmRestConfig | None = None
_DEFAULT_LOCK = threading.Lock()


def configured(ctx: ApiContext) -> SlurmRestConfig:
    """The context's configuration, else the environment's (read once, on first use)."""
    global _DEFAULT
    own = ctx.slurm_rest
    if own is not None:
        return own  # type: ignore[no-any-return]
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = SlurmRestConfig.from_env()
        return _DEFAULT


def checked_path(path: str, version: str) -> str:
    """The path, if it stays inside slurmrestd's API of ``version``; else a 400 on ``path``."""
    match = PATH_PATTERN.match(path)
    if match is None or any(part in ("", ".", "..") for part in path.split("/")[1:-1]) \
            or path.endswith(("/.", "/..")):
        raise invalid("path", f"must be a Slurm REST API path under /slurm/{version}/ "
                      "(letters, digits, '.', '_', '-', '/'; no '..', '//' or query)")
    if match["version"] != version:
        raise invalid("path", f"this cluster's slurmrestd serves /slurm/{version}/, "
                      f"not {match['version']}")
    return path


def _body(message: CallSlurmRestApiRequest, method: str) -> bytes | None:
    if method != "POST":
        if message.body not in (None, "", {}):
            raise invalid("body", f"a {method} takes no body")
        return None
    if message.body is None or message.body == "":
        return b"{}"
    if isinstance(message.body, str):
        try:
            parsed = json.loads(message.body)
        except ValueError:
            raise invalid("body", "must be JSON (an object, or its text)") from None
        if not isinstance(parsed, dict):
            raise invalid("body", "must be a JSON object")
        return json.dumps(parsed).encode()
    return json.dumps(message.body).encode()


def call(ctx: ApiContext, parent: Parent, cluster_id: str, body: Any) -> dict[str, Any]:
    message = parse_message(CallSlurmRestApiRequest, body)
    method = METHODS[message.method]
    with ctx.unit() as uow:  # the cluster must be the caller's
        record = load_record(uow, KIND, cluster_id, parent,
                             parent.child(COLLECTION, cluster_id))
    target = configured(ctx).target(ids.domain_of(record), cluster_id)
    if target is None:
        raise ApiError("FAILED_PRECONDITION", f"cluster {cluster_id} has no slurmrestd configured "
                       "(MTC_SLURMRESTD_URL or MTC_SLURMRESTD_URLS)")
    path = checked_path(message.path, target.version)
    data = _body(message, method)
    status, answer = forward(target, method, path, data)
    return CallSlurmRestApiResponse(status=status, structured_body=answer).to_json()


def forward(target: SlurmRestTarget, method: str, path: str, data: bytes | None,
            timeout_s: float = TIMEOUT_S) -> tuple[int, dict[str, Any]]:
    """One request to slurmrestd with the server's JWT; its status and JSON answer."""
    request = urllib.request.Request(target.url + path, data=data, method=method, headers={
        "X-SLURM-USER-NAME": target.user, "X-SLURM-USER-TOKEN": target.token(),
        "Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return int(resp.status), _json(resp.read(MAX_ANSWER_BYTES + 1))
    except urllib.error.HTTPError as exc:  # slurmrestd answered with an error: pass it on
        return int(exc.code), _json(exc.read(MAX_ANSWER_BYTES + 1))
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ApiError("UNAVAILABLE", f"the cluster's slurmrestd did not answer: {reason}") from None


def _json(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_ANSWER_BYTES:
        raise ApiError("UNAVAILABLE", f"slurmrestd's answer is larger than {MAX_ANSWER_BYTES} bytes")
    if not raw.strip():
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {"text": raw.decode("utf-8", "replace")[:65536]}
    return doc if isinstance(doc, dict) else {"value": doc}
