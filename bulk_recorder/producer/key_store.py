"""The ingest API's keys as stored (table ``api_keys``): made, listed, revoked and found.

A key is ``brk_`` and 43 URL-safe characters: 32 bytes from :mod:`secrets`. It is shown once,
when it is made, and only its SHA-256 is stored. A slow password hash (bcrypt, scrypt) exists to
protect guessable secrets; a 256-bit random key cannot be guessed, so a fast hash is as safe and
lets each request be checked by one index look-up on the hash.

A key's *name* is its client: keys made under one name share that client's jobs and
``Idempotency-Key`` space, so a client can rotate its key (make a second one under its name,
switch, revoke the first by id). Used by ``bulk-recorder api-key`` (:mod:`consumer.api_keys`)
and by the API's request authentication (:mod:`bulk_recorder.producer.api.auth`); it needs no
web framework.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final, Literal

from bulk_recorder.exceptions import EXIT_SETTINGS, EXIT_UNREACHABLE, BulkRecorderError
from bulk_recorder.infra.ids import uuid7

# The driver's types, for the annotations only: `bulk-recorder --help` imports this module.
if TYPE_CHECKING:
    import asyncpg
    import asyncpg.pool

__all__ = [
    "ADMIN",
    "ANONYMOUS",
    "DEFAULT_SCOPES",
    "KEY_RE",
    "SCOPES",
    "ApiKey",
    "ApiKeyRefused",
    "Scope",
    "check_scopes",
    "create_key",
    "find_key",
    "generate_key",
    "hash_key",
    "list_keys",
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
KEY_RE: Final = re.compile(r"brk_[A-Za-z0-9_-]{43}")
_SHOWN_PREFIX_LEN: Final = 12  # "brk_" and 8 random characters: enough to recognise a key
NAME_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_KEY_COLUMNS: Final = "id, name, prefix, scopes, created_at, revoked_at"


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


class ApiKeyRefused(BulkRecorderError, ValueError):
    """A key cannot be made as asked (a bad name or scope: exit 2) or there is no live key to
    revoke (exit 1)."""

    def __init__(self, message: str, *, exit_code: int = EXIT_SETTINGS) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def check_scopes(scopes: Iterable[str]) -> tuple[Scope, ...]:
    """The scopes in their canonical order; :class:`ApiKeyRefused` names any unknown one."""
    wanted = set(scopes)
    unknown = sorted(wanted.difference(SCOPES))
    if unknown:
        raise ApiKeyRefused(f"unknown scope {', '.join(unknown)}; scopes are {', '.join(SCOPES)}")
    if not wanted:
        raise ApiKeyRefused("a key needs at least one scope")
    return tuple(s for s in SCOPES if s in wanted)


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
        uuid7(),
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
        raise ApiKeyRefused(
            f"no live API key has the name or id {name_or_id!r}", exit_code=EXIT_UNREACHABLE
        )
    return [ApiKey.from_row(r) for r in rows]


async def find_key(
    conn: asyncpg.Connection | asyncpg.pool.PoolConnectionProxy, key: str
) -> ApiKey | None:
    """The stored key whose hash matches ``key`` (revoked or not), or None."""
    row = await conn.fetchrow(
        f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE key_hash = $1", hash_key(key)
    )
    return None if row is None else ApiKey.from_row(row)
