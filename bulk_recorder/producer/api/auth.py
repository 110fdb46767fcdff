"""API keys and the ingest API's authentication: every ``/v1`` request names its client.

A key is ``brk_`` and 43 URL-safe characters: 32 bytes from :mod:`secrets`. It is shown once,
when it is made, and only its SHA-256 is stored (table ``api_keys``). A slow password hash
(bcrypt, scrypt) exists to protect guessable secrets; a 256-bit random key cannot be guessed, so
a fast hash is as safe and lets each request be checked by one index look-up on the hash.

Clients send ``Authorization: Bearer <key>`` (RFC 6750). A key's *name* is its client: keys made
under one name share that client's jobs and ``Idempotency-Key`` space, so a client can rotate
its key (make a second one under its name, switch, revoke the first by id).

Scopes: ``transactions:write`` (POST /v1/transactions), ``jobs:write`` (POST a job),
``jobs:read`` (GET the client's own jobs) and ``admin`` (GET every client's jobs; it grants no
writes). A missing, malformed, unknown or revoked key is 401, a key without the endpoint's scope
403; both answer ``application/problem+json`` (RFC 9457) with ``WWW-Authenticate``, are counted
in ``bulk_recorder_api_auth_failures_total{reason}`` and logged without the key.

``API_AUTH=off`` (local demos only) makes every request the anonymous client ``''`` with every
scope.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Final, Literal

import asyncpg
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from bulk_recorder.infra.metrics import Metrics

log = logging.getLogger("bulk_recorder.auth")  # the name logs have always carried

__all__ = [
    "ADMIN",
    "ANONYMOUS",
    "AUTH_RESPONSES",
    "DEFAULT_SCOPES",
    "SCOPES",
    "ApiKey",
    "ApiKeyRefused",
    "AuthError",
    "Authenticator",
    "JobReader",
    "JobWriter",
    "Principal",
    "TransactionWriter",
    "create_key",
    "generate_key",
    "hash_key",
    "install",
    "list_keys",
    "require",
    "revoke_keys",
]

Scope = Literal["transactions:write", "jobs:write", "jobs:read", "admin"]
SCOPES: Final[tuple[Scope, ...]] = ("transactions:write", "jobs:write", "jobs:read", "admin")
ADMIN: Final = "admin"
# What `api-key create` grants when no --scope is given: a client's own work, no admin.
DEFAULT_SCOPES: Final[tuple[Scope, ...]] = ("transactions:write", "jobs:write", "jobs:read")
# The client of API_AUTH=off, and of rows written before keys existed; no key name is empty.
ANONYMOUS: Final = ""

KEY_PREFIX: Final = "brk_"
_KEY_RE: Final = re.compile(r"brk_[A-Za-z0-9_-]{43}")
_SHOWN_PREFIX_LEN: Final = 12  # "brk_" and 8 random characters: enough to recognise a key
NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
REALM: Final = "bulk-recorder"

_DB_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
    TimeoutError,
)


# -- keys -------------------------------------------------------------------------------------


def generate_key() -> str:
    """A new key: ``brk_`` and 32 random bytes, URL-safe base64 (256 bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> bytes:
    """What is stored and looked up: SHA-256 of the key."""
    return hashlib.sha256(key.encode("ascii")).digest()


@dataclass(frozen=True)
class ApiKey:
    """A stored key, without its secret."""

    id: uuid.UUID
    name: str
    prefix: str
    scopes: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> ApiKey:
        return cls(
            id=row["id"],
            name=row["name"],
            prefix=row["prefix"],
            scopes=tuple(row["scopes"]),
            created_at=row["created_at"],
            revoked_at=row["revoked_at"],
        )


class ApiKeyRefused(ValueError):
    """A key cannot be made or revoked as asked (bad name or scope, nothing to revoke)."""


def check_scopes(scopes: Iterable[str]) -> tuple[Scope, ...]:
    """The scopes in their canonical order; :class:`ApiKeyRefused` names any unknown one."""
    wanted = set(scopes)
    unknown = sorted(wanted.difference(SCOPES))
    if unknown:
        raise ApiKeyRefused(f"unknown scope {', '.join(unknown)}; scopes are {', '.join(SCOPES)}")
    if not wanted:
        raise ApiKeyRefused("a key needs at least one scope")
    return tuple(s for s in SCOPES if s in wanted)


_KEY_COLUMNS = "id, name, prefix, scopes, created_at, revoked_at"


async def create_key(
    conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy,
    name: str,
    scopes: Iterable[str] = DEFAULT_SCOPES,
) -> tuple[ApiKey, str]:
    """Store a new key for client ``name``; returns it and the key itself (never stored)."""
    if not NAME_RE.fullmatch(name):
        raise ApiKeyRefused(
            f"name {name!r} must be 1 to 64 characters: letters, digits, '.', '_', '-', "
            "starting with a letter or digit"
        )
    granted = check_scopes(scopes)
    key = generate_key()
    row = await conn.fetchrow(
        f"INSERT INTO api_keys (id, name, key_hash, prefix, scopes) VALUES ($1, $2, $3, $4, $5)"
        f" RETURNING {_KEY_COLUMNS}",
        uuid.uuid4(),
        name,
        hash_key(key),
        key[:_SHOWN_PREFIX_LEN],
        list(granted),
    )
    assert row is not None
    return ApiKey.from_row(row), key


async def list_keys(conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy) -> list[ApiKey]:
    rows = await conn.fetch(f"SELECT {_KEY_COLUMNS} FROM api_keys ORDER BY name, created_at")
    return [ApiKey.from_row(r) for r in rows]


async def revoke_keys(
    conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy, name_or_id: str
) -> list[ApiKey]:
    """Revoke one key (by id) or every live key of a client (by name); returns those revoked.
    :class:`ApiKeyRefused` when there is no live key to revoke."""
    try:
        key_id: uuid.UUID | None = uuid.UUID(name_or_id)
    except ValueError:
        key_id = None
    rows = await conn.fetch(
        f"UPDATE api_keys SET revoked_at = clock_timestamp()"
        f" WHERE revoked_at IS NULL AND (id = $1 OR ($1 IS NULL AND name = $2))"
        f" RETURNING {_KEY_COLUMNS}",
        key_id,
        name_or_id,
    )
    if not rows:
        raise ApiKeyRefused(f"no live API key has the name or id {name_or_id!r}")
    return [ApiKey.from_row(r) for r in rows]


async def find_key(
    conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy, key: str
) -> ApiKey | None:
    """The stored key whose hash matches ``key`` (revoked or not), or None."""
    row = await conn.fetchrow(
        f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE key_hash = $1", hash_key(key)
    )
    return None if row is None else ApiKey.from_row(row)


# -- requests ---------------------------------------------------------------------------------


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


class AuthError(Exception):
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


class AuthUnavailable(Exception):
    """The key store (the database) did not answer: 503, the client retries."""


def problem(
    status: int, title: str, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """An ``application/problem+json`` answer (RFC 9457)."""
    return JSONResponse(
        {"type": "about:blank", "title": title, "status": status, "detail": detail},
        status_code=status,
        headers=headers,
        media_type="application/problem+json",
    )


class AuthProblem(BaseModel):
    """An ``application/problem+json`` body (RFC 9457)."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str


# For the OpenAPI document of every /v1 route.
AUTH_RESPONSES: Final[dict[int | str, dict[str, Any]]] = {
    401: {
        "description": "no API key, or a malformed, unknown or revoked one",
        "content": {"application/problem+json": {"schema": AuthProblem.model_json_schema()}},
    },
    403: {
        "description": "the API key lacks the scope this endpoint needs",
        "content": {"application/problem+json": {"schema": AuthProblem.model_json_schema()}},
    },
}


_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="An API key from `bulk-recorder api-key create`: `Authorization: Bearer brk_...`",
)


class Authenticator:
    """Checks each ``/v1`` request's key against ``api_keys``; ``on=False`` lets all in."""

    def __init__(self, *, on: bool, metrics: Metrics, db: Callable[[], asyncpg.Pool]) -> None:
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
        if scheme.lower() != "bearer" or not _KEY_RE.fullmatch(token):
            raise AuthError("malformed", "the Authorization header must be Bearer <API key>")
        try:
            async with self._db().acquire(timeout=10) as conn:
                found = await find_key(conn, token)
        except _DB_ERRORS as exc:
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
        title = "Forbidden" if exc.status == 403 else "Unauthorized"
        headers = {"WWW-Authenticate": exc.www_authenticate()}
        return problem(exc.status, title, exc.detail, headers)


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
        return problem(
            503,
            "Service Unavailable",
            "database unavailable; retry later",
            {"Retry-After": "1"},
        )

    app.add_exception_handler(AuthError, on_auth_error)
    app.add_exception_handler(AuthUnavailable, on_unavailable)
    if not authenticator.enabled:
        log.warning("API_AUTH=off: every /v1 request is accepted without a key (demos only)")


def _who(client: str, key_id: uuid.UUID | None) -> str:
    return f"client {client!r} key {key_id}"
