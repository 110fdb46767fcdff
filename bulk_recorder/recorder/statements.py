"""The SQL a flush sends, and how a flush's rows are cut into statements.

A transaction chunk is written by one statement: the transactions insert, the operations of the
transactions it reported as new, and their balance deltas, as data-modifying CTEs. One round
trip, and atomic on its own (a statement commits whole or not at all in autocommit), so a flush
needs no BEGIN or COMMIT: five round trips became one, which is what a database a network hop
away charges for.

Row order is the order of the arrays sent (``WITH ORDINALITY`` keeps it through the joins),
and the writer sends every key sorted, so concurrent writers take row locks in one order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any

from bulk_recorder.records import CreditAnnotation, Operation, Transaction

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
# A balance contribution: one APPROVED operation's signed amount, applied only if its
# transaction is new.
CONTRIBUTION_COLUMNS = ("account_id", "asset_code", "transaction_id", "delta")
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

WRITE_TRANSACTIONS = """
WITH new_transactions AS (
INSERT INTO transactions (id, organization_id, ledger_id, description, status, asset_code,
                          amount, created_at, metadata)
SELECT u.id::uuid, u.organization_id::uuid, u.ledger_id::uuid, u.description, u.status,
       u.asset_code, u.amount::numeric, coalesce(u.created_at, now()), u.metadata::jsonb
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::text[], $8::timestamptz[], $9::text[])
     WITH ORDINALITY AS u(id, organization_id, ledger_id, description, status, asset_code,
                          amount, created_at, metadata, n)
ORDER BY u.n
ON CONFLICT (id) DO NOTHING
RETURNING id
), new_operations AS (
INSERT INTO operations (id, transaction_id, account_id, type, amount, asset_code, created_at)
SELECT u.id::uuid, u.transaction_id::uuid, u.account_id::uuid, u.type, u.amount::numeric,
       u.asset_code, coalesce(u.created_at, now())
FROM unnest($10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[],
            $16::timestamptz[])
     WITH ORDINALITY AS u(id, transaction_id, account_id, type, amount, asset_code, created_at,
                          n)
JOIN new_transactions AS fresh ON fresh.id = u.transaction_id::uuid
ORDER BY u.n
RETURNING 1
), applied_balances AS (
INSERT INTO balances AS b (account_id, asset_code, available)
SELECT u.account_id::uuid, u.asset_code, sum(u.delta::numeric)
FROM unnest($17::text[], $18::text[], $19::text[], $20::text[])
     WITH ORDINALITY AS u(account_id, asset_code, transaction_id, delta, n)
JOIN new_transactions AS fresh ON fresh.id = u.transaction_id::uuid
GROUP BY u.account_id, u.asset_code
ORDER BY min(u.n)
ON CONFLICT (account_id, asset_code)
DO UPDATE SET available = b.available + EXCLUDED.available, updated_at = now()
RETURNING 1
)
SELECT id::text FROM new_transactions
"""

INSERT_ANNOTATIONS = """
INSERT INTO credit_annotations (id, job_id, document, document_type, kind, creditor, amount,
                                occurred_on, reason)
SELECT u.id::uuid, u.job_id::uuid, u.document, u.document_type, u.kind, u.creditor,
       u.amount::numeric, u.occurred_on, u.reason
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
            $7::text[], $8::date[], $9::text[])
     WITH ORDINALITY AS u(id, job_id, document, document_type, kind, creditor, amount,
                          occurred_on, reason, n)
ORDER BY u.n
ON CONFLICT (id) DO NOTHING
RETURNING id::text
"""

# Only for pairs whose id is stored with another job (or none): a job's own rows never repeat.
RECORD_REPEATS = """
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


def transaction_chunks(
    transactions: Sequence[Transaction], max_rows: int
) -> Iterator[Sequence[Transaction]]:
    """Consecutive slices whose transactions, and whose operations, number at most ``max_rows``
    each (a transaction with more operations than that goes alone: validation caps a
    transaction at 1,000 operations, the default limit)."""
    start = 0
    operations = 0
    for index, transaction in enumerate(transactions):
        ops = len(transaction.operations)
        if index > start and (index - start >= max_rows or operations + ops > max_rows):
            yield transactions[start:index]
            start, operations = index, 0
        operations += ops
    if start < len(transactions):
        yield transactions[start:]


def transaction_arguments(chunk: Sequence[Transaction]) -> list[list[Any]]:
    """The 20 arrays of WRITE_TRANSACTIONS; transactions, operations and balance keys sorted."""
    operations = sorted(((op, t) for t in chunk for op in t.operations), key=_operation_id)
    contributions = sorted(
        (op.account_id, op.asset_code, t.id, _signed(op))
        for t in chunk
        if t.status == "APPROVED"
        for op in t.operations
    )
    return [
        [t.id for t in chunk],
        [t.organization_id for t in chunk],
        [t.ledger_id for t in chunk],
        [t.description for t in chunk],
        [t.status for t in chunk],
        [t.asset_code for t in chunk],
        [str(t.amount) for t in chunk],
        [t.created_at for t in chunk],
        [t.metadata for t in chunk],
        [op.id for op, _ in operations],
        [t.id for _, t in operations],
        [op.account_id for op, _ in operations],
        [op.type for op, _ in operations],
        [str(op.amount) for op, _ in operations],
        [op.asset_code for op, _ in operations],
        [t.created_at for _, t in operations],
        [c[0] for c in contributions],
        [c[1] for c in contributions],
        [c[2] for c in contributions],
        [str(c[3]) for c in contributions],
    ]


def annotation_arguments(chunk: Sequence[CreditAnnotation]) -> list[list[Any]]:
    """The 9 arrays of INSERT_ANNOTATIONS."""
    return [
        [a.id for a in chunk],
        [a.job_id for a in chunk],
        [a.document for a in chunk],
        [a.document_type for a in chunk],
        [a.kind for a in chunk],
        [a.creditor for a in chunk],
        [str(a.amount) for a in chunk],
        [a.occurred_on for a in chunk],
        [a.reason for a in chunk],
    ]


def _operation_id(pair: tuple[Operation, Transaction]) -> str:
    return pair[0].id


def _signed(op: Operation) -> Decimal:
    return op.amount if op.type == "CREDIT" else -op.amount
