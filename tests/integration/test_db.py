"""The recorder's connection pool against the real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest

from bulk_recorder.infra.db import open_pool_when_ready
from bulk_recorder.infra.migrate import (
    _with_database,
    create_database_if_missing,
    maintenance_dsn,
)

pytestmark = [pytest.mark.postgres]


async def test_a_connection_released_mid_transaction_comes_back_clean(database_url) -> None:
    """The pool skips asyncpg's full session reset; an open transaction is still rolled back."""
    pool = await open_pool_when_ready(database_url, max_size=1, stop=asyncio.Event())
    assert pool is not None
    try:
        async with pool.acquire() as conn:
            first_pid = conn.get_server_pid()
            await conn.execute("BEGIN")
            await conn.execute(
                "INSERT INTO balances (account_id, asset_code, available) "
                "VALUES (gen_random_uuid(), 'BRL', 1)"
            )
        async with pool.acquire() as conn:
            assert conn.get_server_pid() == first_pid  # the same session, not a new one
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT count(*) FROM balances") == 0
    finally:
        await pool.close()


async def test_processes_creating_the_same_missing_database_at_once_all_succeed(
    database_url: str,
) -> None:
    """Two recorders started together both run migrate's create-if-missing: the loser of the
    race must see 'already there', whichever error PostgreSQL reports the clash with."""
    for _ in range(5):
        name = f"brtest_race_{uuid.uuid4().hex[:10]}"
        dsn = _with_database(database_url, name)
        try:
            created = await asyncio.gather(*(create_database_if_missing(dsn) for _ in range(4)))
            assert sorted(created) == [False, False, False, True]
        finally:
            conn = await asyncpg.connect(maintenance_dsn(database_url))
            try:
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            finally:
                await conn.close()
