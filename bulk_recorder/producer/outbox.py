"""Transactional outbox: the write helpers producers call inside their own transaction.

Producers (the ingest API) call :func:`enqueue` or :func:`copy_to_outbox` inside the database
transaction that stores their work, then :func:`notify`: the rows exist exactly when the work
does, and the notification is delivered at commit. :mod:`bulk_recorder.producer.relay` empties
the table.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from bulk_recorder.infra.metrics import Metrics

Connection = asyncpg.Connection | PoolConnectionProxy

OUTBOX_CHANNEL = "bulk_recorder_outbox"
OUTBOX_COLUMNS = ("record_type", "record_id", "job_id", "body")

_STATS = """
SELECT count(*) AS backlog,
       coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8 AS oldest
FROM outbox WHERE parked_at IS NULL
"""


async def enqueue(
    conn: Connection,
    record_type: str,
    record_id: str,
    body: bytes,
    *,
    job_id: str | None = None,
) -> int:
    """Insert one outbox row in the caller's transaction; returns its id."""
    row_id = await conn.fetchval(
        "INSERT INTO outbox (record_type, record_id, job_id, body) VALUES ($1, $2, $3, $4)"
        " RETURNING id",
        record_type,
        record_id,
        job_id,
        body,
    )
    return int(row_id)


async def copy_to_outbox(
    conn: Connection, rows: Iterable[tuple[str, str, str | None, bytes]]
) -> None:
    """COPY many ``(record_type, record_id, job_id, body)`` rows in the caller's transaction."""
    await conn.copy_records_to_table("outbox", records=rows, columns=OUTBOX_COLUMNS)


async def notify(conn: Connection) -> None:
    """Wake the relays; inside a transaction PostgreSQL delivers it at commit (or never)."""
    await conn.execute(f"NOTIFY {OUTBOX_CHANNEL}")


@dataclass(frozen=True, slots=True)
class OutboxStats:
    backlog: int
    oldest_age_s: float


async def outbox_stats(conn: Connection) -> OutboxStats:
    """Rows waiting to be published (parked ones excluded) and the age of the oldest."""
    row = await conn.fetchrow(_STATS)
    assert row is not None
    return OutboxStats(int(row["backlog"]), max(0.0, float(row["oldest"])))


def record_stats(metrics: Metrics, stats: OutboxStats) -> None:
    metrics.outbox_backlog.set(stats.backlog)
    metrics.outbox_oldest_age.set(stats.oldest_age_s)
