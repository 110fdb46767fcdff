"""Ledger tables partitioned by time: apply the layout once, then make partitions ahead.

A deployment's choice, not a migration (``bulk_recorder/sql/partitioning/``): the three ledger
tables become ``PARTITION BY RANGE (id)`` on their UUIDv7 ids, and a range of ids is a range of
time. Nothing in the recorder or the API changes: the same statements run on either layout.
What an id that no partition covers gets, and why there is no DEFAULT partition:
docs/operations.md, "Partitioned ledger tables".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from importlib import resources

import asyncpg

from bulk_recorder.exceptions import EXIT_SETTINGS, BulkRecorderError

SPANS = ("day", "week", "month")
LEDGER_TABLES = ("transactions", "operations", "credit_annotations")


class PartitioningRefused(BulkRecorderError):
    """The ledger tables cannot take (or do not have) the partitioned layout; the message says
    why. Nothing was changed."""

    exit_code = EXIT_SETTINGS


@dataclass(frozen=True)
class Coverage:
    """What the partitions of ``transactions`` cover: ``until`` is the end of the last one that
    continues without a gap from the partition holding ``now`` (None: none holds it)."""

    span: str
    partitions: int
    until: datetime | None


def partitioning_sql() -> str:
    """The text of the partitioning script shipped in the package."""
    folder = resources.files("bulk_recorder") / "sql" / "partitioning"
    return (folder / "partitioned_ledger.sql").read_text(encoding="utf-8")


async def is_partitioned(conn: asyncpg.Connection) -> bool:
    """True when all three ledger tables are partitioned tables."""
    count = await conn.fetchval(
        "SELECT count(*) FROM pg_partitioned_table"
        " WHERE partrelid = ANY(ARRAY[to_regclass('transactions'), to_regclass('operations'),"
        " to_regclass('credit_annotations')])"
    )
    return int(count) == len(LEDGER_TABLES)


async def apply_layout(conn: asyncpg.Connection, span: str) -> bool:
    """Partition the (empty) ledger tables and store ``span``, in one database transaction.
    Returns False when they were partitioned already (the span is stored all the same).
    Raises :class:`PartitioningRefused` when a ledger table holds rows."""
    _check_span(span)
    async with conn.transaction():
        before = await is_partitioned(conn)
        try:
            await conn.execute(partitioning_sql())
        except asyncpg.ObjectNotInPrerequisiteStateError as exc:
            raise PartitioningRefused(str(exc)) from None
        await conn.execute("UPDATE ledger_partitioning SET span = $1", span)
    return not before


async def stored_span(conn: asyncpg.Connection) -> str:
    """The span stored at ``apply_layout``; refuses when the layout was never applied."""
    if (
        not await is_partitioned(conn)
        or await conn.fetchval("SELECT to_regclass('ledger_partitioning')") is None
    ):
        raise PartitioningRefused(
            "the ledger tables are not partitioned: `bulk-recorder partitions --apply` first "
            "(on a freshly migrated, empty database)"
        )
    return str(await conn.fetchval("SELECT span FROM ledger_partitioning"))


async def create_partitions(
    conn: asyncpg.Connection, start: datetime, end: datetime, span: str
) -> list[str]:
    """Create what is missing of the partitions covering [start, end); returns their names."""
    _check_span(span)
    rows = await conn.fetch(
        "SELECT * FROM bulk_recorder_create_partitions($1, $2, $3)", start, end, span
    )
    return [str(r[0]) for r in rows]


async def coverage(conn: asyncpg.Connection, span: str, at: datetime | None = None) -> Coverage:
    """How far ahead of ``at`` (default: the database's now) ``transactions`` is covered
    without a gap."""
    rows = await conn.fetch(
        "SELECT lower, upper FROM bulk_recorder_partitions('transactions'::regclass)"
        " ORDER BY lower NULLS FIRST"
    )
    now_bound = await conn.fetchval(
        "SELECT bulk_recorder_uuid_bound(coalesce($1::timestamptz, now()))", at
    )
    edge = None
    for lower, upper in rows:
        if (
            edge is None
            and (lower is None or lower <= now_bound)
            and (upper is None or upper > now_bound)
        ) or (edge is not None and lower == edge):
            edge = upper
    until = None
    if edge is not None:
        until = await conn.fetchval("SELECT bulk_recorder_uuid_time($1)", edge)
    return Coverage(span=span, partitions=len(rows), until=until)


def _check_span(span: str) -> None:
    if span not in SPANS:
        raise PartitioningRefused(f"span must be one of {', '.join(SPANS)}, not {span!r}")
