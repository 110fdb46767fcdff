"""The recorder's tables spread by a distribution key: what the shipped schema lacks, checked on
PostgreSQL 15 hash partitions (docs/performance.md, "When the database is next").

Citus places each row of a distributed table on the shard of its distribution column's hash,
and enforces a primary key, unique constraint or foreign key only when it holds that column; a
table ``PARTITION BY HASH`` on PostgreSQL 15 enforces the same rule on its unique constraints,
and ``ON CONFLICT`` needs a unique constraint matching its target. So these tests build the
recorder's tables hash-partitioned by their natural key in the test's own database, from the
catalog the migrations made:

- the ledger's tables by ``ledger_id`` (a transaction, its operations and its accounts'
  balances belong to one ledger: co-located, a flush of one ledger touches one shard);
- credit annotations, which belong to no ledger, by their own ``id``, and the job repeats by
  the annotation's id, co-located with it.

The shipped keys and conflict targets that lack the key are listed here exactly, so a migration
that changes one fails this module until the docs say what changed.
"""

from __future__ import annotations

import random
import re
from collections.abc import AsyncIterator, Sequence
from datetime import date
from decimal import Decimal

import asyncpg
import msgspec
import pytest

from bulk_recorder.infra.ids import uuid7
from bulk_recorder.infra.migrate import migrate
from bulk_recorder.recorder import statements
from bulk_recorder.records import CreditAnnotation, Operation, Transaction
from consumer.tools.generator import valid_document

pytestmark = [pytest.mark.postgres]

# The natural distribution key of each table the recorder writes.
DISTRIBUTION_KEY = {
    "transactions": "ledger_id",
    "operations": "ledger_id",  # its transaction's ledger
    "balances": "ledger_id",  # its account's ledger
    "credit_annotations": "id",  # no ledger: spread by its own id
    "credit_annotation_job_repeats": "annotation_id",  # beside its annotation
}

# What the shipped schema holds that lacks the key: (table, constraint) -> its definition.
LACKING = {
    ("transactions", "transactions_pkey"): "PRIMARY KEY (id)",
    ("operations", "operations_pkey"): "PRIMARY KEY (id)",
    ("operations", "operations_transaction_id_fkey"): (
        "FOREIGN KEY (transaction_id) REFERENCES transactions(id)"
    ),
    ("balances", "balances_pkey"): "PRIMARY KEY (account_id, asset_code)",
}
# The statements' conflict targets that lack it.
LACKING_TARGETS = {
    "WRITE_TRANSACTIONS": ["(id)", "(account_id, asset_code)"],
    "APPLY_BALANCES": ["(account_id, asset_code)"],
}
UNIQUE_REFUSED = "unique constraint on partitioned table must include all partitioning columns"
NO_MATCHING_CONSTRAINT = (
    "there is no unique or exclusion constraint matching the ON CONFLICT specification"
)


@pytest.fixture
async def conn(database_url: str) -> AsyncIterator[asyncpg.Connection]:
    """The test's database, migrated, with an empty schema ``dist`` first on the path."""
    await migrate(database_url)
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("CREATE SCHEMA dist; SET search_path = dist, public")
        yield connection
    finally:
        await connection.close()


async def shipped_constraints(conn: asyncpg.Connection) -> dict[tuple[str, str], tuple[str, ...]]:
    """(table, constraint) -> its columns, for every key, unique and foreign key the migrations
    made on the recorder's tables."""
    rows = await conn.fetch(
        "SELECT t.relname::text AS tbl, c.conname::text AS conname,"
        " array_agg(a.attname::text ORDER BY k.n) AS cols"
        " FROM pg_constraint AS c"
        " JOIN pg_class AS t ON t.oid = c.conrelid"
        " JOIN pg_namespace AS s ON s.oid = t.relnamespace AND s.nspname = 'public'"
        " CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(att, n)"
        " JOIN pg_attribute AS a ON a.attrelid = c.conrelid AND a.attnum = k.att"
        " WHERE c.contype IN ('p', 'u', 'f') AND t.relname = ANY($1::text[])"
        " GROUP BY 1, 2",
        list(DISTRIBUTION_KEY),
    )
    return {(r["tbl"], r["conname"]): tuple(r["cols"]) for r in rows}


async def test_the_keys_that_lack_the_distribution_key(conn: asyncpg.Connection) -> None:
    constraints = await shipped_constraints(conn)
    lacking = {key for key, cols in constraints.items() if DISTRIBUTION_KEY[key[0]] not in cols}
    # every unique index of these tables is one of their constraints (none hides outside them)
    loose = await conn.fetch(
        "SELECT i.indexrelid::regclass::text FROM pg_index AS i"
        " JOIN pg_class AS t ON t.oid = i.indrelid"
        " JOIN pg_namespace AS s ON s.oid = t.relnamespace AND s.nspname = 'public'"
        " WHERE i.indisunique AND t.relname = ANY($1::text[])"
        " AND NOT EXISTS (SELECT FROM pg_constraint AS c WHERE c.conindid = i.indexrelid)",
        list(DISTRIBUTION_KEY),
    )
    assert loose == []
    assert lacking == set(LACKING)
    for (table, name), definition in LACKING.items():
        shown = await conn.fetchval(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conname = $1 AND conrelid = $2::regclass",
            name,
            f"public.{table}",
        )
        assert shown == definition
    # operations and balances do not even hold the ledger: it is a column to add, not only a key
    columns = await conn.fetch(
        "SELECT table_name FROM information_schema.columns"
        " WHERE table_schema = 'public' AND column_name = 'ledger_id'"
    )
    assert {r["table_name"] for r in columns} == {"transactions"}


def test_the_conflict_targets_that_lack_the_distribution_key() -> None:
    # every table a target names holds its key only in the annotation statements
    targets = {
        name: re.findall(r"ON CONFLICT (\([^)]*\))", getattr(statements, name))
        for name in ("WRITE_TRANSACTIONS", "APPLY_BALANCES", "INSERT_ANNOTATIONS")
    }
    assert targets == {**LACKING_TARGETS, "INSERT_ANNOTATIONS": ["(id)"]}
    # the repeats infer their target: any unique constraint of the table, its key included
    assert "ON CONFLICT DO NOTHING" in statements.RECORD_REPEATS


async def hash_copy(
    conn: asyncpg.Connection, table: str, key: str, extra: str = "", modulus: int = 4
) -> None:
    """dist.<table>: the shipped columns, defaults and checks (and ``extra`` columns), hash
    partitioned by ``key`` in ``modulus`` partitions; no key or unique constraint yet."""
    extra_columns = f", {extra}" if extra else ""
    await conn.execute(
        f"CREATE TABLE dist.{table} (LIKE public.{table} INCLUDING DEFAULTS"
        f" INCLUDING CONSTRAINTS{extra_columns}) PARTITION BY HASH ({key})"
    )
    for remainder in range(modulus):
        await conn.execute(
            f"CREATE TABLE dist.{table}_h{remainder} PARTITION OF dist.{table}"
            f" FOR VALUES WITH (MODULUS {modulus}, REMAINDER {remainder})"
        )


async def test_postgres_refuses_the_shipped_keys_on_tables_hashed_by_the_key(
    conn: asyncpg.Connection,
) -> None:
    # operations and balances cannot be hashed by a ledger they do not hold
    for table in ("operations", "balances"):
        with pytest.raises(asyncpg.UndefinedColumnError) as refused:
            await hash_copy(conn, table, "ledger_id")
        assert refused.value.sqlstate == "42703"
        assert str(refused.value) == 'column "ledger_id" named in partition key does not exist'
    # the tables that hold their key take each shipped constraint in turn, or refuse it
    for table in ("transactions", "credit_annotations", "credit_annotation_job_repeats"):
        await hash_copy(conn, table, DISTRIBUTION_KEY[table])
    refused_here: dict[tuple[str, str], tuple[str, str, str | None]] = {}
    for table, name in sorted(await shipped_constraints(conn)):
        if table in ("operations", "balances"):
            continue
        definition = await conn.fetchval(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conname = $1 AND conrelid = $2::regclass",
            name,
            f"public.{table}",
        )
        try:
            await conn.execute(f"ALTER TABLE dist.{table} ADD CONSTRAINT {name} {definition}")
        except asyncpg.PostgresError as exc:
            refused_here[(table, name)] = (exc.sqlstate, exc.message, exc.detail)
    assert refused_here == {
        ("transactions", "transactions_pkey"): (
            "0A000",
            UNIQUE_REFUSED,
            'PRIMARY KEY constraint on table "transactions" lacks column "ledger_id" which is'
            " part of the partition key.",
        )
    }


async def build_keyed_schema(conn: asyncpg.Connection) -> None:
    """The schema a user would make: the ledger in every key of the ledger's tables, the
    annotations' keys as shipped (they already hold their distribution key)."""
    await hash_copy(conn, "transactions", "ledger_id")
    await hash_copy(conn, "operations", "ledger_id", "ledger_id uuid NOT NULL")
    await hash_copy(conn, "balances", "ledger_id", "ledger_id uuid NOT NULL")
    await hash_copy(conn, "credit_annotations", "id")
    await hash_copy(conn, "credit_annotation_job_repeats", "annotation_id")
    for ddl in (
        "ALTER TABLE dist.transactions ADD PRIMARY KEY (ledger_id, id)",
        "ALTER TABLE dist.operations ADD PRIMARY KEY (ledger_id, id)",
        "ALTER TABLE dist.operations ADD FOREIGN KEY (ledger_id, transaction_id)"
        " REFERENCES dist.transactions (ledger_id, id)",
        "ALTER TABLE dist.balances ADD PRIMARY KEY (ledger_id, account_id, asset_code)",
        "ALTER TABLE dist.credit_annotations ADD PRIMARY KEY (id)",
        "ALTER TABLE dist.credit_annotation_job_repeats ADD PRIMARY KEY (job_id, annotation_id)",
    ):
        await conn.execute(ddl)


def transaction(ledger: str, accounts: tuple[str, str], amount: str = "10.00") -> Transaction:
    value = Decimal(amount)
    legs = (
        Operation(uuid7(), accounts[0], "DEBIT", value, "BRL"),
        Operation(uuid7(), accounts[1], "CREDIT", value, "BRL"),
    )
    return Transaction(uuid7(), uuid7(), ledger, None, "APPROVED", "BRL", value, None, None, legs)


async def test_the_shipped_statements_need_the_key_in_their_conflict_targets(
    conn: asyncpg.Connection,
) -> None:
    await build_keyed_schema(conn)
    chunk = [transaction(uuid7(), (uuid7(), uuid7()))]
    with pytest.raises(asyncpg.InvalidColumnReferenceError) as refused:
        await conn.fetch(statements.WRITE_TRANSACTIONS, *statements.transaction_arguments(chunk))
    assert refused.value.sqlstate == "42P10"
    assert str(refused.value) == NO_MATCHING_CONSTRAINT
    with pytest.raises(asyncpg.InvalidColumnReferenceError):
        await conn.execute(statements.APPLY_BALANCES, uuid7(), "BRL", "1")
    # the annotations' statements run unchanged, exactly once, on tables hashed by id
    document = valid_document(random.Random(1), "CPF")
    annotation = CreditAnnotation(
        uuid7(), uuid7(), document, "CPF", "RESTRICTION", "Banco", Decimal("5.00"),
        date(2026, 1, 2), None,
    )  # fmt: skip
    arguments = statements.annotation_arguments([annotation])
    assert [r[0] for r in await conn.fetch(statements.INSERT_ANNOTATIONS, *arguments)] == [
        annotation.id
    ]
    assert await conn.fetch(statements.INSERT_ANNOTATIONS, *arguments) == []
    await conn.execute(statements.RECORD_REPEATS, [uuid7()], [annotation.id])
    assert await conn.fetchval("SELECT count(*) FROM dist.credit_annotation_job_repeats") == 1


# The transactions chunk with the ledger in every conflict target: a sketch of the change to
# WRITE_TRANSACTIONS (fewer columns, typed arrays), not a statement the recorder runs.
KEYED_WRITE = """
WITH new_transactions AS (
INSERT INTO dist.transactions (id, organization_id, ledger_id, status, asset_code, amount)
SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::text[], $5::text[], $6::numeric[])
ON CONFLICT (ledger_id, id) DO NOTHING
RETURNING id, ledger_id
), new_operations AS (
INSERT INTO dist.operations (ledger_id, id, transaction_id, account_id, type, amount, asset_code)
SELECT fresh.ledger_id, u.id, u.transaction_id, u.account_id, u.type, u.amount, u.asset_code
FROM unnest($7::uuid[], $8::uuid[], $9::uuid[], $10::text[], $11::numeric[], $12::text[])
     AS u(id, transaction_id, account_id, type, amount, asset_code)
JOIN new_transactions AS fresh ON fresh.id = u.transaction_id
RETURNING 1
), applied_balances AS (
INSERT INTO dist.balances AS b (ledger_id, account_id, asset_code, available)
SELECT fresh.ledger_id, u.account_id, u.asset_code,
       sum(CASE u.type WHEN 'CREDIT' THEN u.amount ELSE -u.amount END)
FROM unnest($8::uuid[], $9::uuid[], $10::text[], $11::numeric[], $12::text[])
     AS u(transaction_id, account_id, type, amount, asset_code)
JOIN new_transactions AS fresh ON fresh.id = u.transaction_id
GROUP BY fresh.ledger_id, u.account_id, u.asset_code
ON CONFLICT (ledger_id, account_id, asset_code)
DO UPDATE SET available = b.available + EXCLUDED.available, updated_at = now()
RETURNING 1
)
SELECT id::text FROM new_transactions
"""


async def keyed_write(conn: asyncpg.Connection, chunk: Sequence[Transaction]) -> list[str]:
    legs = [(op, t) for t in chunk for op in t.operations]
    rows = await conn.fetch(
        KEYED_WRITE,
        [t.id for t in chunk],
        [t.organization_id for t in chunk],
        [t.ledger_id for t in chunk],
        [t.status for t in chunk],
        [t.asset_code for t in chunk],
        [t.amount for t in chunk],
        [op.id for op, _ in legs],
        [t.id for _, t in legs],
        [op.account_id for op, _ in legs],
        [op.type for op, _ in legs],
        [op.amount for op, _ in legs],
        [op.asset_code for op, _ in legs],
    )
    return sorted(r[0] for r in rows)


async def test_keys_with_the_ledger_keep_a_write_exactly_once_and_a_ledger_on_one_shard(
    conn: asyncpg.Connection,
) -> None:
    await build_keyed_schema(conn)
    ledger_a, ledger_b = uuid7(), uuid7()
    alice, bob, carol = uuid7(), uuid7(), uuid7()
    chunk = [
        transaction(ledger_a, (alice, bob), "10.00"),
        transaction(ledger_a, (alice, bob), "2.50"),
        transaction(ledger_b, (carol, alice), "1.00"),
    ]
    assert await keyed_write(conn, chunk) == sorted(t.id for t in chunk)
    assert await keyed_write(conn, chunk) == []  # the redelivery changes nothing
    balances = await conn.fetch(
        "SELECT ledger_id::text, account_id::text, available FROM dist.balances"
    )
    assert {(r[0], r[1]): r[2] for r in balances} == {
        (ledger_a, alice): Decimal("-12.50"),
        (ledger_a, bob): Decimal("12.50"),
        (ledger_b, carol): Decimal("-1.00"),
        (ledger_b, alice): Decimal("1.00"),
    }
    # co-located: each ledger's transactions, operations and balances sit in the partition of
    # the same remainder (the same shard, in Citus's terms)
    for ledger in (ledger_a, ledger_b):
        remainders = {
            str(name).rsplit("_", 1)[1]
            for table in ("transactions", "operations", "balances")
            for (name,) in await conn.fetch(
                f"SELECT DISTINCT tableoid::regclass::text FROM dist.{table} WHERE ledger_id = $1",
                ledger,
            )
        }
        assert len(remainders) == 1, remainders
    # what the contract loses: an id is unique within its ledger only, so the same id sent
    # under another ledger is a second row, where the shipped key made it a repeat
    moved = msgspec.structs.replace(transaction(ledger_b, (carol, bob)), id=chunk[0].id)
    assert await keyed_write(conn, [moved]) == [chunk[0].id]
    assert (
        await conn.fetchval("SELECT count(*) FROM dist.transactions WHERE id = $1", chunk[0].id)
        == 2
    )
