"""Who may call the API: permissions and roles as Vertex names them, principals, the policy
that binds Google identities to roles, authentication of a bearer token and authorization.

Token sources live in ``services.api.tokens`` (local tokens, Google ID tokens) and the audit
trail in ``services.api.audit``; this module imports neither, so they can import it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from services.api.errors import invalid, permission_denied, unauthenticated
from shared.ports import DocStore

log = logging.getLogger(__name__)

COLLECTIONS: tuple[str, ...] = ("customJobs", "modelDevelopmentClusters", "operations",
                                "hyperparameterTuningJobs", "trainingPipelines", "models",
                                "endpoints")
_READ_VERBS = ("get", "list")
_WRITE_VERBS = ("create", "update", "cancel", "delete")
SLURM_RUN = "aiplatform.modelDevelopmentClusters.run"  # the Slurm Job API: runs arbitrary code
TOKENS_MANAGE = "mtc.tokens.manage"  # minting/revoking tokens and editing the policy
# a node's health report (``nodes/{node}:reportHealth``): what a node agent's token may do,
# and nothing else (role "node-agent"); editors hold it too (they inject faults with it)
NODE_REPORT = "mtc.nodes.reportHealth"
# ``{cluster}:reportFaultyNodes``: deletes nodes and hands hosts to the provider (editors)
REPORT_FAULTY = "aiplatform.modelDevelopmentClusters.reportFaultyNodes"
# an endpoint's own verbs, by Vertex's names (the editors': predict runs the model's code)
ENDPOINT_VERBS = frozenset({"aiplatform.endpoints.deploy", "aiplatform.endpoints.undeploy",
                            "aiplatform.endpoints.predict"})


def _perms(verbs: Iterable[str], *, operations: Iterable[str]) -> frozenset[str]:
    out = {f"aiplatform.{c}.{v}" for c in COLLECTIONS if c != "operations" for v in verbs}
    out |= {f"aiplatform.operations.{v}" for v in operations}
    return frozenset(out)


# Cloud Storage (``services.api.storage``), by Cloud Storage's names: on the project that
# owns the bucket
STORAGE_READ = frozenset({"storage.buckets.get", "storage.buckets.list",
                          "storage.objects.get", "storage.objects.list"})
STORAGE_WRITE = frozenset({"storage.buckets.create", "storage.objects.create",
                           "storage.objects.delete"})

_VIEWER = _perms(_READ_VERBS, operations=("get", "list", "wait")) | STORAGE_READ
# the Slurm Job API runs arbitrary code, as creating a CustomJob does: editors may
_EDITOR = _VIEWER | _perms(_WRITE_VERBS, operations=("cancel", "delete")) \
    | {SLURM_RUN, NODE_REPORT, REPORT_FAULTY} | STORAGE_WRITE | ENDPOINT_VERBS
_ADMIN = _EDITOR | {TOKENS_MANAGE}

# a running job's own credential (``job_tokens``): its own job, read and cancel, only
_JOB = frozenset({"aiplatform.customJobs.get", "aiplatform.customJobs.cancel"})

# role -> the permissions it grants; read-only, so no caller can widen a role at runtime
ROLES: MappingProxyType[str, frozenset[str]] = MappingProxyType(
    {"viewer": _VIEWER, "editor": _EDITOR, "admin": _ADMIN,
     "node-agent": frozenset({NODE_REPORT}), "job": _JOB})
PERMISSIONS: frozenset[str] = _ADMIN  # every permission some role grants

MISSING_CREDENTIALS = ("Request is missing required authentication credential. Expected OAuth 2 "
                       "access token or other valid authentication credential.")
INVALID_CREDENTIALS = "Request had invalid authentication credentials."


def permissions_of(role: str) -> frozenset[str]:
    """The permissions ``role`` grants; a typo in a role must fail loudly, never grant nothing."""
    try:
        return ROLES[role]
    except KeyError:
        raise ValueError(f"unknown role {role!r}; expected one of {sorted(ROLES)}") from None


@dataclass(frozen=True)
class Principal:
    """An authenticated caller and its (project or "*", role) bindings; ``resource``: the
    one resource it may act on (a job's own credential), None: any its bindings allow."""

    name: str  # "token:ci-bot", "user:a@example.com", "serviceAccount:x@p.iam.gserviceaccount.com"
    bindings: tuple[tuple[str, str], ...] = ()
    resource: str | None = None


class TokenSource(Protocol):
    """Turns a bearer token into a Principal, or None when the token is not one it knows."""

    def authenticate(self, token: str) -> Principal | None: ...


class Authenticator:
    """Checks an ``Authorization`` header against token sources, tried in order."""

    def __init__(self, sources: Sequence[TokenSource]) -> None:
        self._sources = tuple(sources)

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller, or a 401 worded as Google words it (clients show the message as is)."""
        if authorization is None or not authorization.strip():
            raise unauthenticated(MISSING_CREDENTIALS)
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
            raise unauthenticated(INVALID_CREDENTIALS)
        for source in self._sources:
            principal = source.authenticate(token)
            if principal is not None:
                return principal
        raise unauthenticated(INVALID_CREDENTIALS)


def authorize(principal: Principal, permission: str, project: str,
              resource: str | None = None) -> None:
    """Allow when a binding on ``project`` or "*" grants ``permission`` (and, for a principal
    restricted to one resource, the call's ``resource`` is that one or a method of it:
    ``NAME:cancel``); else a 403 naming it."""
    if permission not in PERMISSIONS:
        raise ValueError(f"unknown permission {permission!r}")  # a server bug, not a denial
    only = principal.resource
    if only is not None and (resource is None or (resource != only
                                                  and not resource.startswith(only + ":"))):
        raise permission_denied(permission, resource or f"projects/{project}")
    for scope, role in principal.bindings:
        if scope in (project, "*") and permission in ROLES.get(role, frozenset()):
            return
    raise permission_denied(permission, f"projects/{project}")


# --- the policy: Google principals -> roles, one document like an IAM policy

POLICY_COLLECTION = "api_policy"
POLICY_ID = "policy"
_MEMBER_KINDS = ("user:", "serviceAccount:", "group:", "domain:", "token:")


def _validate_bindings(bindings: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalized copies, or a 400 naming the bad field: a bad policy must never be stored."""
    if not isinstance(bindings, (list, tuple)):
        raise invalid("bindings", "must be a list")
    out = []
    for i, b in enumerate(bindings):
        where = f"bindings[{i}]"
        if not isinstance(b, dict):
            raise invalid(where, "must be an object")
        role, project, members = b.get("role"), b.get("project", "*"), b.get("members")
        if not isinstance(role, str) or role not in ROLES:
            raise invalid(f"{where}.role", f"unknown role {role!r}; expected one of {sorted(ROLES)}")
        if not isinstance(project, str) or not project:
            raise invalid(f"{where}.project", "must be a project id or '*'")
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise invalid(f"{where}.members", "must be a list of member names")
        for m in members:
            if not m.startswith(_MEMBER_KINDS) or m.endswith(":"):
                raise invalid(f"{where}.members", f"bad member {m!r}; expected e.g. 'user:a@example.com'")
        out.append({"role": role, "project": project, "members": list(members)})
    return out


class PolicyStore:
    """The bindings of Google identities, one ``api_policy/policy`` document in the DocStore
    (shared by every server replica, edited by the admin)."""

    def __init__(self, store: DocStore) -> None:
        self._store = store

    def get(self) -> list[dict[str, Any]]:
        # a plain read (the collection holds only this document): a transaction would take
        # sqlite's write lock on every request
        docs = self._store.read(POLICY_COLLECTION, {})
        doc = docs[0] if docs else None
        return [dict(b, members=list(b["members"])) for b in (doc or {}).get("bindings", [])]

    def set(self, bindings: Sequence[dict[str, Any]]) -> None:
        """Replace the policy; roles, projects and members are validated first."""
        self._store.write(POLICY_COLLECTION, POLICY_ID, {"bindings": _validate_bindings(bindings)})

    def bindings_for(self, member: str) -> tuple[tuple[str, str], ...]:
        out = []
        for b in self.get():
            if member in b["members"] and b["role"] in ROLES:
                out.append((b["project"], b["role"]))
            elif member in b["members"]:
                log.warning("api policy binds %s to unknown role %r; ignored", member, b["role"])
        return tuple(out)


__all__ = ["COLLECTIONS", "INVALID_CREDENTIALS", "MISSING_CREDENTIALS", "PERMISSIONS", "ROLES",
           "SLURM_RUN", "STORAGE_READ", "STORAGE_WRITE", "TOKENS_MANAGE", "Authenticator",
           "PolicyStore", "Principal", "TokenSource", "authorize", "permissions_of"]
