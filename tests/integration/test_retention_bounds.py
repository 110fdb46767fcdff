"""``bulk-recorder retention`` on its bounds: each table keeps its own window, to the hour; every
expired job goes however many batches they take, past a job someone holds; and a batch held
past ``--lock-timeout-ms`` gives way, the run exits 1 and the next one takes what it left.

The two windows differ here (3 and 6 days), so that one read for the other shows; rows sit an
hour either side of each window, so that a window a day too long or too short shows.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import pytest

from bulk_recorder.infra.ids import uuid7
from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer.retention import Retention, remove_expired
from tests.conftest import run_cli, settings_env

pytestmark = [pytest.mark.postgres]

IDEMPOTENCY_DAYS, JOB_DAYS = 3, 6
RUN_BOUND_S = 30.0  # a run over a handful of rows ends long before; a spinning one never does
AGE = "now() - make_interval(days => $2, hours => $3)"
REQUEST = f"""
INSERT INTO transaction_requests (transaction_id, idempotency_key, request_hash, mode,
    status_code, client, created_at)
VALUES ($1::uuid, 'k' || $1::uuid::text, '\\x00', 'async', 202, 'c', {AGE})
"""
JOB = f"""
INSERT INTO credit_annotation_jobs (id, idempotency_key, request_hash, content_type, accepted,
    published, dead_lettered, recorded, created_at, completed_at, client)
VALUES ($1::uuid, 'key-' || $1::uuid::text, '\\x00', 'application/x-ndjson', 1, 1, 0, 1,
        {AGE}, now(), 'c')
"""
REPEAT = f"""
INSERT INTO credit_annotation_job_repeats (job_id, annotation_id, recorded_at)
VALUES ($1, gen_random_uuid(), {AGE})
"""


async def _row(conn: asyncpg.Connection, sql: str, days: int, hours: int) -> uuid.UUID:
    """A row of ``sql`` made ``days`` days and ``hours`` hours ago (hours may be negative)."""
    key = uuid.UUID(uuid7())
    await conn.execute(sql, key, days, hours)
    return key


async def _ids(conn: asyncpg.Connection, table: str, column: str) -> set[uuid.UUID]:
    return {r[0] for r in await conn.fetch(f"SELECT {column} FROM {table}")}


async def test_each_table_keeps_its_own_window_to_the_hour(
    make_settings: Any, database_url: str
) -> None:
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        request_in = await _row(conn, REQUEST, IDEMPOTENCY_DAYS, -1)
        await _row(conn, REQUEST, IDEMPOTENCY_DAYS, 1)
        job_in = await _row(conn, JOB, JOB_DAYS, -1)
        job_past_idempotency = await _row(conn, JOB, IDEMPOTENCY_DAYS, 1)
        await _row(conn, JOB, JOB_DAYS, 1)
        orphan_in = await _row(conn, REPEAT, JOB_DAYS, -1)
        await _row(conn, REPEAT, JOB_DAYS, 1)
        env = settings_env(
            make_settings(),
            API_IDEMPOTENCY_RETENTION_DAYS=str(IDEMPOTENCY_DAYS),
            API_JOB_RETENTION_DAYS=str(JOB_DAYS),
        )
        result = await asyncio.to_thread(run_cli, ["retention"], env)
        assert result.returncode == 0, result.stderr
        assert await _ids(conn, "transaction_requests", "transaction_id") == {request_in}
        assert await _ids(conn, "credit_annotation_jobs", "id") == {job_in, job_past_idempotency}
        assert await _ids(conn, "credit_annotation_job_repeats", "job_id") == {orphan_in}
    finally:
        await conn.close()


async def test_every_expired_job_goes_past_one_batch_and_past_a_held_one(
    database_url: str,
) -> None:
    """Five expired jobs, batches of two, the oldest held by another transaction: the four
    others go, the held one stays for the next run, and the run ends."""
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    holder = await asyncpg.connect(database_url)
    try:
        jobs = [await _row(conn, JOB, 40, -n) for n in range(5)]  # jobs[0] the oldest
        async with holder.transaction():
            await holder.execute(
                "SELECT 1 FROM credit_annotation_jobs WHERE id = $1 FOR UPDATE", jobs[0]
            )
            async with asyncio.timeout(RUN_BOUND_S):
                done = await remove_expired(conn, Retention(3, 3, batch_size=2))
        assert await _ids(conn, "credit_annotation_jobs", "id") == {jobs[0]}
        assert (done.credit_annotation_jobs, done.gave_way) == (4, 0)
    finally:
        await holder.close()
        await conn.close()


async def test_a_batch_held_past_the_lock_timeout_gives_way_exits_1_and_the_next_run_takes_it(
    make_settings: Any, database_url: str
) -> None:
    """A table lock another transaction holds (a DDL, a manual LOCK): the batch waits for it
    --lock-timeout-ms (the default, 50 ms), not seconds, gives way, and the run exits 1 (a
    CronJob retries it); once the lock is gone, the next run removes the rows."""
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        for hours in range(5):
            await _row(conn, REQUEST, 40, hours)
        env = settings_env(make_settings())
        tr = conn.transaction()
        await tr.start()
        try:
            await conn.execute("LOCK TABLE transaction_requests IN SHARE MODE")
            held = await asyncio.to_thread(run_cli, ["retention"], env, RUN_BOUND_S)
        finally:
            await tr.rollback()
        assert held.returncode == 1, (held.stdout, held.stderr)
        assert "removed 0 transaction_requests" in held.stdout
        assert "1 batch(es) gave way to a lock" in held.stdout
        free = await asyncio.to_thread(run_cli, ["retention"], env, RUN_BOUND_S)
        assert free.returncode == 0, (free.stdout, free.stderr)
        assert "removed 5 transaction_requests" in free.stdout
        assert await conn.fetchval("SELECT count(*) FROM transaction_requests") == 0
    finally:
        await conn.close()
