"""The ingest API's request authentication: every ``/v1`` request names its client.

Clients send ``Authorization: Bearer <key>`` (RFC 6750); the key is looked up by its hash in
``api_keys`` (:mod:`bulk_recorder.producer.key_store`). A key's name is its client.

Scopes: ``transactions:write`` (POST /v1/transactions), ``jobs:write`` (POST a job),
``jobs:read`` (GET the client's own jobs) and ``admin`` (GET every client's jobs; it grants no
writes). A missing, malformed, unknown or revoked key is 401, a key without the endpoint's scope
403; both answer ``application/problem+json`` (RFC 9457, :mod:`.problems`) with
``WWW-Authenticate``, are counted in ``bulk_recorder_api_auth_failures_total{reason}`` and
logged without the key.

``API_AUTH=off`` (local demos only) makes every request the anonymous client ``''`` with every
scope.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Final

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from bulk_recorder.exceptions import BulkRecorderError
from bulk_recorder.infra.errors import DB_ERRORS
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.producer.api.context import TimedPool
from bulk_recorder.producer.api.problems import RETRY_AFTER, problem, problem_responses
from bulk_recorder.producer.key_store import ADMIN, ANONYMOUS, KEY_RE, SCOPES, Scope, find_key

log = logging.getLogger(__name__)

__all__ = [
    "ANONYMOUS_PRINCIPAL",
    "AUTH_RESPONSES",
    "AuthError",
    "AuthUnavailable",
    "Authenticator",
    "JobReader",
    "JobWriter",
    "Principal",
    "TransactionWriter",
    "install",
    "require",
]

REALM: Final = "bulk-recorder"


@dataclass(frozen=True)
class Principal:
    """Who sent a request: the client (a key's name) and what its key may do."""

    client: str
    scopes: frozenset[str]
    key_id: uuid.UUID | None = None

    @property
    def admin(self) -> bool:
        return ADMIN in self.scopes

    def may_read(self, owner: str) -> bool:
        """A job is visible to the client that created it, and to an admin key."""
        return self.admin or owner == self.client


ANONYMOUS_PRINCIPAL: Final = Principal(ANONYMOUS, frozenset(SCOPES))


class AuthError(BulkRecorderError):
    """A refused request: 401 (``reason`` missing, malformed, unknown, revoked) or 403 (scope)."""

    def __init__(
        self, reason: str, detail: str, *, scope: str | None = None, who: str | None = None
    ) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.scope = scope  # the scope missing (403)
        self.who = who  # the client and key id, once the key is known (never the key)

    @property
    def status(self) -> int:
        return 403 if self.reason == "scope" else 401

    def www_authenticate(self) -> str:
        if self.reason == "missing":  # RFC 6750 3.1: no error code when no credentials came
            return f'Bearer realm="{REALM}"'
        if self.reason == "scope":
            return f'Bearer realm="{REALM}", error="insufficient_scope", scope="{self.scope}"'
        return f'Bearer realm="{REALM}", error="invalid_token"'


class AuthUnavailable(BulkRecorderError):
    """The key store (the database) did not answer: 503, the client retries."""


# For the OpenAPI document of every /v1 route.
AUTH_RESPONSES: Final[dict[int | str, dict[str, Any]]] = problem_responses(
    {
        401: "no API key, or a malformed, unknown or revoked one",
        403: "the API key lacks the scope this endpoint needs",
    }
)


_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key from `bulk-recorder api-key create`: `Authorization: Bearer brk_...`",
)


class Authenticator:
    """Checks each ``/v1`` request's key against ``api_keys``; ``on=False`` lets all in."""

    def __init__(self, *, on: bool, metrics: Metrics, db: Callable[[], TimedPool]) -> None:
        self.enabled = on
        self.metrics = metrics
        self._db = db

    async def authenticate(self, request: Request) -> Principal:
        if not self.enabled:
            return ANONYMOUS_PRINCIPAL
        header = request.headers.get("authorization")
        if header is None:
            raise AuthError("missing", "an API key is required: Authorization: Bearer <key>")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not KEY_RE.fullmatch(token):
            raise AuthError("malformed", "the Authorization header must be Bearer <API key>")
        try:
            async with self._db().acquire(timeout=10) as conn:
                found = await find_key(conn, token)
        except DB_ERRORS as exc:
            log.warning("API key look-up failed: %s", exc)
            raise AuthUnavailable() from None
        if found is None:
            raise AuthError("unknown", "the API key is not valid")
        if found.revoked_at is not None:
            raise AuthError("revoked", "the API key was revoked", who=_who(found.name, found.id))
        return Principal(found.name, frozenset(found.scopes), found.id)

    def refused(self, request: Request, exc: AuthError) -> JSONResponse:
        """Count and log a refusal (never the key), and answer it."""
        self.metrics.api_auth_failures.labels(reason=exc.reason).inc()
        peer = request.client.host if request.client else "?"
        who = f", {exc.who}" if exc.who else ""
        log.warning(
            "API request refused (%s%s): %s %s from %s",
            exc.reason,
            who,
            request.method,
            request.url.path,
            peer,
        )
        return problem(exc.status, exc.detail, headers={"WWW-Authenticate": exc.www_authenticate()})


def require(scope: Scope) -> Callable[..., Awaitable[Principal]]:
    """A FastAPI dependency: the request's principal, which must hold ``scope`` (``admin`` also
    grants ``jobs:read``: it reads every job). It uses the app's :class:`Authenticator`, set by
    :func:`install`."""

    async def dependency(
        request: Request,
        _documented: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Principal:
        authenticator: Authenticator = request.app.state.authenticator
        principal = await authenticator.authenticate(request)
        allowed = scope in principal.scopes or (scope == "jobs:read" and principal.admin)
        if not allowed:
            raise AuthError(
                "scope",
                f"this API key lacks the scope {scope}",
                scope=scope,
                who=_who(principal.client, principal.key_id),
            )
        return principal

    return dependency


# What a /v1 route declares as a parameter to get its caller, checked for its scope.
TransactionWriter = Annotated[Principal, Depends(require("transactions:write"))]
JobWriter = Annotated[Principal, Depends(require("jobs:write"))]
JobReader = Annotated[Principal, Depends(require("jobs:read"))]


def install(app: FastAPI, authenticator: Authenticator) -> None:
    """Make ``authenticator`` the app's, and answer the :class:`AuthError` and
    :class:`AuthUnavailable` that :func:`require` raises."""
    app.state.authenticator = authenticator

    async def on_auth_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, AuthError)
        return authenticator.refused(request, exc)

    async def on_unavailable(_request: Request, _exc: Exception) -> JSONResponse:
        return problem(503, "database unavailable; retry later", headers=dict(RETRY_AFTER))

    app.add_exception_handler(AuthError, on_auth_error)
    app.add_exception_handler(AuthUnavailable, on_unavailable)
    if not authenticator.enabled:
        log.warning("API_AUTH=off: every /v1 request is accepted without a key (demos only)")


def _who(client: str, key_id: uuid.UUID | None) -> str:
    return f"client {client!r} key {key_id}"
