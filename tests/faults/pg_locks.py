"""Holding the recorder's flush at a PostgreSQL lock, and seeing that it waits there.

A test session takes a table lock (a "gate") or a row lock; the recorder's next statement that
needs it waits for it. While it waits, the test knows exactly where the flush is, and can inject
a fault there (terminate the backend, close a deadlock cycle, commit a concurrent update) as
many times as it likes: every retry of the flush comes back to the same gate.

A backend outlives its client. ``pg_terminate_backend`` only signals it, and returns; a backend
whose client process was killed notices only when it next reads from or writes to its socket,
so a statement already sent may still run, and commit, once its lock is granted. Until the
backend has exited, its session's temporary tables exist too: they are dropped on its way out,
before it leaves ``pg_stat_activity``. A test that reads what such a session did or left waits
with :func:`wait_for_backends_gone` first.
"""

from __future__ import annotations

from collections.abc import Collection

import asyncpg

from tests.conftest import wait_for

GATE_MODE = "SHARE ROW EXCLUSIVE"  # blocks INSERT and UPDATE (ROW EXCLUSIVE), not SELECT

_RELATION_WAITERS = """
SELECT pid FROM pg_locks
WHERE locktype = 'relation' AND relation = $1::regclass AND NOT granted
  AND NOT pid = ANY($2::int[])
ORDER BY pid
"""
_BLOCKED_BY = """
SELECT pid FROM pg_stat_activity
WHERE $1::int = ANY(pg_blocking_pids(pid)) AND NOT pid = ANY($2::int[])
ORDER BY pid
"""
_OTHER_BACKENDS = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND NOT pid = ANY($1::int[])
ORDER BY pid
"""
_ALIVE = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[])"
_XACT_WAITER = """
SELECT count(*) > 0 FROM pg_locks
WHERE locktype = 'transactionid' AND NOT granted AND pid = $1
"""


async def relation_waiters(
    conn: asyncpg.Connection, relation: str, exclude: Collection[int] = ()
) -> list[int]:
    """Backends waiting for a lock on ``relation`` (other than the ``exclude`` pids)."""
    rows = await conn.fetch(_RELATION_WAITERS, relation, list(exclude))
    return [int(r[0]) for r in rows]


async def wait_for_relation_waiter(
    conn: asyncpg.Connection,
    relation: str,
    exclude: Collection[int] = (),
    timeout: float = 30,
) -> int:
    """The pid of a backend waiting for ``relation`` once there is one."""
    found: list[int] = []

    async def waiting() -> bool:
        found[:] = await relation_waiters(conn, relation, exclude)
        return bool(found)

    await wait_for(waiting, timeout=timeout, interval=0.02)
    return found[0]


async def wait_for_xact_waiter(conn: asyncpg.Connection, pid: int, timeout: float = 30) -> None:
    """Until backend ``pid`` waits for another transaction (e.g. on a duplicate key)."""

    async def waiting() -> bool:
        return bool(await conn.fetchval(_XACT_WAITER, pid))

    await wait_for(waiting, timeout=timeout, interval=0.02)


async def wait_for_blocked_by(
    conn: asyncpg.Connection, holder: int, exclude: Collection[int] = (), timeout: float = 30
) -> int:
    """The pid of a backend that waits for a lock ``holder`` holds (a row, a transaction or a
    table), once there is one."""
    found: list[int] = []

    async def waiting() -> bool:
        rows = await conn.fetch(_BLOCKED_BY, holder, list(exclude))
        found[:] = [int(r[0]) for r in rows]
        return bool(found)

    await wait_for(waiting, timeout=timeout, interval=0.02)
    return found[0]


async def wait_for_blocked(conn: asyncpg.Connection, pid: int, timeout: float = 30) -> None:
    """Until backend ``pid`` waits for a lock another backend holds."""

    async def waiting() -> bool:
        return bool(await conn.fetchval("SELECT cardinality(pg_blocking_pids($1)) > 0", pid))

    await wait_for(waiting, timeout=timeout, interval=0.02)


async def close_gate(conn: asyncpg.Connection, table: str) -> None:
    """Begin a transaction on ``conn`` that holds ``table`` against writers until it ends."""
    await conn.execute("BEGIN")
    await conn.execute(f"LOCK TABLE {table} IN {GATE_MODE} MODE")


async def backend_pid(conn: asyncpg.Connection) -> int:
    """The pid of ``conn``'s own backend."""
    return int(await conn.fetchval("SELECT pg_backend_pid()"))


async def other_backends(conn: asyncpg.Connection, exclude: Collection[int] = ()) -> list[int]:
    """The client backends of ``conn``'s database other than ``conn``'s and ``exclude``."""
    rows = await conn.fetch(_OTHER_BACKENDS, [await backend_pid(conn), *exclude])
    return [int(r[0]) for r in rows]


async def wait_for_backends_gone(
    conn: asyncpg.Connection, pids: Collection[int], timeout: float = 30
) -> None:
    """Until none of ``pids`` is in ``pg_stat_activity``: each has ended its transaction
    (committed or rolled back) and dropped its temporary tables, so what it did is settled."""

    async def gone() -> bool:
        return not await conn.fetchval(_ALIVE, list(pids))

    await wait_for(gone, timeout=timeout, interval=0.02)
