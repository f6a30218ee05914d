"""Authentication, authorization and audit of the API: local tokens, Google ID tokens, roles."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt
from google.auth import jwt as google_jwt

from services.api.audit import AUDIT_COLLECTION, AuditLog
from services.api.auth import (
    INVALID_CREDENTIALS,
    MISSING_CREDENTIALS,
    PERMISSIONS,
    SLURM_RUN,
    TOKENS_MANAGE,
    Authenticator,
    PolicyStore,
    Principal,
    authorize,
    permissions_of,
)
from services.api.errors import ApiError
from services.api.tokens import GoogleTokens, GoogleTokenVerifier, LocalTokens
from shared.adapters.memory_store import MemoryDocStore
from shared.adapters.sqlite_store import SqliteDocStore
from shared.ports import DocStore

AUDIENCE = "https://mtc.example.com"
CERTS_URL = "https://certs.example.invalid/oauth2/v1/certs"
KID = "test-key-1"


def _signer(pem: bytes) -> crypt.RSASigner:
    signer: crypt.RSASigner = crypt.RSASigner.from_string(pem, key_id=KID)  # type: ignore[no-untyped-call]
    return signer


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# --- roles and authorization

def test_roles_nest_and_name_permissions_as_vertex_does() -> None:
    viewer, editor, admin = (permissions_of(r) for r in ("viewer", "editor", "admin"))
    assert viewer < editor < admin
    assert admin == PERMISSIONS
    assert {"aiplatform.customJobs.get", "aiplatform.models.list", "aiplatform.operations.wait"} <= viewer
    assert "aiplatform.customJobs.create" not in viewer
    assert {"aiplatform.trainingPipelines.cancel", "aiplatform.operations.delete"} <= editor
    assert "aiplatform.operations.create" not in admin  # operations have no create/update
    assert SLURM_RUN not in viewer and SLURM_RUN in editor  # the Slurm Job API: editor and up
    assert TOKENS_MANAGE not in editor
    assert {SLURM_RUN, TOKENS_MANAGE} <= admin
    with pytest.raises(ValueError, match="unknown role"):
        permissions_of("owner")


def test_viewer_may_read_but_not_create_and_the_403_names_the_permission() -> None:
    viewer = Principal("user:v@example.com", (("*", "viewer"),))
    authorize(viewer, "aiplatform.customJobs.get", "p1")
    authorize(viewer, "aiplatform.customJobs.list", "p1")
    with pytest.raises(ApiError) as err:
        authorize(viewer, "aiplatform.customJobs.create", "p1")
    assert err.value.status == "PERMISSION_DENIED" and err.value.http_status == 403
    assert "aiplatform.customJobs.create" in err.value.message
    assert "projects/p1" in err.value.message
    assert err.value.reason == "aiplatform.customJobs.create"


def test_project_scoped_binding_allows_its_project_only() -> None:
    scoped = Principal("token:ci", (("a", "editor"),))
    authorize(scoped, "aiplatform.customJobs.create", "a")
    with pytest.raises(ApiError) as err:
        authorize(scoped, "aiplatform.customJobs.get", "b")
    assert err.value.status == "PERMISSION_DENIED"
    assert "projects/b" in err.value.message


def test_no_bindings_and_unknown_permissions() -> None:
    with pytest.raises(ApiError):
        authorize(Principal("user:x@example.com"), "aiplatform.models.get", "p")
    with pytest.raises(ValueError, match="unknown permission"):
        authorize(Principal("token:a", (("*", "admin"),)), "aiplatform.customJobs.frobnicate", "p")


# --- local tokens

def test_token_file_is_0600_and_holds_only_hashes(tmp_path: Path) -> None:
    tokens = LocalTokens(tmp_path / "api-tokens.json")
    token = tokens.create("token:ci-bot", "editor", "proj")
    assert token.startswith("mtc_") and len(token) > 40
    path = tmp_path / "api-tokens.json"
    assert _mode(path) == 0o600
    text = path.read_text()
    assert token not in text and token[4:] not in text
    (record,) = json.loads(text)["tokens"]
    assert set(record) == {"id", "sha256", "principal", "bindings", "createdAt"}
    assert record["bindings"] == [["proj", "editor"]]
    assert [r["id"] for r in tokens.list()] == [record["id"]]
    assert "sha256" not in tokens.list()[0]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp file left


def test_create_validates_role(tmp_path: Path) -> None:
    tokens = LocalTokens(tmp_path / "t.json")
    with pytest.raises(ValueError, match="unknown role"):
        tokens.create("token:x", "superuser")
    assert not (tmp_path / "t.json").exists()


def test_authenticate_and_revoke(tmp_path: Path) -> None:
    tokens = LocalTokens(tmp_path / "t.json")
    token = tokens.create("token:ci-bot", "viewer", "a")
    assert tokens.authenticate(token) == Principal("token:ci-bot", (("a", "viewer"),))
    assert tokens.authenticate(token + "x") is None
    assert tokens.revoke(tokens.list()[0]["id"]) is True
    assert tokens.authenticate(token) is None
    assert tokens.revoke("tok-nope") is False


def test_tokens_minted_by_another_process_are_seen(tmp_path: Path) -> None:
    server, cli = LocalTokens(tmp_path / "t.json"), LocalTokens(tmp_path / "t.json")
    first = server.create("token:a", "viewer")
    assert server.authenticate(first) is not None
    second = cli.create("token:b", "editor")
    assert server.authenticate(second) == Principal("token:b", (("*", "editor"),))
    assert len(server.list()) == 2  # the CLI's write kept the server's record


def test_group_readable_token_file_is_tightened_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "t.json"
    token = LocalTokens(path).create("token:a", "viewer")
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING):
        assert LocalTokens(path).authenticate(token) is not None
    assert _mode(path) == 0o600
    assert "0600" in caplog.text


def test_ensure_admin_mints_once_and_is_idempotent(tmp_path: Path) -> None:
    tokens = LocalTokens(tmp_path / "api-tokens.json")
    token_file = tmp_path / "api-token"
    assert tokens.ensure_admin(None, token_file) == token_file
    assert _mode(token_file) == 0o600
    admin_token = token_file.read_text().strip()
    principal = tokens.authenticate(admin_token)
    assert principal is not None and ("*", "admin") in principal.bindings
    authorize(principal, TOKENS_MANAGE, "any")
    assert admin_token not in (tmp_path / "api-tokens.json").read_text()

    again = LocalTokens(tmp_path / "api-tokens.json")  # a restarted server
    assert again.ensure_admin(None, token_file) == token_file
    assert token_file.read_text().strip() == admin_token
    assert len(again.list()) == 1
    assert again.authenticate(admin_token) == principal


def test_ensure_admin_with_env_token_keeps_it_in_memory(tmp_path: Path) -> None:
    path, token_file = tmp_path / "api-tokens.json", tmp_path / "api-token"
    env = "from-the-environment-0123456789"
    tokens = LocalTokens(path)
    tokens.ensure_admin(env, token_file)
    assert not token_file.exists()
    assert not path.exists() or env not in path.read_text()
    assert tokens.list() == []
    principal = tokens.authenticate(env)
    assert principal is not None and principal.bindings == (("*", "admin"),)
    assert LocalTokens(path).authenticate(env) is None  # nothing was persisted


# --- the Authorization header

def test_authenticator_header_handling(tmp_path: Path) -> None:
    tokens = LocalTokens(tmp_path / "t.json")
    token = tokens.create("token:ci-bot", "viewer")
    auth = Authenticator([tokens])
    assert auth.authenticate(f"Bearer {token}").name == "token:ci-bot"
    assert auth.authenticate(f"bearer  {token} ").name == "token:ci-bot"
    cases = [(None, MISSING_CREDENTIALS), ("", MISSING_CREDENTIALS),
             (token, INVALID_CREDENTIALS), (f"Basic {token}", INVALID_CREDENTIALS),
             ("Bearer", INVALID_CREDENTIALS), ("Bearer a b", INVALID_CREDENTIALS),
             ("Bearer mtc_unknown", INVALID_CREDENTIALS)]
    for header, message in cases:
        with pytest.raises(ApiError) as err:
            auth.authenticate(header)
        assert (err.value.status, err.value.http_status, err.value.message) == (
            "UNAUTHENTICATED", 401, message), header


# --- Google ID tokens

class _Response:
    def __init__(self, status: int, body: dict[str, str]) -> None:
        self.status = status
        self.data = json.dumps(body).encode()


@pytest.fixture(scope="module")
def google_key() -> tuple[crypt.RSASigner, dict[str, str]]:
    """An RSA key, its signer and the certs document Google would publish for it."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    signer = _signer(pem)
    return signer, {KID: cert.public_bytes(serialization.Encoding.PEM).decode()}


@pytest.fixture
def fake_request(google_key: tuple[crypt.RSASigner, dict[str, str]]
                 ) -> Iterator[Callable[..., _Response]]:
    calls: list[str] = []

    def request(url: str, method: str = "GET", **_: Any) -> _Response:
        calls.append(url)
        return _Response(200, google_key[1]) if url == CERTS_URL else _Response(404, {})

    request.calls = calls  # type: ignore[attr-defined]
    yield request


def _id_token(signer: crypt.RSASigner, **claims: Any) -> str:
    now = int(time.time())
    payload = {"iss": "https://accounts.google.com", "aud": AUDIENCE, "sub": "1234",
               "email": "a@example.com", "email_verified": True, "iat": now, "exp": now + 3600,
               **claims}
    return cast(bytes, google_jwt.encode(signer, payload)).decode()  # type: ignore[no-untyped-call]


def test_google_id_token_is_verified_and_mapped_to_a_member(
        google_key: tuple[crypt.RSASigner, dict[str, str]], fake_request: Callable[..., _Response]) -> None:
    signer = google_key[0]
    verifier = GoogleTokenVerifier(AUDIENCE, request=fake_request, certs_url=CERTS_URL)
    assert verifier.verify(_id_token(signer)) == "user:a@example.com"
    sa = "ci@proj.iam.gserviceaccount.com"
    assert verifier.verify(_id_token(signer, email=sa)) == f"serviceAccount:{sa}"
    assert fake_request.calls == [CERTS_URL]  # type: ignore[attr-defined]  # certs cached


@pytest.mark.parametrize("claims", [
    {"exp": int(time.time()) - 3600, "iat": int(time.time()) - 7200},  # expired
    {"aud": "https://someone-else.example.com"},  # minted for another application
    {"iss": "https://evil.example.com"},
    {"email_verified": False},
    {"email": None},
], ids=["expired", "wrong-audience", "wrong-issuer", "unverified-email", "no-email"])
def test_bad_google_id_tokens_are_rejected(
        google_key: tuple[crypt.RSASigner, dict[str, str]], fake_request: Callable[..., _Response],
        claims: dict[str, Any]) -> None:
    verifier = GoogleTokenVerifier(AUDIENCE, request=fake_request, certs_url=CERTS_URL)
    assert verifier.verify(_id_token(google_key[0], **claims)) is None


def test_google_id_token_signed_by_another_key_is_rejected(
        fake_request: Callable[..., _Response]) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption())
    forged = _id_token(_signer(pem))
    verifier = GoogleTokenVerifier(AUDIENCE, request=fake_request, certs_url=CERTS_URL)
    assert verifier.verify(forged) is None
    assert verifier.verify("not.a.jwt") is None


def test_unreachable_certs_are_a_503_not_a_401(google_key: tuple[crypt.RSASigner, dict[str, str]]) -> None:
    verifier = GoogleTokenVerifier(AUDIENCE, request=lambda url, **_: _Response(500, {}),
                                   certs_url=CERTS_URL)
    with pytest.raises(ApiError) as err:
        verifier.verify(_id_token(google_key[0]))
    assert err.value.status == "UNAVAILABLE"


def test_google_principal_gets_bindings_from_the_policy(
        tmp_path: Path, google_key: tuple[crypt.RSASigner, dict[str, str]],
        fake_request: Callable[..., _Response]) -> None:
    policy = PolicyStore(SqliteDocStore(tmp_path / "state.db"))
    policy.set([{"role": "editor", "project": "*", "members": ["user:a@example.com"]},
                {"role": "viewer", "project": "p2", "members": ["user:b@example.com"]}])
    local = LocalTokens(tmp_path / "t.json")
    verifier = GoogleTokenVerifier(AUDIENCE, request=fake_request, certs_url=CERTS_URL)
    auth = Authenticator([local, GoogleTokens(verifier, policy)])
    a = auth.authenticate(f"Bearer {_id_token(google_key[0])}")
    assert a == Principal("user:a@example.com", (("*", "editor"),))
    authorize(a, "aiplatform.customJobs.create", "p1")
    b = auth.authenticate(f"Bearer {_id_token(google_key[0], email='b@example.com')}")
    authorize(b, "aiplatform.customJobs.get", "p2")
    with pytest.raises(ApiError):
        authorize(b, "aiplatform.customJobs.get", "p1")
    nobody = auth.authenticate(f"Bearer {_id_token(google_key[0], email='c@example.com')}")
    assert nobody.bindings == ()  # authenticated, then denied: a 403, not a 401
    with pytest.raises(ApiError) as err:
        auth.authenticate(f"Bearer {_id_token(google_key[0], aud='other')}")
    assert err.value.status == "UNAUTHENTICATED"


def test_policy_validates_roles_and_members() -> None:
    policy = PolicyStore(MemoryDocStore())
    assert policy.get() == []
    cases: list[tuple[list[dict[str, Any]], str]] = [
        ([{"role": "owner", "members": ["user:a@example.com"]}], "bindings[0].role"),
        ([{"role": "viewer", "members": ["a@example.com"]}], "bindings[0].members"),
        ([{"role": "viewer", "members": "user:a@example.com"}], "bindings[0].members"),
        ([{"role": "viewer", "project": "", "members": []}], "bindings[0].project")]
    for bad, field in cases:
        with pytest.raises(ApiError) as err:
            policy.set(bad)
        assert err.value.status == "INVALID_ARGUMENT"
        assert err.value.violations[0].field == field
    assert policy.get() == []  # nothing bad was stored
    policy.set([{"role": "admin", "members": ["serviceAccount:x@p.iam.gserviceaccount.com"]}])
    assert policy.get() == [{"role": "admin", "project": "*",
                             "members": ["serviceAccount:x@p.iam.gserviceaccount.com"]}]
    assert policy.bindings_for("serviceAccount:x@p.iam.gserviceaccount.com") == (("*", "admin"),)
    assert policy.bindings_for("user:x@p.iam.gserviceaccount.com") == ()


# --- audit

@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> DocStore:
    return MemoryDocStore() if request.param == "memory" else SqliteDocStore(tmp_path / "s.db")


def test_audit_records_are_written_read_in_order_and_pruned(store: DocStore) -> None:
    audit = AuditLog(store, retention_s=100.0)
    for at, status in [(1000.0, 200), (1000.0, 403), (1050.0, 200)]:
        audit.record(principal="user:a@example.com", permission="aiplatform.customJobs.create",
                     resource="projects/p/locations/us-central1/customJobs", method="POST",
                     status=status, now=at)
    records = audit.read()
    assert [(r["at"], r["status"]) for r in records] == [(1000.0, 200), (1000.0, 403), (1050.0, 200)]
    assert len({r["id"] for r in records}) == 3
    first = records[0]
    assert first["who"] == "user:a@example.com" and first["method"] == "POST"
    assert first["expire_at"] == 1100.0
    assert [r["at"] for r in audit.read(since=1001.0)] == [1050.0]

    assert audit.prune(now=1100.0) == 0  # expire_at 1100 has not passed yet
    assert audit.prune(now=1101.0) == 2
    assert [r["at"] for r in audit.read()] == [1050.0]
    assert audit.prune(now=1151.0) == 1
    assert audit.read() == []


def test_audit_prune_on_a_store_without_an_indexed_prune() -> None:
    class PlainStore:  # a DocStore with only the protocol's methods (no prune, no since)
        def __init__(self) -> None:
            self._inner = MemoryDocStore()
            self.begin, self.read = self._inner.begin, self._inner.read
            self.write, self.remove, self.oldest = self._inner.write, self._inner.remove, self._inner.oldest

    plain = PlainStore()
    audit = AuditLog(plain, retention_s=10.0)
    for at in (5.0, 1.0, 20.0):
        audit.record(principal="token:a", permission="aiplatform.models.get", resource="projects/p",
                     method="GET", status=200, now=at)
    assert [r["at"] for r in audit.read()] == [1.0, 5.0, 20.0]
    assert audit.prune(now=16.0) == 2
    assert [r["at"] for r in audit.read()] == [20.0]
    assert plain._inner.data[AUDIT_COLLECTION].keys() == {audit.read()[0]["id"]}
