"""``bulk-recorder migrate [--grant-roles PREFIX]``: the schema, then the least-privilege roles.

Every way it can fail ends in one line on stderr and exit code 1: a role that may not change
the schema or create the roles, and a server that refuses us after the reachability check
(no right to create the database, a connection lost half-way).
"""

from __future__ import annotations

import logging
import sys

from bulk_recorder.db import DB_ERRORS
from bulk_recorder.migrate import MigrationRefused, connect_creating, migrate
from bulk_recorder.roles import RolesRefused, grant_roles
from consumer.reach import endpoint, reason

log = logging.getLogger(__name__)


async def run_migrate(dsn: str, *, role_prefix: str | None) -> int:
    try:
        applied = await migrate(dsn)
        print("applied: " + (", ".join(applied) if applied else "nothing (schema up to date)"))
        if role_prefix is not None:
            conn = await connect_creating(dsn)
            try:
                names = await grant_roles(conn, role_prefix)
            finally:
                await conn.close()
            print("roles granted: " + ", ".join(names))
    except (MigrationRefused, RolesRefused) as exc:
        print(f"bulk-recorder migrate: {exc}", file=sys.stderr)
        return 1
    except DB_ERRORS as exc:
        print(
            f"bulk-recorder migrate: PostgreSQL at {endpoint(dsn)} refused: {reason(exc)}",
            file=sys.stderr,
        )
        return 1
    return 0
