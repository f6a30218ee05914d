"""How the API decides who is calling and what they may do, for each deployment.

Embedded: bearer tokens from a 0600 file in the state directory (``MTC_API_TOKEN`` is an
admin token too). Google Cloud: the caller's Google ID token, verified, and the role
bindings stored with the state.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

from services.api.auth import Authenticator, PolicyStore, Principal, TokenSource, authorize
from services.api.job_tokens import JobTokens, load_key
from services.api.tokens import GoogleTokens, GoogleTokenVerifier, LocalTokens
from shared.ports import DocStore

TOKENS_FILE = "api-tokens.json"
ADMIN_TOKEN_FILE = "api-token"


@dataclass
class TokenGuard:
    authenticator: Authenticator

    def check(self, authorization: str | None, permission: str, project: str) -> Principal:
        principal = self.identify(authorization)
        authorize(principal, permission, project)
        return principal

    def identify(self, authorization: str | None) -> Principal:
        """Who is calling (a 401 when nobody can be told), before what they may do is asked:
        a denied call's audit record names the caller it denied."""
        return self.authenticator.authenticate(authorization)

    def authorize(self, principal: Principal, permission: str, project: str,
                  resource: str | None = None) -> None:
        authorize(principal, permission, project, resource)


@dataclass(frozen=True)
class LocalAuth:
    guard: TokenGuard
    tokens: LocalTokens
    admin_token_file: Path | None  # where the minted admin token is; None: MTC_API_TOKEN


def local_auth(state_dir: Path, env_token: str | None) -> LocalAuth:
    state_dir.mkdir(parents=True, exist_ok=True)
    tokens = LocalTokens(state_dir / TOKENS_FILE)
    token_file = tokens.ensure_admin(env_token, state_dir / ADMIN_TOKEN_FILE)
    jobs = JobTokens(load_key(state_dir))  # running jobs' own credentials
    return LocalAuth(TokenGuard(Authenticator([tokens, jobs])), tokens,
                     None if env_token else token_file)


@dataclass(frozen=True)
class StaticToken:
    """One admin token from the environment (``MTC_API_TOKEN``, e.g. from Secret Manager):
    for operators and the local emulator stack, where no Google ID token can be had."""

    token: str

    def authenticate(self, token: str) -> Principal | None:
        if hmac.compare_digest(token.encode(), self.token.encode()):
            return Principal("token:env-admin", (("*", "admin"),))
        return None


def google_auth(store: DocStore, audience: str | None, env_token: str | None = None
                ) -> TokenGuard:
    sources: list[TokenSource] = [StaticToken(env_token)] if env_token else []
    sources.append(GoogleTokens(GoogleTokenVerifier(audience), PolicyStore(store)))
    return TokenGuard(Authenticator(sources))
