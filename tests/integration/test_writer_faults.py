"""A flush is one database transaction on every path of the writer, and its balances stay exact
under a fault at its last statement.

The writer has several shapes of flush: one statement in autocommit (one record type, one
chunk), several statements in one transaction (more than a chunk of transactions, or of their
operations, or of annotations; or both record types). Each path here is stopped for real at its
last statement: a test session holds the lock that statement needs, and the statement is then
cancelled (57014, an outage). Nothing of the flush may stay committed. The retry, as a
redelivery would, must then record everything once, with every balance exact, and a third
write must change nothing. Balances exist before the flush, so a delta written over a balance
instead of added to it shows too.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from bulk_recorder.infra.errors import TransientDbError
from bulk_recorder.infra.migrate import migrate
from bulk_recorder.recorder.statements import INSERT_ANNOTATIONS, annotation_arguments
from bulk_recorder.recorder.writer import PgWriter
from bulk_recorder.records import CreditAnnotation, Record, Transaction
from tests.faults.pg_locks import close_gate, wait_for_blocked_by
from tests.integration.producer_support import annotation_records, balances, expected_balances
from tests.integration.test_balances import ledger, records

pytestmark = [pytest.mark.postgres]


# name: (transactions, annotations, where the last statement waits)
PATHS: dict[str, tuple[int, int, str]] = {
    # one statement in autocommit: the insert and its balances as CTEs
    "one statement": (300, 0, "a balance row"),
    # 1,500 transactions: two chunks, then the balances of both in one statement
    "several chunks of transactions": (1_500, 0, "a balance row"),
    # 600 transactions of two legs: one chunk of transactions, but 1,200 operations
    "transactions whose operations fill more than a chunk": (600, 0, "a balance row"),
    # 300 transactions then 300 annotations, in one transaction
    "both record types": (300, 300, "credit_annotations"),
    # 1,500 annotations: two chunks; the second waits on a row of its own
    "several chunks of annotations": (0, 1_500, "a row of the last chunk"),
}


@pytest.mark.parametrize("path", list(PATHS))
async def test_a_fault_at_a_flushs_last_statement_leaves_nothing_and_the_retry_is_exact(
    database_url: str, db, path: str
) -> None:
    count, anns, gate_on = PATHS[path]
    await migrate(database_url)
    everything = ledger(seed=180, count=count + 200, accounts=6)
    prior, txs = everything[:200], everything[200:]
    flush: list[Record] = [*records(txs), *annotation_records(seed=181, count=anns)]
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    conn, gate = await db(), await db()
    try:
        writer = PgWriter(pool)
        await writer.write(records(prior))  # balances exist before the flush
        before = await balances(conn)
        assert before == expected_balances(prior)

        await _hold_last_statement(gate, gate_on, flush)
        write = asyncio.create_task(writer.write(flush))
        waiter = await wait_for_blocked_by(conn, await _pid(gate))
        assert await conn.fetchval("SELECT pg_cancel_backend($1)", waiter)
        with pytest.raises(TransientDbError):
            await write
        await gate.execute("ROLLBACK")

        assert await _counts(conn) == (200, 400, 0), "a flush that failed left rows committed"
        assert await balances(conn) == before

        retry = await writer.write(flush)  # the redelivery
        assert retry.tables["transactions" if count else "credit_annotations"].inserted == (
            count or anns
        )
        again = await writer.write(flush)
        assert all(t.inserted == 0 for t in again.tables.values())
    finally:
        await pool.close()
    assert await _counts(conn) == (200 + count, 2 * (200 + count), anns)
    assert await balances(conn) == expected_balances(everything)


async def _hold_last_statement(gate: asyncpg.Connection, on: str, flush: list[Record]) -> None:
    """Begin a transaction on ``gate`` that holds what the flush's last statement needs.

    A balance row, not the table: every transactions statement names ``balances`` (a chunk of
    a many-chunk flush with an empty balance step too), so a table lock would stop the first
    statement. Only the statement that moves balances waits for a row of it."""
    if on == "a balance row":
        await gate.execute("BEGIN")
        locked = await gate.fetchval(
            "SELECT count(*) FROM (SELECT 1 FROM balances WHERE (account_id, asset_code) IN"
            " (SELECT * FROM unnest($1::uuid[], $2::text[])) FOR UPDATE) AS held",
            *_flush_keys(flush),
        )
        assert locked > 0, "the flush moves no balance that exists before it"
        return
    if on != "a row of the last chunk":
        await close_gate(gate, on)
        return
    # The writer sends annotations sorted by id, 1,000 a statement: the 1,001st id opens the
    # last chunk. An uncommitted row with that id makes its insert wait for this transaction.
    ids = sorted(r.id for r in flush if isinstance(r, CreditAnnotation))
    first_of_last = next(r for r in flush if r.id == ids[1_000])
    assert isinstance(first_of_last, CreditAnnotation)
    await gate.execute("BEGIN")
    await gate.fetch(INSERT_ANNOTATIONS, *annotation_arguments([first_of_last]))


def _flush_keys(flush: list[Record]) -> tuple[list[str], list[str]]:
    keys = sorted(
        {
            (op.account_id, op.asset_code)
            for r in flush
            if isinstance(r, Transaction) and r.status == "APPROVED"
            for op in r.operations
        }
    )
    return [k[0] for k in keys], [k[1] for k in keys]


async def _pid(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT pg_backend_pid()"))


async def _counts(conn: asyncpg.Connection) -> tuple[Any, ...]:
    row = await conn.fetchrow(
        "SELECT (SELECT count(*) FROM transactions), (SELECT count(*) FROM operations),"
        " (SELECT count(*) FROM credit_annotations)"
    )
    assert row is not None
    return tuple(row)
