"""Least-privilege roles: ``bulk-recorder migrate --grant-roles PREFIX``.

The schema's owner runs ``migrate``; the services run as login roles that are members of
``PREFIX_recorder``, ``PREFIX_relay`` or ``PREFIX_api``. Those three NOLOGIN roles and their
privileges are defined in one SQL file, ``sql/roles/grants.sql``, which an operator can also run
with ``psql`` (its header says how). This module runs that file as the owner, after the
migrations, and words PostgreSQL's refusals as one line.
"""

from __future__ import annotations

import logging
import re
from importlib import resources

import asyncpg

from bulk_recorder.exceptions import BulkRecorderError

log = logging.getLogger(__name__)

ROLE_SUFFIXES = ("recorder", "relay", "api")
# A plain lower-case identifier, so that the role names need no quoting anywhere; PostgreSQL
# cuts names at 63 bytes, and "_recorder" takes 9 of them.
PREFIX_PATTERN = re.compile(r"[a-z_][a-z0-9_]{0,53}")


class RolesRefused(BulkRecorderError):
    """The roles could not be created or granted; the message says what to do."""


def grants_sql() -> str:
    return (resources.files("bulk_recorder") / "sql" / "roles" / "grants.sql").read_text("utf-8")


def role_names(prefix: str) -> tuple[str, ...]:
    if not PREFIX_PATTERN.fullmatch(prefix):
        raise ValueError(
            "a role prefix is a lower-case identifier: letters, digits and _, "
            f"not starting with a digit, at most 54 characters (got {prefix!r})"
        )
    return tuple(f"{prefix}_{suffix}" for suffix in ROLE_SUFFIXES)


async def grant_roles(conn: asyncpg.Connection, prefix: str) -> tuple[str, ...]:
    """Create (if missing) and grant the three roles, in one transaction; returns their names."""
    names = role_names(prefix)
    try:
        async with conn.transaction():
            await conn.execute("SELECT set_config('bulk_recorder.role_prefix', $1, true)", prefix)
            await conn.execute(grants_sql())
    except asyncpg.InsufficientPrivilegeError as exc:
        user = await conn.fetchval("SELECT current_user")
        raise RolesRefused(
            f"role {user} may not set up the roles {', '.join(names)} ({exc}); run it as the "
            "schema's owner, with CREATEROLE, or have a DBA create those roles (NOLOGIN) first"
        ) from None
    log.info("roles granted: %s", ", ".join(names))
    return names
