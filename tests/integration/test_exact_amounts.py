"""Amounts at the contract's limits are kept to the last digit, and the ledger still balances.

The contract allows 20 integer digits and 18 decimals (38 significant digits); Python's default
decimal context keeps 28. A debit negated or a delta summed in it is rounded: A was debited
-1234567890123456.123456789012000000 while B was credited ...012345678, and a transaction of
99999999999999999999.999999999999999999 had its debit rounded to -1E+20 and was dead-lettered
(22003 numeric field overflow). These tests send the extremes through every path that touches
an amount: the writer's one-statement, several-statement and mixed flushes, the recorder in
bulk and per-message mode, and the API's sync mode.
"""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from typing import Any

import asyncpg
import pytest

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.recorder.writer import PgWriter
from bulk_recorder.records import Record
from consumer.tools.generator import Generator
from tests.conftest import wait_for
from tests.integration.producer_support import (
    annotation_records,
    api_client,
    balances,
    expected_balances,
)
from tests.integration.test_balances import records

pytestmark = [pytest.mark.postgres]

LARGEST = "99999999999999999999.999999999999999999"  # 20 + 18 digits: numeric(38,18)'s limit
SMALLEST = "0.000000000000000001"
# Each is one transaction's amount; a tuple is its debit legs (summing to the amount exactly).
EXTREMES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("1234567890123456.123456789012345678", ("1234567890123456.123456789012345678",)),
    (LARGEST, (LARGEST,)),
    (SMALLEST, (SMALLEST,)),
    (
        LARGEST,
        ("50000000000000000000.000000000000000001", "49999999999999999999.999999999999999998"),
    ),
    ("12345678901234567890.123456789012345678", ("12345678901234567890.123456789012345678",)),
)


def extreme_transactions(seed: int) -> list[dict[str, Any]]:
    """One APPROVED transaction per extreme, each between accounts of its own (so no balance
    goes past numeric(38,18)): its debit legs from one account each, one credit to another."""
    gen = Generator.create(seed)
    out = []
    for amount, debits in EXTREMES:
        tx = gen.transaction()
        tx.update(status="APPROVED", amount=amount, asset_code="BRL")
        legs = [(str(uuid.uuid4()), "DEBIT", leg) for leg in debits]
        legs.append((str(uuid.uuid4()), "CREDIT", amount))
        tx["operations"] = [
            {
                "id": str(uuid.uuid4()),
                "account_id": account,
                "type": kind,
                "amount": leg,
                "asset_code": "BRL",
            }
            for account, kind, leg in legs
        ]
        out.append(tx)
    return out


async def assert_exact(conn: asyncpg.Connection, txs: list[dict[str, Any]]) -> None:
    """Every amount stored as sent, every balance exact, and each asset's balances sum to 0."""
    held = await balances(conn)
    for tx in txs:
        for op in tx["operations"]:
            want = Decimal(op["amount"])
            got = held[(op["account_id"], "BRL")]
            assert got == (want if op["type"] == "CREDIT" else want.copy_negate()), op
    assert held == expected_balances(txs)
    assert await conn.fetchval("SELECT sum(available) FROM balances") == 0
    stored = {
        r[0]: r[1] for r in await conn.fetch("SELECT id::text, amount::text FROM transactions")
    }
    assert stored == {tx["id"]: _padded(tx["amount"]) for tx in txs}
    ops = {r[0]: r[1] for r in await conn.fetch("SELECT id::text, amount::text FROM operations")}
    assert ops == {op["id"]: _padded(op["amount"]) for tx in txs for op in tx["operations"]}


def _padded(amount: str) -> str:
    """How numeric(38,18) prints an amount: 18 decimals."""
    return f"{Decimal(amount):.18f}"


@pytest.mark.parametrize(
    ("path", "rows_per_insert", "with_annotations"),
    [
        ("one statement", 1000, False),
        ("several statements", 2, False),
        ("both record types", 1000, True),
    ],
)
async def test_the_contracts_extreme_amounts_balance_to_the_last_digit_in_every_writer_path(
    database_url: str, db, path: str, rows_per_insert: int, with_annotations: bool
) -> None:
    await migrate(database_url)
    txs = extreme_transactions(seed=181)
    flush: list[Record] = [*records(txs)]
    if with_annotations:
        flush += annotation_records(seed=182, count=3, amount=LARGEST)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    try:
        writer = PgWriter(pool, max_rows_per_insert=rows_per_insert)
        result = await writer.write(flush)
        assert result.tables["transactions"].inserted == len(EXTREMES), path
        again = await writer.write(flush)  # a redelivered flush moves nothing
        assert again.tables["transactions"].inserted == 0
    finally:
        await pool.close()
    conn = await db()
    await assert_exact(conn, txs)
    if with_annotations:
        amounts = {r[0] for r in await conn.fetch("SELECT amount::text FROM credit_annotations")}
        assert amounts == {LARGEST}


@pytest.mark.rabbitmq
@pytest.mark.parametrize("bulk", [True, False], ids=["bulk", "per-message"])
async def test_the_recorder_keeps_the_contracts_extreme_amounts_exact(
    make_settings, start_recorder, broker, db, bulk: bool
) -> None:
    settings = make_settings(bulk_recorder_enabled=bulk, bulk_recorder_size=10)
    txs = extreme_transactions(seed=183)
    recorder = await start_recorder(settings)
    await broker.publish_many([(json.dumps(tx).encode(), "transaction") for tx in txs])
    await wait_for(
        lambda: recorder.value("bulk_recorder_messages_acked_total") == len(txs), timeout=30
    )
    await assert_exact(await db(), txs)


async def test_the_api_in_sync_mode_records_the_contracts_extreme_amounts_exactly(
    make_settings, db
) -> None:
    settings = make_settings(rabbitmq_transaction_async=False)
    txs = extreme_transactions(seed=184)
    async with api_client(settings) as (client, _):
        for tx in txs:
            response = await client.post("/v1/transactions", json=tx)
            assert response.status_code == 201, response.text
    await assert_exact(await db(), txs)
