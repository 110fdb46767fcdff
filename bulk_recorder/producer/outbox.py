"""Transactional outbox: the write helpers producers call inside their own transaction.

Producers (the ingest API) call :func:`enqueue` or :func:`copy_to_outbox` inside the database
transaction that stores their work, then :func:`notify`: the rows exist exactly when the work
does, and the notification is delivered at commit. :mod:`bulk_recorder.producer.relay` empties
the table, woken by :func:`listen` (the other end of :func:`notify`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import asyncpg

from bulk_recorder.infra import pg_hosts
from bulk_recorder.infra.backoff import RETRY
from bulk_recorder.infra.broker import cancel_requested
from bulk_recorder.infra.db import Connection
from bulk_recorder.infra.errors import DB_ERRORS
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.infra.tracing import current_carrier
from bulk_recorder.infra.waits import wait_or_stop

log = logging.getLogger(__name__)

OUTBOX_CHANNEL = "bulk_recorder_outbox"
OUTBOX_COLUMNS = ("record_type", "record_id", "job_id", "body")

_STATS = """
SELECT count(*) AS backlog,
       coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8 AS oldest
FROM outbox WHERE parked_at IS NULL
"""

# One row: when a relay last published any row (006_outbox_relay_activity.sql). A lane that finds
# it locked leaves it to the lane holding it, which is stamping it now: never a wait.
_STAMP_PUBLISHED = """
UPDATE outbox_relay_activity SET last_published_at = clock_timestamp()
WHERE only_row = (SELECT only_row FROM outbox_relay_activity FOR UPDATE SKIP LOCKED)
"""


async def enqueue(
    conn: Connection,
    record_type: str,
    record_id: str,
    body: bytes,
    *,
    job_id: str | None = None,
) -> int:
    """Insert one outbox row in the caller's transaction; returns its id. The row keeps the
    current span's trace context (none when tracing is off)."""
    traceparent, tracestate = current_carrier()
    row_id = await conn.fetchval(
        "INSERT INTO outbox (record_type, record_id, job_id, body, traceparent, tracestate)"
        " VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
        record_type,
        record_id,
        job_id,
        body,
        traceparent,
        tracestate,
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


async def stamp_published(conn: Connection) -> None:
    """Record, in the relay's batch transaction, that it published rows (of any kind) now."""
    await conn.execute(_STAMP_PUBLISHED)


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


async def listen(database_url: str, wake: Callable[[], None], stop: asyncio.Event) -> None:
    """LISTEN on its own connection; reconnect when it drops (the poll covers the gap)."""
    attempt = 0
    while not stop.is_set():
        conn: asyncpg.Connection | None = None
        lost = asyncio.Event()
        try:
            conn = await pg_hosts.connect(database_url)
            conn.add_termination_listener(_setter(lost))
            await conn.add_listener(OUTBOX_CHANNEL, lambda *_args: wake())
            attempt = 0
            wake()  # rows may have arrived while we were not listening
            stopped = asyncio.ensure_future(stop.wait())
            gone = asyncio.ensure_future(lost.wait())
            try:
                await asyncio.wait({stopped, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                gone.cancel()
        except DB_ERRORS as exc:
            log.warning("outbox listener connection failed (%r); polling meanwhile", exc)
        except asyncio.CancelledError:
            if cancel_requested():
                raise
            log.warning("outbox listener cancelled under us; polling meanwhile")
        except Exception:  # the listener is an optimisation: never let it die silently
            log.exception("outbox listener failed unexpectedly; polling meanwhile")
        finally:
            if conn is not None and not conn.is_closed():
                with contextlib.suppress(*DB_ERRORS):
                    await asyncio.wait_for(conn.close(), 5)
                if not conn.is_closed():
                    conn.terminate()
        if stop.is_set():
            break
        await wait_or_stop(stop, RETRY.delay(attempt))
        attempt += 1


def _setter(event: asyncio.Event) -> Callable[[object], None]:
    def set_event(_: object) -> None:
        event.set()

    return set_event
