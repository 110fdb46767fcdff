"""``bulk-recorder migrate [--grant-roles PREFIX]``: the schema, then the least-privilege roles.

A refusal (a role that may not change the schema or create the roles) or a server error is
raised to :func:`consumer.cli.main`, which prints it as one line (``consumer.failures``).
"""

from __future__ import annotations

from bulk_recorder.infra.migrate import connect_creating, migrate
from bulk_recorder.infra.roles import grant_roles


async def run_migrate(dsn: str, *, role_prefix: str | None) -> int:
    applied = await migrate(dsn)
    print("applied: " + (", ".join(applied) if applied else "nothing (schema up to date)"))
    if role_prefix is not None:
        conn = await connect_creating(dsn)
        try:
            names = await grant_roles(conn, role_prefix)
        finally:
            await conn.close()
        print("roles granted: " + ", ".join(names))
    return 0
