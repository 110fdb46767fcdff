"""Staging of a credit-annotation job's lines while its upload is still arriving.

An upload can take minutes, and one database transaction held for all of it pins a pooled
connection in a transaction and holds back vacuum on the outbox. Instead the accepted lines are
COPYed, as they arrive, into a TEMPORARY table of the upload's own connection, each COPY its own
short transaction, one COPY running while the next lines are validated. No other session can
see that table: the relay sees nothing of a partial job. Once the body is complete,
:meth:`JobStaging.publish` moves every staged line into the outbox in ONE server-side statement,
inside the caller's transaction that also inserts the job row, and drops the table: the job and
all its outbox rows appear at one commit, or neither does.

Clean-up is PostgreSQL's own: a temporary table lives only as long as its session. A failed
upload drops it (:meth:`JobStaging.discard`), and when that is not possible (connection broken,
task cancelled mid-statement) the connection is terminated instead. A crash of the API ends its
sessions, and with them every staging table; a crash of PostgreSQL loses them too. No sweeper.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Final

from bulk_recorder.infra.db import Connection
from bulk_recorder.infra.tracing import current_carrier
from bulk_recorder.producer.ingest import OutboxRow

log = logging.getLogger(__name__)

__all__ = ["STAGING_TABLE", "JobStaging"]


STAGING_TABLE: Final = "bulk_recorder_job_lines"
_COLUMNS: Final = ("record_id", "body")
_DISCARD_TIMEOUT_S: Final = 5.0

_CREATE = f"""
DROP TABLE IF EXISTS pg_temp.{STAGING_TABLE};
CREATE TEMPORARY TABLE {STAGING_TABLE} (record_id uuid NOT NULL, body bytea NOT NULL)
"""
# A temporary table is in local buffers and scanned from its first block (synchronized scans
# are for shared tables only), so the outbox ids follow the upload's line order.
_PUBLISH = f"""
INSERT INTO outbox (record_type, record_id, job_id, body, traceparent, tracestate)
SELECT 'credit_annotation', record_id, $1::uuid, body, $2::text, $3::text
FROM pg_temp.{STAGING_TABLE}
"""
_DROP = f"DROP TABLE IF EXISTS pg_temp.{STAGING_TABLE}"


class JobStaging:
    """The staged lines of one upload, on the connection that stays with it to the end.

    Use: :meth:`open`, then :meth:`add` each batch of rows (autocommit: one short transaction
    a batch), :meth:`flush`, then either :meth:`publish` inside the transaction that stores the
    job, or :meth:`discard` when the upload fails.
    """

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._copying: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Create the (empty) staging table; one left by an earlier upload is dropped first."""
        await self._conn.execute(_CREATE)

    async def add(self, rows: Sequence[OutboxRow] | bytes) -> None:
        """Start COPYing a batch of ``(record_type, record_id, job_id, body)`` rows, or of
        ``(record_id, body)`` rows already in binary COPY format (a whole COPY stream, from
        :mod:`bulk_recorder.producer.job_blocks`), into staging and return: the server ingests
        it while the caller validates the next lines. One COPY at a time: this first waits for
        the previous one (and raises its error, if any)."""
        await self.flush()
        if isinstance(rows, bytes):
            self._copying = asyncio.create_task(self._copy_binary(rows))
            return
        records = [(record_id, body) for _, record_id, _, body in rows]
        self._copying = asyncio.create_task(self._copy(records))

    async def flush(self) -> None:
        """Wait for the COPY in flight; its error, if any, is raised here."""
        copying, self._copying = self._copying, None
        if copying is not None:
            await copying

    async def _copy(self, records: list[tuple[str, bytes]]) -> None:
        await self._conn.copy_records_to_table(
            STAGING_TABLE, schema_name="pg_temp", records=records, columns=_COLUMNS
        )

    async def _copy_binary(self, data: bytes) -> None:
        await self._conn.copy_to_table(
            STAGING_TABLE,
            schema_name="pg_temp",
            source=_once(data),
            columns=_COLUMNS,
            format="binary",
        )

    async def publish(self, job_id: str) -> None:
        """Move every staged line into the outbox and drop the table, in the caller's
        transaction: the rows become visible to the relay at its commit, all together."""
        if self._copying is not None or not self._conn.is_in_transaction():
            raise RuntimeError("publish() comes after flush(), in the job's transaction")
        # every line keeps the trace context of the request that uploaded the job
        await self._conn.execute(_PUBLISH, job_id, *current_carrier())
        await self._conn.execute(_DROP)

    async def discard(self) -> None:
        """Drop the staged lines of a failed upload (after the COPY in flight, if any). If the
        connection cannot do it now (broken, busy past the timeout, or cancelled in the middle
        of a statement), terminate it: its session ends, and PostgreSQL drops the table with
        it. Never raises, except the caller's own cancellation."""
        copying, self._copying = self._copying, None
        try:
            if copying is not None:
                await asyncio.wait({copying}, timeout=_DISCARD_TIMEOUT_S)
                if not copying.done():
                    raise TimeoutError(f"a staging COPY still running after {_DISCARD_TIMEOUT_S} s")
                _retrieve(copying)
            if self._conn.is_closed():
                return  # its session is over, and the table went with it
            await self._conn.execute(_DROP, timeout=_DISCARD_TIMEOUT_S)
            return
        except Exception as exc:  # any failure: fall back to ending the session
            log.warning("staged lines not dropped (%s); closing their session", exc)
            log.debug("staging drop failed", exc_info=exc)
        except BaseException:  # cancelled meanwhile: end the session, stay cancelled
            _cancel(copying)
            self._terminate()
            raise
        _cancel(copying)
        self._terminate()

    def _terminate(self) -> None:
        try:
            self._conn.terminate()
        except Exception as exc:  # e.g. already released by a pool shutting down
            log.debug("staging connection not terminated: %s", exc)


async def _once(data: bytes) -> AsyncIterator[bytes]:
    """``data`` as a COPY source (asyncpg reads a file-like one on a thread)."""
    yield data


def _cancel(task: asyncio.Task[None] | None) -> None:
    if task is not None and not task.done():
        task.cancel()
        task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Task[None]) -> None:
    """Take a finished staging COPY's outcome, so that a failure is logged once, here."""
    if not task.cancelled() and task.exception() is not None:
        log.debug("staging COPY of a failed upload failed too", exc_info=task.exception())
