"""A flush as the recorder's writer sends it, recorded once and replayed on real connections.

``plan_flush`` runs ``PgWriter.write`` against a connection that records every statement and
its arguments, and answers as a fresh database would (every id reported new). What comes out is
exactly what the writer sends for that flush (its sort, its chunks, its statements, in
autocommit or between BEGIN and COMMIT), built before the clock starts, so that a benchmark can
replay it with no client work of its own left in the timed window but the round trips.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import asyncpg

from bulk_recorder.recorder.statements import INSERT_ANNOTATIONS, WRITE_TRANSACTIONS
from bulk_recorder.recorder.writer import PgWriter
from bulk_recorder.records import Record

# The statements whose RETURNING lists the ids the insert reported new: the id column is their
# first argument, comma-joined.
_RETURNS_NEW_IDS = (WRITE_TRANSACTIONS, INSERT_ANNOTATIONS)


@dataclass(frozen=True, slots=True)
class Step:
    method: str  # "fetch" or "execute"
    sql: str
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Flush:
    """One flush: its steps, whether they run in one transaction, the records it carries."""

    steps: tuple[Step, ...]
    in_transaction: bool
    records: int


@dataclass(slots=True)
class _RecordingConnection:
    steps: list[Step] = field(default_factory=list)
    transactions: int = 0

    async def fetch(self, sql: str, *args: Any) -> list[tuple[str]]:
        self.steps.append(Step("fetch", sql, args))
        if sql in _RETURNS_NEW_IDS and args and isinstance(args[0], str) and args[0]:
            return [(value,) for value in args[0].split(",")]
        return []

    async def execute(self, sql: str, *args: Any) -> str:
        self.steps.append(Step("execute", sql, args))
        return ""

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        self.transactions += 1
        yield


class _RecordingPool:
    def __init__(self) -> None:
        self.connection = _RecordingConnection()

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[_RecordingConnection]:
        yield self.connection


async def plan_flush(records: Sequence[Record], max_rows_per_insert: int = 1000) -> Flush:
    """What ``PgWriter.write(records)`` sends to a database where every id is new."""
    pool = _RecordingPool()
    writer = PgWriter(cast(asyncpg.Pool, pool), max_rows_per_insert=max_rows_per_insert)
    await writer.write(records)
    connection = pool.connection
    return Flush(tuple(connection.steps), connection.transactions > 0, len(records))


async def replay(conn: asyncpg.Connection, flush: Flush) -> int:
    """Send one planned flush on ``conn``; returns the rows its inserts reported new."""
    if flush.in_transaction:
        async with conn.transaction():
            return await _send(conn, flush.steps)
    return await _send(conn, flush.steps)


async def _send(conn: asyncpg.Connection, steps: Sequence[Step]) -> int:
    new = 0
    for step in steps:
        if step.method == "fetch":
            rows = await conn.fetch(step.sql, *step.args)
            if step.sql in _RETURNS_NEW_IDS:
                new += len(rows)
        else:
            await conn.execute(step.sql, *step.args)
    return new
