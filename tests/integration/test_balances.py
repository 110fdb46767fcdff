"""Exactly-once effects: balances equal the sum of the unique APPROVED transactions, whatever
duplicates, redeliveries, concurrent writers or recorder kills happen on the way."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import asyncpg
import pytest

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer.outbox import enqueue, notify
from bulk_recorder.recorder.writer import PgWriter
from bulk_recorder.records import Record, Transaction, decode
from consumer.tools.generator import Generator
from tests.conftest import settings_env, wait_for
from tests.faults.pg_locks import (
    backend_pid,
    close_gate,
    other_backends,
    wait_for_backends_gone,
    wait_for_relation_waiter,
)
from tests.integration.producer_support import (
    api_client,
    balances,
    expected_balances,
    running_relay,
)

pytestmark = [pytest.mark.postgres, pytest.mark.ledger_layouts]


def ledger(seed: int, count: int, accounts: int = 8) -> list[dict[str, Any]]:
    """Transactions over a few hot accounts, two assets, all three statuses; one in ten of 34
    significant digits (16 integer and 18 decimal), past the 28 that Python's default decimal
    context keeps, and still far from numeric(38,18)'s limit after thousands on one account."""
    gen = Generator.create(seed)
    gen.accounts = gen.accounts[:accounts]
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        tx = gen.transaction()
        roll = rng.random()
        tx["status"] = "APPROVED" if roll < 0.7 else ("PENDING" if roll < 0.85 else "CANCELED")
        if rng.random() < 0.1:
            wide = f"{rng.randrange(10**15, 10**16)}.{rng.randrange(10**17, 10**18)}"
            tx["amount"] = wide
            for op in tx["operations"]:
                op["amount"] = wide
        if rng.random() < 0.3:
            tx["asset_code"] = "USD"
            for op in tx["operations"]:
                op["asset_code"] = "USD"
        out.append(tx)
    return out


def ops_out_of_order(transactions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same transactions with their operation ids dealt back in reverse: the transaction
    that came first gets the operations' last ids."""
    ids = [op["id"] for tx in transactions for op in tx["operations"]]
    ids.reverse()
    for tx in transactions:
        for op in tx["operations"]:
            op["id"] = ids.pop(0)
    return transactions


def records(transactions: list[dict[str, Any]]) -> list[Transaction]:
    out = []
    for tx in transactions:
        record = decode(json.dumps(tx).encode(), "transaction")
        assert isinstance(record, Transaction)
        out.append(record)
    return out


async def test_writer_moves_balances_once_per_new_approved_transaction(database_url) -> None:
    await migrate(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=8)
    try:
        writer = PgWriter(pool)
        txs = ledger(1, 300)
        batch = records(txs)
        first = await writer.write(batch + batch[:50])  # repeats inside one flush
        assert first.tables["transactions"].inserted == 300
        assert first.tables["transactions"].ignored == 50
        again = await writer.write(batch)  # a whole redelivered flush
        assert again.tables["transactions"].inserted == 0
        assert "balances" not in again.tables  # no effect at all for old transactions
        async with pool.acquire() as conn:
            assert await balances(conn) == expected_balances(txs)
            assert {r[0] for r in await conn.fetch("SELECT DISTINCT asset_code FROM balances")} == {
                "BRL",
                "USD",
            }
    finally:
        await pool.close()


class RecordingPool:
    """Looks like a pool to PgWriter: lends one real connection and records every statement."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[RecordingPool]:
        yield self

    def transaction(self) -> Any:
        return self.conn.transaction()

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        self.statements.append((query, args))
        return await self.conn.fetch(query, *args)

    async def execute(self, query: str, *args: Any) -> str:
        self.statements.append((query, args))
        return await self.conn.execute(query, *args)

    def keys(self, table: str, columns: int = 1) -> list[list[Any]]:
        """The keys sent to ``INSERT INTO table``, a list per statement, in order: the first
        ``columns`` parameters after the INSERT (a statement may hold several INSERTs as
        data-modifying CTEs; a column goes as an array or as one comma-joined string)."""
        out: list[list[Any]] = []
        for query, args in self.statements:
            at = query.find(f"INSERT INTO {table} ")
            if at < 0:
                continue
            first = int(re.findall(r"\$(\d+)", query[at:])[0]) - 1
            arrays = [_column(arg) for arg in args[first : first + columns]]
            out.append(list(zip(*arrays, strict=True)) if columns > 1 else arrays[0])
        return out


def _column(arg: Any) -> list[Any]:
    return (arg.split(",") if arg else []) if isinstance(arg, str) else list(arg)


async def test_every_write_sends_its_keys_in_sorted_order(database_url) -> None:
    """Rows are locked in the order of the arrays sent, so ids and balance keys go out sorted
    across the whole flush (a flush of several chunks is one DB transaction, and its balances
    are applied at its end), and operation ids within each statement (they are new rows of new
    transactions, which no other writer inserts), whatever order the batch came in: what keeps
    concurrent writers and replicas out of a deadlock, checked deterministically. A flush of
    one chunk sends its balance keys sorted in its one statement."""
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        pool = RecordingPool(conn)
        writer = PgWriter(cast(asyncpg.Pool, pool), max_rows_per_insert=7)  # many chunks
        gen = Generator.create(6)
        annotations = [
            decode(json.dumps(gen.credit_annotation()).encode(), "credit_annotation")
            for _ in range(30)
        ]
        # Operation ids in another order than their transactions' (the generator's are
        # time-ordered, so sorting by either id gave one order and a writer sorting operations
        # by their transaction's id passed)
        batch: list[Record] = [*records(ops_out_of_order(ledger(6, 60, accounts=6))), *annotations]
        random.Random(6).shuffle(batch)
        await writer.write(batch)
    finally:
        await conn.close()
    for table, columns in (
        ("transactions", 1),
        ("operations", 1),
        ("balances", 2),
        ("credit_annotations", 1),
    ):
        statements = [sent for sent in pool.keys(table, columns) if sent]
        assert len(statements) > 1, table
        for sent in statements:
            assert sent == sorted(sent), f"{table}: keys not sent in sorted order"
        if table != "operations":
            flush = [key for sent in statements for key in sent]
            assert flush == sorted(flush), f"{table}: chunks not sent in key order"
    assert len([k for sent in pool.keys("transactions") for k in sent]) == 60

    conn = await asyncpg.connect(database_url)
    try:
        one = RecordingPool(conn)
        txs = records(ledger(7, 40, accounts=6))
        random.Random(7).shuffle(txs)
        await PgWriter(cast(asyncpg.Pool, one)).write(txs)  # one chunk, one statement
    finally:
        await conn.close()
    [keys] = one.keys("balances", 2)
    assert len(keys) > 1
    assert keys == sorted(keys), "balances: keys of a one-chunk flush not sent in sorted order"


async def test_concurrent_writers_on_hot_accounts_neither_deadlock_nor_drift(database_url) -> None:
    """Overlapping flushes on 4 accounts: keys applied in one order, every flush commits."""
    await migrate(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=8, max_size=8)
    try:
        writer = PgWriter(pool)
        txs = ledger(2, 1600, accounts=4)
        flushes = [records(txs[i : i + 100]) for i in range(0, 1600, 100)]
        # Every flush twice, concurrently with the others: duplicates race their originals.
        results = await asyncio.gather(*(writer.write(f) for f in flushes + flushes[::-1]))
        inserted = sum(r.tables["transactions"].inserted for r in results)
        assert inserted == 1600
        async with pool.acquire() as conn:
            assert await balances(conn) == expected_balances(txs)
    finally:
        await pool.close()


async def test_duplicates_and_two_recorders_give_exact_balances(
    make_settings, start_recorder, broker, db
) -> None:
    settings = make_settings(bulk_recorder_size=50, rabbitmq_numbers_of_workers=3)
    txs = ledger(3, 1500)
    rng = random.Random(3)
    messages = [(json.dumps(tx).encode(), "transaction") for tx in txs]
    messages += [messages[i] for i in rng.sample(range(1500), 500)]  # published twice
    rng.shuffle(messages)
    one = await start_recorder(settings)
    two = await start_recorder(settings)
    await broker.publish_many(messages)

    def acked() -> float:
        return float(
            one.value("bulk_recorder_messages_acked_total")
            + two.value("bulk_recorder_messages_acked_total")
        )

    await wait_for(lambda: acked() == 2000, timeout=90)
    conn = await db()
    assert await conn.fetchval("SELECT count(*) FROM transactions") == 1500
    assert await conn.fetchval("SELECT count(*) FROM operations") == 3000
    assert await balances(conn) == expected_balances(txs)
    ignored = sum(
        r.value("bulk_recorder_rows_ignored_total", table="transactions") for r in (one, two)
    )
    assert ignored == 500


async def test_recorder_killed_mid_run_redeliveries_do_not_move_balances_twice(
    make_settings, start_recorder, broker, db, tmp_path: Path
) -> None:
    """SIGKILL with flushes in flight: the first half recorded, the second held at a lock on
    ``balances`` (so the kill lands mid-run however fast the machine), then redelivered.

    A held flush statement outlives the killed recorder: once the lock is free the server may
    run and commit it (its backend notices the dead client only afterwards). Those rows were
    never acked, so they come back too; read once the killed recorder's backends are gone,
    they must be whole, and their redelivery must change nothing."""
    settings = make_settings(bulk_recorder_size=100)
    count = 4_000
    txs = ledger(4, count)
    bodies = [(json.dumps(tx).encode(), "transaction") for tx in txs]
    log_path = tmp_path / "recorder.log"
    conn = gate = None
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(  # noqa: ASYNC220 - killed below, waited in a thread
            [sys.executable, "-m", "consumer"],
            env=settings_env(settings),
            stdout=log_file,
            stderr=log_file,
        )
        try:
            await broker.publish_many(bodies[: count // 2])
            await wait_for(lambda: _database_exists(settings.database_url), timeout=30)
            conn, gate = await db(), await db()

            async def first_half() -> bool:
                return bool(await conn.fetchval("SELECT count(*) FROM transactions") >= count // 2)

            await wait_for(first_half, timeout=60)
            await close_gate(gate, "balances")
            await broker.publish_many(bodies[count // 2 :])
            await wait_for_relation_waiter(conn, "balances", exclude=[await backend_pid(gate)])
            proc.send_signal(signal.SIGKILL)
            assert await asyncio.to_thread(proc.wait, 30) == -signal.SIGKILL
            orphans = await other_backends(conn, exclude=[await backend_pid(gate)])
            await gate.execute("ROLLBACK")
            await wait_for_backends_gone(conn, orphans)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert conn is not None
    stored = {str(r[0]) for r in await conn.fetch("SELECT id FROM transactions")}
    assert {tx["id"] for tx in txs[: count // 2]} <= stored < {tx["id"] for tx in txs}
    assert await balances(conn) == expected_balances([tx for tx in txs if tx["id"] in stored])
    committed_unacked = len(stored) - count // 2  # by the statements that outlived the kill
    recorder = await start_recorder(settings)

    async def done() -> bool:
        return bool(await conn.fetchval("SELECT count(*) FROM transactions") == count)

    await wait_for(done, timeout=90)
    await wait_for(lambda: _queue_empty(broker), timeout=30)
    assert await balances(conn) == expected_balances(txs)
    assert await conn.fetchval("SELECT count(*) FROM operations") == 2 * count
    ignored = recorder.value("bulk_recorder_rows_ignored_total", table="transactions")
    assert ignored >= committed_unacked  # they came back, and were absorbed
    assert recorder.value("bulk_recorder_messages_dead_lettered_total", reason="validation") == 0


async def _database_exists(dsn: str) -> bool:
    try:
        conn = await asyncpg.connect(dsn)
    except (OSError, asyncpg.PostgresError):
        return False
    try:
        return bool(await conn.fetchval("SELECT to_regclass('balances') IS NOT NULL"))
    finally:
        await conn.close()


async def _queue_empty(broker) -> bool:
    return bool(await broker.ready_count(broker.topology.queue) == 0)


async def test_api_repeats_and_republished_outbox_rows_move_balances_once(
    make_settings, start_recorder, db
) -> None:
    """Async path: every transaction POSTed twice, then every outbox row published again (as
    after a relay crash between the confirms and the delete)."""
    settings = make_settings(bulk_recorder_size=20)
    txs = ledger(5, 120)
    async with api_client(settings) as (client, _):
        for tx in txs:
            for _ in range(2):
                response = await client.post("/v1/transactions", json=tx)
                assert response.status_code == 202
    conn = await db()
    bodies = await conn.fetch("SELECT record_type, record_id::text, body FROM outbox")
    assert len(bodies) == 120
    recorder = await start_recorder(settings)

    def received() -> float:
        return float(recorder.value("bulk_recorder_messages_acked_total"))

    async with running_relay(settings) as relay:
        await wait_for(lambda: relay.published == 120, timeout=30)
        await wait_for(lambda: received() == 120, timeout=30)
        balances_once = await balances(conn)
        async with conn.transaction():
            for row in bodies:
                await enqueue(conn, row["record_type"], row["record_id"], bytes(row["body"]))
            await notify(conn)
        await wait_for(lambda: relay.published == 240, timeout=30)
        await wait_for(lambda: received() == 240, timeout=30)
    assert await conn.fetchval("SELECT count(*) FROM transactions") == 120
    assert balances_once == expected_balances(txs)
    assert await balances(conn) == balances_once
    assert recorder.value("bulk_recorder_rows_ignored_total", table="transactions") == 120


async def test_balances_hold_any_sum_of_allowed_amounts(database_url) -> None:
    """Every allowed amount moves balances: three of the largest, 99999999999999999999.99...9
    (20 and 18 digits), and two of 60000000000000000000.00 on the same two accounts, once
    written alone and then several in one flush, pass 10^20 and land to the last digit."""
    await migrate(database_url)
    gen = Generator.create(71)
    debit, credit = gen.accounts[:2]
    largest = "99999999999999999999.999999999999999999"
    amounts = [largest, "60000000000000000000.00", largest, "60000000000000000000.00", largest]
    txs = []
    for amount in amounts:
        tx = gen.transaction()
        tx["status"] = "APPROVED"
        tx["amount"] = amount
        for op in tx["operations"]:
            op["amount"] = amount
            op["account_id"] = debit if op["type"] == "DEBIT" else credit
        txs.append(tx)
    batch = records(txs)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        writer = PgWriter(pool)
        await writer.write(batch[:1])
        await writer.write(batch[1:2])
        await writer.write(batch[2:])
        async with pool.acquire() as conn:
            assert await balances(conn) == expected_balances(txs)
            rows = await conn.fetch(
                "SELECT account_id::text, available::text FROM balances ORDER BY available"
            )
        assert [tuple(row) for row in rows] == [
            (debit, "-419999999999999999999.999999999999999997"),
            (credit, "419999999999999999999.999999999999999997"),
        ]
    finally:
        await pool.close()
