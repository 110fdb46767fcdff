"""How far the ledger's partitions cover: from the partition holding now, up to the first gap.
``partitions`` reports it and its alert reads it; a coverage that jumped a gap would report
days in which every record is dead-lettered (no partition) as covered."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from bulk_recorder.infra import partitions
from bulk_recorder.infra.migrate import migrate

pytestmark = [pytest.mark.postgres]

DAY = timedelta(days=1)


async def test_coverage_runs_from_the_partition_holding_now_to_the_first_gap(
    database_url: str,
) -> None:
    """Only later days partitioned: nothing covers now. Yesterday to tomorrow too, then a
    day's gap, then two more: covered until the gap. The gap filled: until the last one."""
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        await partitions.apply_layout(conn, "day")
        today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        await partitions.create_partitions(conn, today + 3 * DAY, today + 5 * DAY, "day")
        ahead_only = await partitions.coverage(conn, "day")
        assert (ahead_only.partitions, ahead_only.until) == (2, None)

        await partitions.create_partitions(conn, today - DAY, today + 2 * DAY, "day")
        gapped = await partitions.coverage(conn, "day")
        assert (gapped.partitions, gapped.until) == (5, today + 2 * DAY)

        await partitions.create_partitions(conn, today + 2 * DAY, today + 3 * DAY, "day")
        whole = await partitions.coverage(conn, "day")
        assert (whole.partitions, whole.until) == (6, today + 5 * DAY)
    finally:
        await conn.close()
