"""Every value the writer sends comes back from PostgreSQL exactly as validated.

The writer sends most columns as one comma-joined string per column (see
bulk_recorder/recorder/statements.py); these are the values at its edges: absent created_at and
job_id (alone in a chunk, where the joined string is empty, and mixed with present ones),
microseconds, the first year, an amount whose str() is in exponent notation, free text with
commas, quotes, braces and non-ASCII letters, metadata absent and present.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import asyncpg
import pytest

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.recorder.writer import PgWriter
from bulk_recorder.records import CreditAnnotation, Record, Transaction, decode
from consumer.tools.generator import Generator

pytestmark = [pytest.mark.postgres]

TRICKY_TEXT = 'a, "b", {c}, \\d, ção 日本'


def transaction(gen: Generator, **changes: Any) -> Transaction:
    raw = gen.transaction()
    raw.update(changes)
    for op in raw["operations"]:
        op["amount"] = raw["amount"]
    record = decode(json.dumps(raw).encode(), "transaction")
    assert isinstance(record, Transaction)
    return record


def annotation(gen: Generator, **changes: Any) -> CreditAnnotation:
    raw = gen.credit_annotation()
    raw.update(changes)
    record = decode(
        json.dumps({k: v for k, v in raw.items() if v is not None}).encode(), "credit_annotation"
    )
    assert isinstance(record, CreditAnnotation)
    return record


async def write_and_read(database_url: str, chunks: list[list[Record]]) -> list[asyncpg.Record]:
    await migrate(database_url)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    try:
        writer = PgWriter(pool)
        for chunk in chunks:
            await writer.write(chunk)
        async with pool.acquire() as conn:
            return [
                *await conn.fetch(
                    "SELECT id::text, description, amount, created_at, metadata::text"
                    " FROM transactions ORDER BY id"
                ),
                *await conn.fetch(
                    "SELECT id::text, job_id::text, creditor, amount, occurred_on, reason"
                    " FROM credit_annotations ORDER BY id"
                ),
            ]
    finally:
        await pool.close()


async def test_edge_values_round_trip(database_url: str) -> None:
    gen = Generator.create(seed=41)
    lone_tx = transaction(gen, created_at=None, metadata=None, description=None)
    txs = [
        transaction(gen, created_at="0001-01-01T00:00:00.000001+00:00", amount="100.00"),
        transaction(gen, created_at=None, description=TRICKY_TEXT, metadata={"k": TRICKY_TEXT}),
        transaction(gen, created_at="2026-12-01T10:00:00-03:00", amount="0.000001"),
    ]
    lone_ann = annotation(gen, job_id=None, reason=None)
    anns = [
        annotation(gen, job_id=None, creditor=TRICKY_TEXT, occurred_on="0001-01-01"),
        annotation(gen, reason=TRICKY_TEXT, amount="0.0000001"),
    ]
    rows = await write_and_read(database_url, [[lone_tx], [lone_ann], [*txs, *anns]])
    by_id = {row[0]: row for row in rows}
    assert len(by_id) == 7

    lone = by_id[lone_tx.id]
    assert lone["description"] is None
    assert lone["metadata"] is None
    assert lone["created_at"] is not None  # now(), from the empty joined column
    first, tricky, offset = (by_id[t.id] for t in txs)
    assert first["created_at"] == datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC)
    assert first["amount"] == Decimal("100.00")
    assert tricky["description"] == TRICKY_TEXT
    assert json.loads(tricky["metadata"]) == {"k": TRICKY_TEXT}
    assert tricky["created_at"] is not None
    assert offset["created_at"] == datetime(2026, 12, 1, 13, 0, tzinfo=UTC)
    assert offset["amount"] == Decimal("0.000001")

    assert by_id[lone_ann.id]["job_id"] is None
    assert by_id[lone_ann.id]["reason"] is None
    no_job, with_reason = (by_id[a.id] for a in anns)
    assert no_job["job_id"] is None
    assert no_job["creditor"] == TRICKY_TEXT
    assert no_job["occurred_on"] == date(1, 1, 1)
    assert with_reason["job_id"] == anns[1].job_id
    assert with_reason["reason"] == TRICKY_TEXT
    assert with_reason["amount"] == Decimal("0.0000001")  # str() gives 1E-7
