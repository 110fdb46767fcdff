"""``bulk-recorder retention`` (issue 28 item 4): the API's own tables get a window.

Rows past it go, rows inside it stay, a job not complete stays whatever its age, every batch
holds at most ``batch_size`` rows, and a writer of the API (a new request, or the retry of a
request being removed) never waits on the retention longer than 100 ms, the issue's bound.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import asyncpg
import pytest

from bulk_recorder.infra.ids import uuid7
from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer import retention
from bulk_recorder.producer.api.transactions import (
    _INSERT_REQUEST as INSERT_REQUEST,  # the API's own
)
from bulk_recorder.producer.retention import Removed, Retention, remove_expired
from tests.conftest import run_cli, settings_env, unique_name
from tests.rigs.lock_log_server import LockLogServer, LockWait

pytestmark = [pytest.mark.postgres]

WRITER_WAIT_BOUND_MS = 100.0  # the target: no writer waits on retention longer
JOB = """
INSERT INTO credit_annotation_jobs (id, idempotency_key, request_hash, content_type, accepted,
    published, dead_lettered, recorded, created_at, completed_at, client)
VALUES ($1, $2, '\\x00', 'application/x-ndjson', $3, $4, $5, $6,
        now() - make_interval(days => $7), $8, 'c')
"""
REPEAT = """
INSERT INTO credit_annotation_job_repeats (job_id, annotation_id, recorded_at)
VALUES ($1, $2, now() - make_interval(days => $3))
"""


async def _old_requests(conn: asyncpg.Connection, n: int, days: int) -> None:
    await conn.execute(
        "INSERT INTO transaction_requests (transaction_id, idempotency_key, request_hash, mode,"
        " status_code, client, created_at)"
        " SELECT gen_random_uuid(), 'k' || gen_random_uuid(), '\\x00', 'async', 202, 'c',"
        "        now() - make_interval(days => $2) + make_interval(secs => g)"
        " FROM generate_series(1, $1) AS g",
        n,
        days,
    )


async def _job(conn: asyncpg.Connection, days: int, **kw: Any) -> uuid.UUID:
    job = uuid.UUID(uuid7())
    accepted = kw.get("accepted", 2)
    await conn.execute(
        JOB,
        job,
        f"key-{job}",
        accepted,
        kw.get("published", accepted),
        kw.get("dead_lettered", 0),
        accepted if kw.get("completed", True) else None,
        days,
        None if not kw.get("completed", True) else await conn.fetchval("SELECT now()"),
    )
    for _ in range(kw.get("repeats", 0)):
        await conn.execute(REPEAT, job, uuid.UUID(uuid7()), days)
    return job


async def _ids(conn: asyncpg.Connection, table: str, column: str = "id") -> set[uuid.UUID]:
    return {r[0] for r in await conn.fetch(f"SELECT {column} FROM {table}")}


async def test_past_the_window_goes_inside_it_stays_and_unfinished_jobs_stay(
    database_url: str,
) -> None:
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        await _old_requests(conn, 30, days=31)
        await _old_requests(conn, 20, days=29)
        old_done = await _job(conn, 31, repeats=2)
        old_done_unread = await _job(conn, 31, completed=False, repeats=2)  # status never read
        old_publishing = await _job(conn, 31, completed=False, published=1)
        old_recording = await _job(conn, 31, completed=False, repeats=1)  # 1 of 2 recorded
        old_parked = await _job(conn, 31, dead_lettered=1)
        young = await _job(conn, 29, repeats=1)
        orphan_old, orphan_young = uuid.UUID(uuid7()), uuid.UUID(uuid7())
        await conn.execute(REPEAT, orphan_old, uuid.UUID(uuid7()), 31)
        await conn.execute(REPEAT, orphan_young, uuid.UUID(uuid7()), 29)

        done = await remove_expired(conn, Retention(idempotency_days=30, job_days=30))

        young_requests = await conn.fetchval(
            "SELECT count(*) FROM transaction_requests WHERE created_at > now() - interval '30 d'"
        )
        assert await conn.fetchval("SELECT count(*) FROM transaction_requests") == 20
        assert young_requests == 20
        kept = {old_publishing, old_recording, old_parked, young}
        assert await _ids(conn, "credit_annotation_jobs") == kept
        assert await _ids(conn, "credit_annotation_job_repeats", "job_id") == {
            old_recording,
            young,
            orphan_young,
        }
        assert (done.transaction_requests, done.credit_annotation_jobs) == (30, 2)
        assert done.credit_annotation_job_repeats == 5  # 2 + 2 of the removed jobs, 1 orphan
        assert done.jobs_completed == 1
        assert {old_done, old_done_unread}.isdisjoint(await _ids(conn, "credit_annotation_jobs"))
    finally:
        await conn.close()


async def test_every_batch_holds_at_most_batch_size_rows(database_url: str) -> None:
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        await _old_requests(conn, 2_500, days=40)
        for _ in range(3):
            await _job(conn, 40, repeats=400)  # 1,200 repeats in all
        done = await remove_expired(
            conn, Retention(idempotency_days=30, job_days=30, batch_size=1_000)
        )
        assert done.transaction_requests == 2_500
        assert done.credit_annotation_job_repeats == 1_200
        assert done.credit_annotation_jobs == 3
        assert done.largest_batch == 1_000
        assert done.batches >= 3 + 2 + 1
        assert await conn.fetchval("SELECT count(*) FROM transaction_requests") == 0
    finally:
        await conn.close()


async def _write_while(
    database_url: str, retention: asyncio.Task[Removed], *, retry_oldest: bool
) -> int:
    """Insert requests with the API's statement until the retention ends: how many."""
    conn = await asyncpg.connect(database_url)
    inserts = 0
    try:
        while not retention.done():
            if retry_oldest:  # the retry of the request the retention is removing now
                txid = await conn.fetchval(
                    "SELECT transaction_id FROM transaction_requests"
                    " WHERE idempotency_key LIKE 'k%' ORDER BY created_at LIMIT 1"
                )
                if txid is None:
                    break
            else:
                txid = uuid.UUID(uuid7())
            await conn.fetchval(INSERT_REQUEST, txid, None, b"\x01", "async", 202, "c")
            inserts += 1
    finally:
        await conn.close()
    return inserts


async def _run_with_writer(
    server: LockLogServer, database_url: str, policy: Retention, *, retry_oldest: bool
) -> tuple[Removed, int, list[LockWait]]:
    """The retention and a writer at once: what it removed, the writer's inserts, and every
    wait of another backend on the retention's one over 1 ms (the server's log)."""
    conn = await asyncpg.connect(database_url)
    try:
        pid = await conn.fetchval("SELECT pg_backend_pid()")
        retention = asyncio.create_task(remove_expired(conn, policy))
        inserts = await _write_while(database_url, retention, retry_oldest=retry_oldest)
        return await retention, inserts, server.log().waits_on({pid})
    finally:
        await conn.close()


async def _prefilled(database_url: str, requests: int) -> None:
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        await _old_requests(conn, requests, days=40)
    finally:
        await conn.close()


@pytest.mark.exclusive(reason="times lock waits in milliseconds")
async def test_a_new_request_never_waits_on_a_long_retention_batch(
    lock_log_server: LockLogServer,
) -> None:
    """A deliberately large batch holds its transaction open for long; new writers pass it
    without waiting on it at all (no wait over the server's 1 ms log threshold)."""
    url = lock_log_server.dsn(unique_name("brtest"))
    await _prefilled(url, 150_000)
    policy = Retention(idempotency_days=30, job_days=30, batch_size=150_000)
    done, inserts, waits = await _run_with_writer(lock_log_server, url, policy, retry_oldest=False)
    assert not waits, f"a new request waited on the retention: {waits}"
    assert done.largest_batch == 150_000
    assert inserts >= 10, "the writer hardly ran while the batch was open"


@pytest.mark.exclusive(reason="times lock waits in milliseconds")
async def test_a_retried_request_being_removed_waits_less_than_the_bound(
    lock_log_server: LockLogServer,
) -> None:
    """The writer retries the very request the current batch removes: it waits for that batch
    alone, which the batch bound keeps short (a run in one batch would hold it for the whole)."""
    url = lock_log_server.dsn(unique_name("brtest"))
    await _prefilled(url, 150_000)
    policy = Retention(idempotency_days=30, job_days=30)
    done, inserts, waits = await _run_with_writer(lock_log_server, url, policy, retry_oldest=True)
    assert all(w.ms is not None for w in waits), waits
    longest = max((w.ms or 0.0 for w in waits), default=0.0)
    assert longest < WRITER_WAIT_BOUND_MS, f"a retried request waited {longest} ms"
    assert inserts >= 10, "the writer hardly ran while the retention did"
    assert done.transaction_requests >= 140_000
    assert done.largest_batch <= 1_000


async def test_cli_removes_with_the_settings_windows(make_settings: Any, database_url: str) -> None:
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        await _old_requests(conn, 5, days=3)
        await _old_requests(conn, 5, days=1)
    finally:
        await conn.close()
    env = settings_env(make_settings(), API_IDEMPOTENCY_RETENTION_DAYS="2")
    result = await asyncio.to_thread(run_cli, ["retention", "--batch-size", "2"], env)
    assert result.returncode == 0, result.stderr
    assert "removed 5 transaction_requests" in result.stdout
    assert "(largest 2 rows)" in result.stdout


def _scans(plan: dict[str, Any], table: str) -> list[dict[str, Any]]:
    """Every node of ``plan`` that reads ``table``."""
    found = [plan] if plan.get("Relation Name") == table and "Scan" in plan["Node Type"] else []
    for child in plan.get("Plans", []):
        found += _scans(child, table)
    return found


async def _rows_read(conn: asyncpg.Connection, table: str, sql: str, *args: object) -> int:
    """Rows of ``table`` that one run of ``sql`` reads (rolled back), summed over its scans."""
    tr = conn.transaction()
    await tr.start()
    try:
        plan = json.loads(await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args))
    finally:
        await tr.rollback()
    scans = _scans(plan[0]["Plan"], table)
    assert scans, f"no scan of {table} in the plan"
    return sum(
        (int(s["Actual Rows"]) + int(s.get("Rows Removed by Filter", 0))) * int(s["Actual Loops"])
        for s in scans
    )


async def test_a_batch_reads_its_own_rows_never_the_whole_table(database_url: str) -> None:
    """A batch costs its own rows, not the table's: one that read the whole table (a hash join
    over a sequential scan, as the planner chose for ``IN (SELECT ...)``) would hold the rows it
    deletes, and a retry waiting on one of them, for longer the larger the table."""
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        await _old_requests(conn, 20_000, days=40)
        await conn.execute(  # repeats of no job (20,000), as old as the requests
            "INSERT INTO credit_annotation_job_repeats (job_id, annotation_id, recorded_at)"
            " SELECT gen_random_uuid(), gen_random_uuid(), now() - interval '40 days'"
            " FROM generate_series(1, 20000)"
        )
        await conn.execute("ANALYZE")
        cutoff = await conn.fetchval("SELECT now() - interval '30 days'")
        batch = 100
        repeats = "credit_annotation_job_repeats"
        reads = {
            "requests": await _rows_read(
                conn, "transaction_requests", retention._REQUESTS, cutoff, batch
            ),
            "orphan repeats": await _rows_read(
                conn, repeats, retention._ORPHAN_REPEATS, cutoff, batch
            ),
        }
        jobs = [await _job(conn, 40, repeats=1_000) for _ in range(2)]
        await conn.execute("ANALYZE")
        reads["job repeats"] = await _rows_read(conn, repeats, retention._JOB_REPEATS, jobs, batch)
        assert all(read <= 2 * batch for read in reads.values()), reads
    finally:
        await conn.close()


async def test_jobs_stuck_recording_do_not_keep_a_finished_job_from_completing(
    database_url: str,
) -> None:
    """Jobs that will never complete (a line the recorder dead-lettered: recorded < accepted)
    fill the first page of done-but-unmarked jobs, oldest first, run after run; a finished job
    behind them must still be completed and removed, as docs/producer.md promises."""
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        stuck = [await _job(conn, 40 + n, completed=False, repeats=1) for n in range(3)]
        finished_unread = await _job(conn, 35, completed=False, repeats=2)
        policy = Retention(idempotency_days=30, job_days=30, batch_size=2)
        done = await remove_expired(conn, policy)
        assert await _ids(conn, "credit_annotation_jobs") == set(stuck)
        assert finished_unread not in await _ids(conn, "credit_annotation_job_repeats", "job_id")
        assert (done.jobs_completed, done.credit_annotation_jobs) == (1, 1)
    finally:
        await conn.close()
