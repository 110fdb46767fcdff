"""``POST /v1/transactions`` behind its route: async (outbox, 202) or sync (PgWriter, 201),
and the answer to a repeat.
"""

from __future__ import annotations

import logging
from typing import Literal, cast

import asyncpg
from fastapi.responses import Response

from bulk_recorder.infra.errors import (
    DB_ERRORS,
    DataRejected,
    TransientDbError,
)
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.producer.api.body import canonical_hash
from bulk_recorder.producer.api.context import ApiContext, db_failure
from bulk_recorder.producer.api.models import TransactionAccepted
from bulk_recorder.producer.api.problems import REPLAYED_HEADER, ApiError, json_response
from bulk_recorder.producer.outbox import enqueue, notify
from bulk_recorder.recorder.writer import PgWriter, WriteResult
from bulk_recorder.records import Transaction

log = logging.getLogger(__name__)

_INSERT_REQUEST = """
INSERT INTO transaction_requests (transaction_id, idempotency_key, request_hash, mode, status_code,
                                  client)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT DO NOTHING
RETURNING true
"""
_PRIOR_REQUEST = """
SELECT transaction_id::text AS id, idempotency_key, request_hash, mode, status_code, client
FROM transaction_requests
WHERE transaction_id = $1 OR (client = $3 AND idempotency_key = $2)
ORDER BY (client = $3 AND idempotency_key IS NOT DISTINCT FROM $2) DESC
LIMIT 1
"""

# -- sync mode: PgWriter inside the request's transaction ----------------------------------------


class _Lent:
    def __init__(self, conn: asyncpg.pool.PoolConnectionProxy) -> None:
        self._conn = conn

    async def __aenter__(self) -> asyncpg.pool.PoolConnectionProxy:
        return self._conn

    async def __aexit__(self, *exc: object) -> None:
        return None


class _SameConnection:
    """Looks like a pool to :class:`PgWriter`: ``acquire()`` lends the request's connection, so
    the writer's transaction becomes a savepoint of the request's transaction and the request
    row commits with the transaction's rows, or neither does."""

    def __init__(self, conn: asyncpg.pool.PoolConnectionProxy) -> None:
        self._conn = conn

    def acquire(self) -> _Lent:
        return _Lent(self._conn)


async def accept_transaction(
    ctx: ApiContext, record: Transaction, body: bytes, key: str | None, client: str
) -> Response:
    async_mode = ctx.settings.rabbitmq_transaction_async
    mode: Literal["async", "sync"] = "async" if async_mode else "sync"
    status = 202 if async_mode else 201
    request_hash = canonical_hash(body)
    prior: asyncpg.Record | None = None
    fresh = False
    try:
        async with ctx.db.acquire(timeout=10) as conn, conn.transaction():
            fresh = await conn.fetchval(
                _INSERT_REQUEST, record.id, key, request_hash, mode, status, client
            )
            if not fresh:
                prior = await conn.fetchrow(_PRIOR_REQUEST, record.id, key, client)
            elif async_mode:
                await enqueue(conn, "transaction", record.id, body)
                await notify(conn)
            else:
                writer = PgWriter(
                    cast(asyncpg.Pool, _SameConnection(conn)),
                    max_rows_per_insert=ctx.settings.bulk_recorder_max_rows_per_insert,
                )
                result: WriteResult = await writer.write([record])
                _count_rows(ctx.metrics, result)
    except ApiError:
        raise
    except (DataRejected, TransientDbError, *DB_ERRORS) as exc:
        raise await db_failure(ctx, exc) from None
    if prior is None:
        if fresh:
            return json_response(
                status, TransactionAccepted(id=record.id, status=_word(status), mode=mode)
            )
        # The conflicting row was rolled back between our insert and our look-up: rare; the
        # client may simply retry.
        raise ApiError(409, "a concurrent request for this transaction failed; retry")
    return _replay_transaction(prior, record, key, request_hash, client)


def _word(status: int) -> Literal["accepted", "recorded"]:
    return "accepted" if status == 202 else "recorded"


def _replay_transaction(
    prior: asyncpg.Record, record: Transaction, key: str | None, request_hash: bytes, client: str
) -> Response:
    same_body = bytes(prior["request_hash"]) == request_hash
    if prior["client"] != client:  # the id is taken in the ledger; replays are per client
        raise ApiError(409, f"transaction {record.id} was already accepted from another client")
    if key is not None and prior["idempotency_key"] == key:
        if not same_body or prior["id"] != record.id:
            raise ApiError(422, "Idempotency-Key was already used for a different request body")
    elif not same_body:
        raise ApiError(409, f"transaction {record.id} was already accepted with other content")
    status = int(prior["status_code"])
    out = TransactionAccepted(id=prior["id"], status=_word(status), mode=prior["mode"])
    return json_response(status, out, **{REPLAYED_HEADER: "true"})


def _count_rows(metrics: Metrics, result: WriteResult) -> None:
    for table, counts in result.tables.items():
        metrics.rows_attempted.labels(table=table).inc(counts.attempted)
        metrics.rows_inserted.labels(table=table).inc(counts.inserted)
        metrics.rows_ignored.labels(table=table).inc(counts.ignored)
