"""The relay's claim under churn (issue 28, item 5), against the real PostgreSQL and RabbitMQ.

Every published row is deleted, and while a long transaction holds back VACUUM the deleted
rows stay in the pending index's way. The claim used to look for the first available row from
the start of that index: after 20,000 published rows under such a transaction, one such walk
reads 8 times the buffers a claim reads on a fresh outbox (5,066 against 606), and it grows
with every row (benchmarks/RESULTS.md, "The outbox under churn"). A relay now claims from
where its last claim started, and rescans from the start now and then, so that a row committed
late below that point (a long job's transaction, while later requests commit) is still
published.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer.outbox import enqueue, notify
from bulk_recorder.producer.relay import RelayConfig
from bulk_recorder.producer.relay_batch import _DELETE_SENT
from bulk_recorder.producer.relay_claim import CLAIM_WINDOW, ClaimCursor, claim
from consumer.tools.generator import Generator
from tests.conftest import Broker, wait_for
from tests.integration.producer_support import running_relay

PUBLISHED = 20_000  # rows published (deleted) while a transaction holds back VACUUM
BACKLOG = 5_000
BATCH = 500
WINDOW = CLAIM_WINDOW * BATCH
MS = timedelta(milliseconds=1)


class Explaining:
    """A connection whose ``fetch`` first records the buffers EXPLAIN (ANALYZE, BUFFERS)
    says the statement touched (the rows it locks are this transaction's own after that)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.buffers: list[int] = []

    async def execute(self, sql: str, *args: Any) -> str:
        return str(await self.conn.execute(sql, *args))

    async def fetch(self, sql: str, *args: Any) -> Sequence[asyncpg.Record]:
        raw = await self.conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args)
        plan = json.loads(raw)[0]["Plan"]  # the top node's counts include its children's
        self.buffers.append(int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"]))
        return list(await self.conn.fetch(sql, *args))


async def _fill(conn: asyncpg.Connection, rows: int, body_bytes: int = 1500) -> None:
    await conn.execute(
        "INSERT INTO outbox (record_type, record_id, body)"
        " SELECT 'credit_annotation', gen_random_uuid(), convert_to(repeat('x', $2), 'UTF8')"
        " FROM generate_series(1, $1)",
        rows,
        body_bytes,
    )


async def _claim_buffers(conn: asyncpg.Connection, cursor: ClaimCursor) -> tuple[int, int]:
    """(rows, buffers) of one claim through the relay's own ``claim``, rolled back."""
    explaining = Explaining(conn)
    async with conn.transaction():
        rows = await claim(explaining, cursor, BATCH, WINDOW)  # type: ignore[arg-type]
    return len(rows), explaining.buffers[0]


@pytest.mark.postgres
async def test_a_claim_after_churn_held_by_a_long_transaction_reads_what_a_fresh_one_does(
    database_url: str, db
) -> None:
    await migrate(database_url)
    conn, holder = await db(), await db()
    cursor = ClaimCursor(clock=lambda: 0.0)  # time stands still: one rescan, at the start
    await _fill(conn, BATCH)
    fresh = await _claim_buffers(conn, cursor)
    await conn.execute("DELETE FROM outbox")
    await _fill(conn, PUBLISHED)
    # A snapshot older than every delete below: no published row can be vacuumed away.
    await holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    await holder.fetchval("SELECT count(*) FROM outbox")
    published = 0
    while True:
        async with conn.transaction():
            rows = await claim(conn, cursor, BATCH, WINDOW)
            await conn.execute(_DELETE_SENT, [r["id"] for r in rows])
        if not rows:
            break
        published += len(rows)
    assert published == PUBLISHED
    await _fill(conn, BACKLOG)

    claimed, buffers = await _claim_buffers(conn, cursor)
    assert claimed == BATCH
    assert buffers <= 2 * fresh[1], (
        f"a claim read {buffers:,} buffers past {PUBLISHED:,} deleted rows"
        f" (a fresh outbox: {fresh[1]:,})"
    )
    # The setting is what the test says: from the start, the deleted rows are in the way.
    from_the_start = ClaimCursor(clock=lambda: 0.0)
    _, rescan = await _claim_buffers(conn, from_the_start)
    assert rescan > 5 * fresh[1], (fresh, buffers, rescan)
    await holder.execute("ROLLBACK")


@pytest.mark.postgres
@pytest.mark.rabbitmq
async def test_a_row_committed_late_below_the_cursor_is_published(
    make_settings, database_url: str, broker: Broker, db
) -> None:
    """A 300,000-line job's transaction runs for seconds while later requests commit: its
    rows have lower ids than rows the relay has already published."""
    settings = make_settings()
    await migrate(database_url)
    conn, late = await db(), await db()
    gen = Generator.create(283)
    config = RelayConfig(batch_size=10, lanes=1, poll_interval_s=0.2)
    async with running_relay(settings, config) as running:
        cursor = running.relay._batches.cursor
        early = gen.transaction()
        await late.execute("BEGIN")  # takes its id now, commits after the others
        late_id = await enqueue(late, "transaction", early["id"], json.dumps(early).encode())
        records = [gen.transaction() for _ in range(3 * config.batch_size)]
        async with conn.transaction():
            for record in records:
                await enqueue(conn, "transaction", record["id"], json.dumps(record).encode())
            await notify(conn)

        async def none_visible_left() -> bool:
            return int(await conn.fetchval("SELECT count(*) FROM outbox")) == 0

        await wait_for(none_visible_left, timeout=30)  # the late row is not visible yet
        assert cursor.floor > late_id  # the relay claims from past the late row now
        await notify(late)
        await late.execute("COMMIT")

        await wait_for(none_visible_left, timeout=30)
    delivered = {json.loads(m.body)["id"] for m in await broker.drain(broker.topology.queue)}
    assert delivered == {early["id"], *(r["id"] for r in records)}


@pytest.mark.postgres
async def test_a_claim_walks_the_index_whatever_the_planner_makes_of_the_statistics(
    database_url: str, db
) -> None:
    """Statistics taken while the outbox was empty, with its heap still large, made the first
    row's lookup a scan of every pending row: an aggregate over a bitmap or sequential scan,
    15,000 pages a claim in the benchmark. Here a costly random page stands in for those
    statistics (it made the same lookup a sequential scan of the whole outbox)."""
    await migrate(database_url)
    conn = await db()
    await conn.execute("SET random_page_cost = 1000")
    await _fill(conn, BATCH, 300)
    fresh = await _claim_buffers(conn, ClaimCursor(clock=lambda: 0.0))
    await _fill(conn, 30_000, 300)
    # Empty but for one parked row at the end of the heap: VACUUM cannot cut the table short.
    await conn.execute(
        "UPDATE outbox SET parked_at = now() WHERE id = (SELECT max(id) FROM outbox)"
    )
    await conn.execute("DELETE FROM outbox WHERE parked_at IS NULL")
    await conn.execute("VACUUM ANALYZE outbox")
    await _fill(conn, 30_000, 300)

    claimed, buffers = await _claim_buffers(conn, ClaimCursor(clock=lambda: 0.0))
    assert claimed == BATCH
    assert buffers <= 2 * fresh[1], f"a claim read {buffers:,} buffers (fresh: {fresh[1]:,})"


@pytest.mark.postgres
async def test_the_statements_after_the_claim_plan_with_every_scan(database_url: str, db) -> None:
    """Index scans only is for the claim alone: with sequential scans off for the whole batch
    transaction, the relay-activity stamp took 100-400 ms a batch (it walked its one row's dead
    versions by index)."""
    await migrate(database_url)
    conn = await db()
    await _fill(conn, 10, 300)
    async with conn.transaction():
        assert len(await claim(conn, ClaimCursor(), BATCH, WINDOW)) == 10
        settings = await conn.fetchrow(
            "SELECT current_setting('enable_seqscan') AS seq,"
            " current_setting('enable_bitmapscan') AS bitmap"
        )
    assert settings is not None
    assert (settings["seq"], settings["bitmap"]) == ("on", "on")


@pytest.mark.postgres
async def test_the_outbox_is_vacuumed_after_a_fixed_number_of_dead_rows_at_full_speed(
    database_url: str, db
) -> None:
    """Migration 010: the outbox's own autovacuum settings, whatever the server's."""
    await migrate(database_url)
    conn = await db()
    options = await conn.fetchval("SELECT reloptions FROM pg_class WHERE oid = 'outbox'::regclass")
    assert sorted(options) == [
        "autovacuum_vacuum_cost_delay=0",
        "autovacuum_vacuum_scale_factor=0",
        "autovacuum_vacuum_threshold=10000",
    ]


async def _refuse_for_now(conn: asyncpg.Connection, row_id: int, due_in: timedelta) -> None:
    """Row ``row_id`` refused three times by the broker, due again ``due_in`` from now()."""
    await conn.execute(
        "UPDATE outbox SET attempts = 3, last_error = 'refused',"
        " available_at = now() + $2 WHERE id = $1",
        row_id,
        due_in,
    )


@pytest.mark.postgres
async def test_a_row_refused_for_now_is_not_claimed_before_its_retry_time(
    database_url: str, db
) -> None:
    """Between two rows that are due, a refused row due in an hour is passed over: claimed
    with them, a poison row would burn its attempts in seconds instead of backing off."""
    await migrate(database_url)
    conn = await db()
    await _fill(conn, 3, 10)
    first, refused, last = [r["id"] for r in await conn.fetch("SELECT id FROM outbox ORDER BY id")]
    await _refuse_for_now(conn, refused, timedelta(hours=1))
    async with conn.transaction():
        claimed = [r["id"] for r in await claim(conn, ClaimCursor(), BATCH, WINDOW)]
    assert claimed == [first, last]


@pytest.mark.postgres
@pytest.mark.parametrize(
    ("due_in", "claimed_now"),
    [(-MS, True), (0 * MS, True), (MS, False)],
    ids=["due-1-ms-ago", "due-now", "due-in-1-ms"],
)
async def test_a_refused_row_is_claimed_from_the_moment_its_retry_time_comes(
    database_url: str, db, due_in: timedelta, claimed_now: bool
) -> None:
    """The boundary on the database's clock: now() is the transaction's start, so a row made
    due in the claim's own transaction is due exactly then (or a millisecond either side)."""
    await migrate(database_url)
    conn = await db()
    await _fill(conn, 3, 10)
    first, refused, last = [r["id"] for r in await conn.fetch("SELECT id FROM outbox ORDER BY id")]
    async with conn.transaction():
        await _refuse_for_now(conn, refused, due_in)
        claimed = [r["id"] for r in await claim(conn, ClaimCursor(), BATCH, WINDOW)]
    assert claimed == ([first, refused, last] if claimed_now else [first, last])
