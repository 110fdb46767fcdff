"""PgWriter: ids sorted, bounded chunks, idempotent inserts, one round trip a chunk.

Each flush:
1. drops records repeated inside the flush (same id: the first wins, the rest count as ignored),
2. sorts every table's rows by key so that concurrent writers take row locks in one order,
3. writes transactions in chunks of at most ``rows_per_insert`` transactions (and operations),
   each chunk ONE statement (``statements.WRITE_TRANSACTIONS``): the insert with
   ``ON CONFLICT (id) DO NOTHING RETURNING id``, the operations of the transactions it reported
   as new (so an operation id that belongs to another transaction is a real conflict, surfaced
   as a data error), and those transactions' balance deltas, aggregated per (account, asset) in
   key order. A statement is atomic, so a chunk commits whole or not at all;
4. inserts annotations in chunks of at most ``rows_per_insert`` rows, ``ON CONFLICT (id) DO
   NOTHING RETURNING id``;
5. for annotations the insert ignored that carry a job id other than the stored row's, records
   (job_id, id) in ``credit_annotation_job_repeats`` (a job's progress counts its own rows plus
   these); this step runs only when the flush had ignored rows, and reads the stored rows, so
   it gives the same answer when a redelivery runs it again.

A flush is one database transaction: a flush of one statement (one record type, one chunk: every
flush at the default size) runs it in autocommit, one round trip where BEGIN, three statements
and COMMIT took five; a flush of several statements (both record types, or more than one chunk)
runs them between BEGIN and COMMIT. The one exception is step 5 after an autocommitted
annotation insert: it commits on its own, right after, and reads the stored rows, so a crash in
between is repaired by the redelivery, which runs it again. A redelivered message therefore
changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Protocol

import asyncpg

from bulk_recorder.infra.db import Connection
from bulk_recorder.infra.errors import classify, renew_if_server_gone
from bulk_recorder.infra.ids import uuid7
from bulk_recorder.recorder.statements import (
    ANNOTATION_COLUMNS,
    APPLY_BALANCES,
    INSERT_ANNOTATIONS,
    OPERATION_COLUMNS,
    RECORD_REPEATS,
    TRANSACTION_COLUMNS,
    WRITE_TRANSACTIONS,
    annotation_arguments,
    balance_arguments,
    chunked,
    rows_per_insert,
    transaction_arguments,
    transaction_chunks,
)
from bulk_recorder.records import CreditAnnotation, Operation, Record, Transaction, exact
from settings import MAX_ROWS_PER_INSERT, PG_MAX_PARAMETERS

log = logging.getLogger(__name__)


__all__ = [
    "ANNOTATION_COLUMNS",
    "MAX_ROWS_PER_INSERT",
    "OPERATION_COLUMNS",
    "PG_MAX_PARAMETERS",
    "TRANSACTION_COLUMNS",
    "PgWriter",
    "WriteResult",
    "Writer",
    "balance_deltas",
    "chunked",
    "dedupe_sorted",
    "rows_per_insert",
]


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


# A flush that inserted nothing found its rows already there, perhaps committed on the primary
# alone: a COMMIT whose wait for the synchronous standby was cancelled (by our own command
# timeout) stays committed locally. A transaction that writes nothing does not wait for the
# standby, so without this the flush returned, and its deliveries were acked, while the standby
# lacked the rows (a failover lost them). This statement writes WAL under a transaction id of its
# own, so its commit waits, as any write's does, until the standby has everything before it.
DURABLE_BARRIER = "SELECT pg_logical_emit_message(true, 'bulk-recorder', 'durable')"


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
    """Writes a flush, one statement a chunk (see the module docstring)."""

    def __init__(self, pool: asyncpg.Pool, *, max_rows_per_insert: int = MAX_ROWS_PER_INSERT):
        self._pool = pool
        self._tx_rows = min(  # transactions and operations per statement
            rows_per_insert(len(TRANSACTION_COLUMNS), max_rows_per_insert),
            rows_per_insert(len(OPERATION_COLUMNS), max_rows_per_insert),
        )
        self._ann_rows = rows_per_insert(len(ANNOTATION_COLUMNS), max_rows_per_insert)

    async def write(self, records: Sequence[Record]) -> WriteResult:
        transactions: list[Record] = []
        annotations: list[Record] = []
        for record in records:
            (transactions if isinstance(record, Transaction) else annotations).append(record)
        result = WriteResult()
        try:
            async with self._pool.acquire() as conn:
                if self._one_statement(transactions, annotations):
                    await self._write_all(conn, transactions, annotations, result)
                else:
                    async with conn.transaction():
                        await self._write_all(conn, transactions, annotations, result)
                if not any(counts.inserted for counts in result.tables.values()):
                    await conn.execute(DURABLE_BARRIER)
        except Exception as exc:  # the Writer contract: every failure is data or an outage
            # (asyncpg's InternalClientError/ProtocolError are neither PostgresError nor
            # InterfaceError; escaping here, they left the batch unacked for good)
            await renew_if_server_gone(self._pool, exc)
            raise classify(exc) from exc
        return result

    def _one_statement(self, transactions: list[Record], annotations: list[Record]) -> bool:
        """The flush is one statement (the repeats step aside): it runs in autocommit; more
        run in one transaction, so that a flush is one database transaction."""
        if transactions and annotations:
            return False
        operations = sum(len(t.operations) for t in transactions if isinstance(t, Transaction))
        return (
            max(len(transactions), operations) <= self._tx_rows
            and len(annotations) <= self._ann_rows
        )

    async def _write_all(
        self,
        conn: Connection,
        transactions: list[Record],
        annotations: list[Record],
        result: WriteResult,
    ) -> None:
        if transactions:
            await self._write_transactions(conn, transactions, result)
        if annotations:
            await self._write_annotations(conn, annotations, result)

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
                    await self._write_all(conn, [transaction], [annotation], WriteResult())
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
        chunks = list(transaction_chunks(txs, self._tx_rows))
        # One chunk applies its balances itself. Several (in one DB transaction) apply them at
        # the end, all keys in one sorted order, as concurrent writers must take their locks.
        alone = len(chunks) == 1
        for chunk in chunks:
            arguments = transaction_arguments(chunk, balances=alone)
            rows = await conn.fetch(WRITE_TRANSACTIONS, *arguments)
            new_ids.update(row[0] for row in rows)
        counts = result.table("transactions")
        counts.attempted += len(records)
        counts.inserted += len(new_ids)
        counts.ignored += len(records) - len(new_ids)
        if not new_ids:
            return
        fresh = [t for t in txs if t.id in new_ids]
        operations = sum(len(t.operations) for t in fresh)
        ops = result.table("operations")
        ops.attempted += operations
        ops.inserted += operations
        deltas = balance_deltas(fresh)
        if deltas and not alone:
            keys = sorted(deltas)
            for part in chunked(keys, self._tx_rows):
                await conn.execute(APPLY_BALANCES, *balance_arguments(part, deltas))
        if deltas:
            bal = result.table("balances")
            bal.attempted += len(deltas)
            bal.inserted += len(deltas)

    async def _write_annotations(
        self, conn: Connection, records: list[Record], result: WriteResult
    ) -> None:
        unique, _ = dedupe_sorted(records)
        anns: list[CreditAnnotation] = [r for r in unique if isinstance(r, CreditAnnotation)]
        inserted = 0
        returned: list[list[asyncpg.Record]] = []
        for chunk in chunked(anns, self._ann_rows):
            rows = await conn.fetch(INSERT_ANNOTATIONS, *annotation_arguments(chunk))
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
            await conn.execute(RECORD_REPEATS, [job for job, _ in chunk], [ann for _, ann in chunk])


def _probe_records() -> tuple[Transaction, CreditAnnotation]:
    """Fresh ids each time, so that the insert is new and its operations and balance run."""

    def new_id() -> str:
        return uuid7()

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
            deltas[key] = exact.add(deltas.get(key, exact.ZERO), exact.signed(op))
    return deltas
