"""The recorder's connection pool against the real PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from bulk_recorder.infra.db import open_pool_when_ready

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
