"""Nothing in the recorder depends on ids being time-ordered (issue 28).

The same records, once with random UUIDv4 ids in random order and once with UUIDv7 ids, record
identically: the same counts per table on the first write and on a redelivery, the same rows
(ids aside) and the same balances.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from bulk_recorder.infra.ids import uuid7
from bulk_recorder.infra.migrate import migrate
from bulk_recorder.recorder.writer import PgWriter
from bulk_recorder.records import Record, decode
from consumer.tools.generator import Generator

pytestmark = [pytest.mark.postgres]

_TABLES = ("transactions", "operations", "credit_annotations", "credit_annotation_job_repeats")


def _bodies() -> list[tuple[dict[str, Any], str]]:
    gen = Generator.create(seed=28)
    bodies = [(gen.transaction(), "transaction") for _ in range(300)]
    bodies += [(gen.credit_annotation(), "credit_annotation") for _ in range(300)]
    return bodies


def _with_ids(bodies: list[tuple[dict[str, Any], str]], new_id: Callable[[], str]) -> list[Record]:
    records = []
    for raw, kind in bodies:
        copy = json.loads(json.dumps(raw))
        copy["id"] = new_id()
        for op in copy.get("operations", ()):
            op["id"] = new_id()
        records.append(decode(json.dumps(copy).encode(), kind))
    return records


async def _record(pool: asyncpg.Pool, records: list[Record]) -> dict[str, Any]:
    writer = PgWriter(pool)
    first = await writer.write(records)
    again = await writer.write(list(reversed(records)))  # a redelivery, in another order
    async with pool.acquire() as conn:
        seen = {
            "first": {t: (c.attempted, c.inserted, c.ignored) for t, c in first.tables.items()},
            "again": {t: (c.attempted, c.inserted, c.ignored) for t, c in again.tables.items()},
            "rows": {t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in _TABLES},
            "balances": await conn.fetch(
                "SELECT account_id::text, asset_code, available::text FROM balances ORDER BY 1, 2"
            ),
            "transactions": sorted(
                tuple(r)
                for r in await conn.fetch("SELECT amount::text, metadata::text FROM transactions")
            ),
            "annotations": sorted(
                tuple(r)
                for r in await conn.fetch(
                    "SELECT document, kind, amount::text, job_id::text FROM credit_annotations"
                )
            ),
        }
        await conn.execute(f"TRUNCATE {', '.join(_TABLES)}, balances")
    return seen


async def test_random_v4_and_time_ordered_v7_ids_record_identically(database_url: str) -> None:
    await migrate(database_url)
    bodies = _bodies()
    rng = random.Random(4)
    v4 = _with_ids(bodies, lambda: str(uuid.UUID(int=rng.getrandbits(128), version=4)))
    rng.shuffle(v4)
    v7 = _with_ids(bodies, uuid7)
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        with_v4 = await _record(pool, v4)
        with_v7 = await _record(pool, v7)
    finally:
        await pool.close()
    assert with_v4["rows"]["transactions"] == 300
    assert with_v4 == with_v7
