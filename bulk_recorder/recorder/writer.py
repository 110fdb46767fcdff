"""PgWriter: one DB transaction a flush, ids sorted, bounded chunks, idempotent inserts.

Each flush:
1. drops records repeated inside the flush (same id: the first wins, the rest count as ignored),
2. sorts every table's rows by key so that concurrent writers take row locks in one order,
3. inserts in chunks of at most ``rows_per_insert(columns)`` rows with ``unnest`` arrays and
   ``ON CONFLICT (id) DO NOTHING RETURNING id``,
4. inserts operations only for transactions the insert reported as new (so an operation id that
   belongs to another transaction is a real conflict, surfaced as a data error), and applies
   balance deltas for those same transactions, aggregated per (account, asset) and in key order,
5. for annotations the insert ignored that carry a job id other than the stored row's, records
   (job_id, id) in ``credit_annotation_job_repeats`` (a job's progress counts its own rows plus
   these); this step runs only when the flush had ignored rows,
6. commits once. A redelivered message therefore changes nothing.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Any, Protocol

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from bulk_recorder.infra.errors import classify, renew_if_server_gone
from bulk_recorder.records import CreditAnnotation, Operation, Record, Transaction

log = logging.getLogger("bulk_recorder.writer")  # the name logs have always carried

Connection = asyncpg.Connection | PoolConnectionProxy

PG_MAX_PARAMETERS = 65_535
MAX_ROWS_PER_INSERT = 1_000

TRANSACTION_COLUMNS = (
    "id",
    "organization_id",
    "ledger_id",
    "description",
    "status",
    "asset_code",
    "amount",
    "created_at",
    "metadata",
)
OPERATION_COLUMNS = (
    "id",
    "transaction_id",
    "account_id",
    "type",
    "amount",
    "asset_code",
    "created_at",
)
ANNOTATION_COLUMNS = (
    "id",
    "job_id",
    "document",
    "document_type",
    "kind",
    "creditor",
    "amount",
    "occurred_on",
    "reason",
)

_INSERT_TRANSACTIONS = """
INSERT INTO transactions (id, organization_id, ledger_id, description, status, asset_code,
                          amount, created_at, metadata)
SELECT u.id::uuid, u.organization_id::uuid, u.ledger_id::uuid, u.description, u.status,
       u.asset_code, u.amount::numeric, coalesce(u.created_at, now()), u.metadata::jsonb
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::text[], $8::timestamptz[], $9::text[])
     AS u(id, organization_id, ledger_id, description, status, asset_code, amount, created_at,
          metadata)
ON CONFLICT (id) DO NOTHING
RETURNING id::text
"""

_INSERT_OPERATIONS = """
INSERT INTO operations (id, transaction_id, account_id, type, amount, asset_code, created_at)
SELECT u.id::uuid, u.transaction_id::uuid, u.account_id::uuid, u.type, u.amount::numeric,
       u.asset_code, coalesce(u.created_at, now())
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::timestamptz[])
     AS u(id, transaction_id, account_id, type, amount, asset_code, created_at)
"""

_APPLY_BALANCES = """
INSERT INTO balances AS b (account_id, asset_code, available)
SELECT u.account_id::uuid, u.asset_code, u.delta::numeric
FROM unnest($1::text[], $2::text[], $3::text[]) AS u(account_id, asset_code, delta)
ON CONFLICT (account_id, asset_code)
DO UPDATE SET available = b.available + EXCLUDED.available, updated_at = now()
"""

_INSERT_ANNOTATIONS = """
INSERT INTO credit_annotations (id, job_id, document, document_type, kind, creditor, amount,
                                occurred_on, reason)
SELECT u.id::uuid, u.job_id::uuid, u.document, u.document_type, u.kind, u.creditor,
       u.amount::numeric, u.occurred_on, u.reason
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::text[], $8::date[], $9::text[])
     AS u(id, job_id, document, document_type, kind, creditor, amount, occurred_on, reason)
ON CONFLICT (id) DO NOTHING
RETURNING id::text
"""

# Only for pairs whose id is stored with another job (or none): a job's own rows never repeat.
_RECORD_REPEATS = """
INSERT INTO credit_annotation_job_repeats (job_id, annotation_id)
SELECT u.job_id::uuid, u.id::uuid
FROM unnest($1::text[], $2::text[]) AS u(job_id, id)
JOIN credit_annotations AS a ON a.id = u.id::uuid
WHERE a.job_id IS DISTINCT FROM u.job_id::uuid
ORDER BY 1, 2
ON CONFLICT DO NOTHING
"""


def rows_per_insert(columns: int, setting: int = MAX_ROWS_PER_INSERT) -> int:
    """Rows per INSERT: the setting, capped by 1000 and by the 65,535-parameter limit."""
    if columns < 1:
        raise ValueError("columns must be >= 1")
    return max(1, min(setting, MAX_ROWS_PER_INSERT, PG_MAX_PARAMETERS // columns))


def chunked(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    """Consecutive slices of at most ``size`` items."""
    if size < 1:
        raise ValueError("size must be >= 1")
    for start in range(0, len(items), size):
        yield items[start : start + size]


def dedupe_sorted(records: Sequence[Record]) -> tuple[list[Record], int]:
    """Records sorted by id with repeats removed (first occurrence wins); and the repeat count."""
    seen: dict[str, Record] = {}
    for record in records:
        seen.setdefault(record.id, record)
    unique = sorted(seen.values(), key=_record_id)
    return unique, len(records) - len(unique)


def _record_id(record: Record) -> str:
    return record.id


@dataclass(slots=True)
class TableCounts:
    attempted: int = 0
    inserted: int = 0
    ignored: int = 0


@dataclass(slots=True)
class WriteResult:
    """Row counts of one committed flush, per table."""

    tables: dict[str, TableCounts] = field(default_factory=dict)

    def table(self, name: str) -> TableCounts:
        counts = self.tables.get(name)
        if counts is None:
            counts = self.tables[name] = TableCounts()
        return counts


class Writer(Protocol):
    """What the flusher needs from storage. Raises DataRejected or TransientDbError."""

    async def write(self, records: Sequence[Record]) -> WriteResult: ...


class PgWriter:
    """Writes a flush in one PostgreSQL transaction (see the module docstring)."""

    def __init__(self, pool: asyncpg.Pool, *, max_rows_per_insert: int = MAX_ROWS_PER_INSERT):
        self._pool = pool
        self._tx_rows = rows_per_insert(len(TRANSACTION_COLUMNS), max_rows_per_insert)
        self._op_rows = rows_per_insert(len(OPERATION_COLUMNS), max_rows_per_insert)
        self._ann_rows = rows_per_insert(len(ANNOTATION_COLUMNS), max_rows_per_insert)

    async def write(self, records: Sequence[Record]) -> WriteResult:
        transactions: list[Record] = []
        annotations: list[Record] = []
        for record in records:
            (transactions if isinstance(record, Transaction) else annotations).append(record)
        result = WriteResult()
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                if transactions:
                    await self._write_transactions(conn, transactions, result)
                if annotations:
                    await self._write_annotations(conn, annotations, result)
        except Exception as exc:  # the Writer contract: every failure is data or an outage
            # (asyncpg's InternalClientError/ProtocolError are neither PostgresError nor
            # InterfaceError; escaping here, they left the batch unacked for good)
            await renew_if_server_gone(self._pool, exc)
            raise classify(exc) from exc
        return result

    async def probe(self) -> None:
        """Prove that the database takes our writes: the statements of a flush for one made-up
        transaction and one annotation, in a transaction that is always rolled back.

        ``SELECT 1`` passes on a database that accepts connections but refuses writes (a
        read-only primary, SQLSTATE 25006; a revoked privilege; a trigger). This does not: it
        touches every table a flush writes. Raises DataRejected or TransientDbError.
        """
        transaction, annotation = _probe_records()
        try:
            async with self._pool.acquire() as conn:
                tx = conn.transaction()
                await tx.start()
                try:
                    await self._write_transactions(conn, [transaction], WriteResult())
                    await self._write_annotations(conn, [annotation], WriteResult())
                finally:
                    await tx.rollback()
        except Exception as exc:  # the Writer contract, as in write()
            await renew_if_server_gone(self._pool, exc)
            raise classify(exc) from exc

    async def _write_transactions(
        self, conn: Connection, records: list[Record], result: WriteResult
    ) -> None:
        unique, _ = dedupe_sorted(records)
        txs: list[Transaction] = [r for r in unique if isinstance(r, Transaction)]
        new_ids: set[str] = set()
        for chunk in chunked(txs, self._tx_rows):
            rows = await conn.fetch(
                _INSERT_TRANSACTIONS,
                [t.id for t in chunk],
                [t.organization_id for t in chunk],
                [t.ledger_id for t in chunk],
                [t.description for t in chunk],
                [t.status for t in chunk],
                [t.asset_code for t in chunk],
                [str(t.amount) for t in chunk],
                [t.created_at for t in chunk],
                [t.metadata for t in chunk],
            )
            new_ids.update(row[0] for row in rows)
        counts = result.table("transactions")
        counts.attempted += len(records)
        counts.inserted += len(new_ids)
        counts.ignored += len(records) - len(new_ids)
        if not new_ids:
            return
        fresh = [t for t in txs if t.id in new_ids]
        operations = sorted(
            ((op, t) for t in fresh for op in t.operations), key=lambda pair: pair[0].id
        )
        for chunk in chunked(operations, self._op_rows):
            await conn.execute(
                _INSERT_OPERATIONS,
                [op.id for op, _ in chunk],
                [t.id for _, t in chunk],
                [op.account_id for op, _ in chunk],
                [op.type for op, _ in chunk],
                [str(op.amount) for op, _ in chunk],
                [op.asset_code for op, _ in chunk],
                [t.created_at for _, t in chunk],
            )
        ops = result.table("operations")
        ops.attempted += len(operations)
        ops.inserted += len(operations)
        deltas = balance_deltas(fresh)
        if deltas:
            keys = sorted(deltas)
            for chunk in chunked(keys, rows_per_insert(3)):
                await conn.execute(
                    _APPLY_BALANCES,
                    [k[0] for k in chunk],
                    [k[1] for k in chunk],
                    [str(deltas[k]) for k in chunk],
                )
            bal = result.table("balances")
            bal.attempted += len(keys)
            bal.inserted += len(keys)

    async def _write_annotations(
        self, conn: Connection, records: list[Record], result: WriteResult
    ) -> None:
        unique, _ = dedupe_sorted(records)
        anns: list[CreditAnnotation] = [r for r in unique if isinstance(r, CreditAnnotation)]
        inserted = 0
        returned: list[list[asyncpg.Record]] = []
        for chunk in chunked(anns, self._ann_rows):
            rows = await conn.fetch(
                _INSERT_ANNOTATIONS,
                [a.id for a in chunk],
                [a.job_id for a in chunk],
                [a.document for a in chunk],
                [a.document_type for a in chunk],
                [a.kind for a in chunk],
                [a.creditor for a in chunk],
                [str(a.amount) for a in chunk],
                [a.occurred_on for a in chunk],
                [a.reason for a in chunk],
            )
            inserted += len(rows)
            returned.append(rows)
        counts = result.table("credit_annotations")
        counts.attempted += len(records)
        counts.inserted += inserted
        counts.ignored += len(records) - inserted
        if inserted < len(records):  # the common flush (nothing ignored) skips this
            new_ids = {row[0] for rows in returned for row in rows}
            await self._record_repeats(conn, records, anns, new_ids)

    async def _record_repeats(
        self,
        conn: Connection,
        records: list[Record],
        unique: list[CreditAnnotation],
        new_ids: set[str],
    ) -> None:
        """Record (job_id, id) for job lines whose id is stored under another job (or none).

        A record inserted now owns its id; every other (job_id, id) pair of the flush, that is
        the ignored rows and the in-flush repeats of an id from another job, is a candidate.
        The statement keeps only those whose stored row carries another job id.
        """
        owner = {a.id: a.job_id for a in unique if a.id in new_ids}
        pairs = sorted(
            {
                (r.job_id, r.id)
                for r in records
                if isinstance(r, CreditAnnotation)
                and r.job_id is not None
                and (r.id not in owner or owner[r.id] != r.job_id)
            }
        )
        for chunk in chunked(pairs, self._ann_rows):
            await conn.execute(
                _RECORD_REPEATS, [job for job, _ in chunk], [ann for _, ann in chunk]
            )


def _probe_records() -> tuple[Transaction, CreditAnnotation]:
    """Fresh ids each time, so that the insert is new and its operations and balance run."""

    def new_id() -> str:
        return str(uuid.uuid4())

    amount = Decimal(1)
    debit = Operation(new_id(), new_id(), "DEBIT", amount, "XPR")
    credit = Operation(new_id(), new_id(), "CREDIT", amount, "XPR")
    transaction = Transaction(
        new_id(),
        new_id(),
        new_id(),
        "write probe, rolled back",
        "APPROVED",
        "XPR",
        amount,
        None,
        None,
        (debit, credit),
    )
    annotation = CreditAnnotation(
        new_id(),
        None,
        "52998224725",
        "CPF",
        "RESTRICTION",
        "write probe, rolled back",
        amount,
        date(2000, 1, 1),
        None,
    )
    return transaction, annotation


def balance_deltas(transactions: Sequence[Transaction]) -> dict[tuple[str, str], Decimal]:
    """Net balance change per (account_id, asset_code): credits add, debits subtract.

    Only APPROVED transactions move balances; PENDING and CANCELED ones are recorded only.
    """
    deltas: dict[tuple[str, str], Decimal] = {}
    for t in transactions:
        if t.status != "APPROVED":
            continue
        for op in t.operations:
            key = (op.account_id, op.asset_code)
            signed = op.amount if op.type == "CREDIT" else -op.amount
            deltas[key] = deltas.get(key, Decimal(0)) + signed
    return deltas
