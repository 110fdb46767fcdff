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
from datetime import datetime
from decimal import Decimal
from typing import Any

from bulk_recorder.records import CreditAnnotation, Operation, Transaction
from bulk_recorder.records.exact import signed
from settings import MAX_ROWS_PER_INSERT, PG_MAX_PARAMETERS

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
       u.asset_code, u.amount::numeric, coalesce(nullif(u.created_at, '')::timestamptz, now()),
       u.metadata::jsonb
FROM unnest(string_to_array($1::text, ','), string_to_array($2::text, ','),
            string_to_array($3::text, ','), $4::text[], string_to_array($5::text, ','),
            string_to_array($6::text, ','), string_to_array($7::text, ','),
            string_to_array($8::text, ','), $9::text[])
     WITH ORDINALITY AS u(id, organization_id, ledger_id, description, status, asset_code,
                          amount, created_at, metadata, n)
ORDER BY u.n
ON CONFLICT (id) DO NOTHING
RETURNING id
), new_operations AS (
INSERT INTO operations (id, transaction_id, account_id, type, amount, asset_code, created_at)
SELECT u.id::uuid, u.transaction_id::uuid, u.account_id::uuid, u.type, u.amount::numeric,
       u.asset_code, coalesce(nullif(u.created_at, '')::timestamptz, now())
FROM unnest(string_to_array($10::text, ','), string_to_array($11::text, ','),
            string_to_array($12::text, ','), string_to_array($13::text, ','),
            string_to_array($14::text, ','), string_to_array($15::text, ','),
            string_to_array($16::text, ','))
     WITH ORDINALITY AS u(id, transaction_id, account_id, type, amount, asset_code, created_at,
                          n)
JOIN new_transactions AS fresh ON fresh.id = u.transaction_id::uuid
ORDER BY u.n
RETURNING 1
), applied_balances AS (
INSERT INTO balances AS b (account_id, asset_code, available)
SELECT u.account_id::uuid, u.asset_code, sum(u.delta::numeric)
FROM unnest(string_to_array($17::text, ','), string_to_array($18::text, ','),
            string_to_array($19::text, ','), string_to_array($20::text, ','))
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

# A flush of several chunks: its balance deltas, summed per key in Python, sent in key order.
APPLY_BALANCES = """
INSERT INTO balances AS b (account_id, asset_code, available)
SELECT u.account_id::uuid, u.asset_code, u.delta::numeric
FROM unnest(string_to_array($1::text, ','), string_to_array($2::text, ','),
            string_to_array($3::text, ','))
     WITH ORDINALITY AS u(account_id, asset_code, delta, n)
ORDER BY u.n
ON CONFLICT (account_id, asset_code)
DO UPDATE SET available = b.available + EXCLUDED.available, updated_at = now()
"""

INSERT_ANNOTATIONS = """
INSERT INTO credit_annotations (id, job_id, document, document_type, kind, creditor, amount,
                                occurred_on, reason)
SELECT u.id::uuid, nullif(u.job_id, '')::uuid, u.document, u.document_type, u.kind,
       u.creditor, u.amount::numeric, u.occurred_on::date, u.reason
FROM unnest(string_to_array($1::text, ','), string_to_array($2::text, ','),
            string_to_array($3::text, ','), string_to_array($4::text, ','),
            string_to_array($5::text, ','), $6::text[], string_to_array($7::text, ','),
            string_to_array($8::text, ','), $9::text[])
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


def transaction_arguments(
    chunk: Sequence[Transaction], *, balances: bool = True
) -> list[str | list[str | None]]:
    """The 20 parameters of WRITE_TRANSACTIONS; transactions, operations and balance keys
    sorted. Free text (description, metadata) goes as arrays; every other column as one
    comma-joined string (see _joined). Without ``balances`` the statement moves none (the
    writer applies a many-chunk flush's balances at its end, with APPLY_BALANCES)."""
    operations = sorted(((op, t) for t in chunk for op in t.operations), key=_operation_id)
    contributions = sorted(
        (op.account_id, op.asset_code, t.id, signed(op))
        for t in chunk
        if balances and t.status == "APPROVED"
        for op in t.operations
    )
    created = [_timestamp(t.created_at) for t in chunk]
    created_by_tx = dict(zip((t.id for t in chunk), created, strict=True))
    return [
        _joined([t.id for t in chunk]),
        _joined([t.organization_id for t in chunk]),
        _joined([t.ledger_id for t in chunk]),
        [t.description for t in chunk],
        _joined([t.status for t in chunk]),
        _joined([t.asset_code for t in chunk]),
        _joined([str(t.amount) for t in chunk]),
        _joined(created),
        [t.metadata for t in chunk],
        _joined([op.id for op, _ in operations]),
        _joined([t.id for _, t in operations]),
        _joined([op.account_id for op, _ in operations]),
        _joined([op.type for op, _ in operations]),
        _joined([str(op.amount) for op, _ in operations]),
        _joined([op.asset_code for op, _ in operations]),
        _joined([created_by_tx[t.id] for _, t in operations]),
        _joined([c[0] for c in contributions]),
        _joined([c[1] for c in contributions]),
        _joined([c[2] for c in contributions]),
        _joined([str(c[3]) for c in contributions]),
    ]


def balance_arguments(
    keys: Sequence[tuple[str, str]], deltas: dict[tuple[str, str], Decimal]
) -> list[str]:
    """The 3 parameters of APPLY_BALANCES, in the order of ``keys`` (sorted by the caller)."""
    return [
        _joined([k[0] for k in keys]),
        _joined([k[1] for k in keys]),
        _joined([str(deltas[k]) for k in keys]),
    ]


def annotation_arguments(chunk: Sequence[CreditAnnotation]) -> list[str | list[str | None]]:
    """The 9 parameters of INSERT_ANNOTATIONS: free text (creditor, reason) as arrays."""
    return [
        _joined([a.id for a in chunk]),
        _joined([a.job_id or "" for a in chunk]),
        _joined([a.document for a in chunk]),
        _joined([a.document_type for a in chunk]),
        _joined([a.kind for a in chunk]),
        [a.creditor for a in chunk],
        _joined([str(a.amount) for a in chunk]),
        _joined([a.occurred_on.isoformat() for a in chunk]),
        [a.reason for a in chunk],
    ]


def _joined(values: list[str]) -> str:
    """One string for a column of validated, comma-free values (ids, codes, amounts, dates;
    "" for none), split again by ``string_to_array``. asyncpg encodes a text array element by
    element, 0.3 us each on this machine: about 9 us a transaction message, a tenth of the
    recorder's CPU, against 0.6 us for the joined string (benchmarks/RESULTS.md, section 10)."""
    return ",".join(values)


def _timestamp(value: datetime | None) -> str:
    return "" if value is None else value.isoformat()


def _operation_id(pair: tuple[Operation, Transaction]) -> str:
    return pair[0].id
