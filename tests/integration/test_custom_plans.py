"""The relay's claim reads a window of the outbox, whatever plan PostgreSQL makes for it.

The outbox swings from empty to a whole job (300,000 rows) in one commit. A statement prepared
and run while it was empty gets its plans from a table with no statistics, and keeps them
until the next ANALYZE, which autovacuum may not run in time (on this machine it is off). The
old claim then read and sorted every pending row on each claim: a 300,000-row job relayed at
1,500 rows/s (benchmarks/RESULTS.md, section 10). The claim now starts at the first available
row and looks at a window of ids after it, so the rows it reads are bounded by the window
whatever the plan; the relay's and the API's connections also plan every statement for the
table as it is now (``open_pool_when_ready(custom_plans=True)``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from bulk_recorder.infra.db import Connection, open_pool_when_ready
from bulk_recorder.producer.relay_claim import CLAIM

pytestmark = [pytest.mark.postgres]

ROWS = 50_000
BATCH = 500
WINDOW = 4_000


def _rows_read(plan: dict[str, Any]) -> int:
    """Rows the scans of the main query read: returned plus filtered out (EXPLAIN ANALYZE);
    the InitPlans that find the first row are left out (they stop at it)."""
    own = 0
    if "Scan" in plan["Node Type"]:
        own = plan["Actual Rows"] + sum(v for k, v in plan.items() if k.startswith("Rows Removed"))
    children = [c for c in plan.get("Plans", []) if c.get("Parent Relationship") != "InitPlan"]
    return own + sum(_rows_read(child) for child in children)


async def claim_after_the_outbox_fills(conn: Connection) -> tuple[int, int]:
    """PREPARE the relay's claim, run it on the empty outbox until a generic plan may be
    cached, fill the outbox in one commit; then (rows claimed, most rows a scan read)."""
    await conn.execute(f"PREPARE claim(int, bigint, bigint) AS {CLAIM}")
    for _ in range(8):
        async with conn.transaction():
            await conn.execute(f"EXECUTE claim({BATCH}, {WINDOW}, 0)")
    await conn.execute(
        "INSERT INTO outbox (record_type, record_id, body)"
        " SELECT 'credit_annotation', gen_random_uuid(), '{}'::bytea"
        f" FROM generate_series(1, {ROWS})"
    )
    async with conn.transaction():
        claimed = len(await conn.fetch(f"EXECUTE claim({BATCH}, {WINDOW}, 0)"))
        raw = await conn.fetchval(
            f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE claim({BATCH}, {WINDOW}, 0)"
        )
    return claimed, _rows_read(json.loads(raw)[0]["Plan"])


@pytest.mark.parametrize("custom_plans", [False, True])
async def test_a_claim_reads_a_window_not_the_whole_outbox(
    database_url: str, custom_plans: bool
) -> None:
    pool = await open_pool_when_ready(
        database_url, max_size=1, stop=asyncio.Event(), custom_plans=custom_plans
    )
    assert pool is not None
    try:
        async with pool.acquire() as conn:
            claimed, read = await claim_after_the_outbox_fills(conn)
    finally:
        await pool.close()
    assert claimed == BATCH
    assert read <= WINDOW, f"a claim read {read:,} rows of {ROWS:,}"
