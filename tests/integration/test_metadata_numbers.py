"""A metadata number is accepted exactly when PostgreSQL's jsonb stores it, whatever its spelling.

PostgreSQL 15's numeric holds up to 131,072 digits before the decimal point and 16,383 after
(the scale as written: trailing zeros count, an exponent moves the point). The values here sit
on each side of each limit, written plainly and with an exponent; each one is put to the real
server (``SELECT $1::jsonb``) and through ``decode`` and the writer: decode accepts exactly
what the server stores, and what it accepts lands.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import asyncpg
import pytest

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.recorder.writer import PgWriter
from bulk_recorder.records import RecordError, Transaction, decode
from consumer.tools.generator import Generator
from tests.integration.producer_support import api_client

pytestmark = [pytest.mark.postgres]

# (number as written, whether PostgreSQL 15 stores it): the expectation is checked against the
# server too, so a server with other limits fails here first.
BOUNDARIES: tuple[tuple[str, bool], ...] = (
    ("0." + "1" * 16_383, True),  # 16,383 digits after the point
    ("0." + "1" * 16_384, False),
    ("-0." + "1" * 16_382 + "0", True),  # a trailing zero is a digit PostgreSQL keeps
    ("0." + "1" * 16_383 + "0", False),
    ("1e-16383", True),
    ("1e-16384", False),
    ("0.0e-16382", True),  # zero, scale 16,383
    ("0.0e-16383", False),
    ("10e-16384", False),  # the value 1e-16383, written with a scale of 16,384
    ("1.5e-16382", True),
    ("1e131071", True),  # 131,072 digits before the point
    ("1e131072", False),
    ("-9.9e131071", True),
    ("99E+131070", True),
    ("99E+131071", False),
    ("0e200000", True),  # zero has no digits before the point
    ("1e1001", True),  # once refused ("exponent beyond 1000") though stored
    ("1" + "0" * 1001, True),  # the same number written plainly
    ("1e-1001", True),
    ("0." + "0" * 1000 + "1", True),
)


def _body(number: str, seed: int = 27) -> bytes:
    raw = Generator.create(seed=seed).transaction()
    for op in raw["operations"]:
        op["amount"] = raw["amount"]
    raw["metadata"] = "__M__"
    return json.dumps(raw).encode().replace(b'"__M__"', b'{"x": %s}' % number.encode())


async def _server_stores(conn: asyncpg.Connection, number: str) -> bool:
    try:
        await conn.fetchval("SELECT $1::jsonb", '{"x": ' + number + "}")
    except asyncpg.NumericValueOutOfRangeError:
        return False
    return True


REFUSED = "metadata: number out of range (at most 131072 digits before the point and 16383 after)"


def _decoded(number: str) -> Transaction | str:
    """The record, or the reason it was refused."""
    try:
        record = decode(_body(number), "transaction")
    except RecordError as exc:
        return exc.reason
    assert isinstance(record, Transaction)
    return record


async def test_metadata_number_accepted_exactly_when_postgresql_stores_it(
    database_url: str,
) -> None:
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        stores = {number: await _server_stores(conn, number) for number, _ in BOUNDARIES}
        assert stores == dict(BOUNDARIES)  # the limits are the server's
        accepted = {number: _decoded(number) for number, _ in BOUNDARIES}
        wrong = {
            number[:24]: (record if isinstance(record, str) else "accepted", stores[number])
            for number, record in accepted.items()
            if (record if isinstance(record, str) else None)
            != (None if stores[number] else REFUSED)
        }
        assert wrong == {}, "(what decode said, whether PostgreSQL stores it)"
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
        try:
            for number, record in accepted.items():
                if isinstance(record, Transaction):
                    await PgWriter(pool).write([record])
                    stored = await conn.fetchval(
                        "SELECT metadata->>'x' FROM transactions WHERE id = $1", record.id
                    )
                    assert Decimal(stored) == Decimal(number)
                    await conn.execute("TRUNCATE transactions CASCADE")
        finally:
            await pool.close()
    finally:
        await conn.close()


async def test_the_api_answers_each_metadata_number_as_postgresql_stores_it(
    make_settings: Any, db: Any
) -> None:
    """Through a real API (sync mode: the 201 is the row written): every boundary number is
    201 and stored, or 422 with the digits' reason, exactly as the server stores it."""
    settings = make_settings(rabbitmq_transaction_async=False)
    answers = {}
    async with api_client(settings) as (client, _):
        for n, (number, _) in enumerate(BOUNDARIES):
            response = await client.post(
                "/v1/transactions",
                content=_body(number, seed=n),
                headers={"content-type": "application/json"},
            )
            answers[number] = (response.status_code, response.json().get("detail"))
    expected = {number: (201, None) if stores else (422, REFUSED) for number, stores in BOUNDARIES}
    assert {k[:24]: v for k, v in answers.items()} == {k[:24]: v for k, v in expected.items()}
    conn = await db()
    stored = [
        Decimal(text)
        for text in await conn.fetch("SELECT metadata->>'x' FROM transactions")
        for text in text
    ]
    assert sorted(stored) == sorted(Decimal(number) for number, stores in BOUNDARIES if stores)
