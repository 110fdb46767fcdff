"""SQL of the growth benchmark: prefill the ledger tables, and read WAL and sizes.

Prefill (by SQL, not through the queue). Transaction ``i`` of the prefill has the Unix
millisecond ``base_ms + i`` (``base_ms`` two days before the database was made, so every
prefilled row is older than the rows a drain sends, and points added later continue the
timeline); its two operations share it. Accounts are ``md5('acct' || n)::uuid`` for ``n`` in
[0, 1,000,000): the drain's generator draws the same universe (:mod:`growth_load`). Ids are
``gen_random_uuid()`` (v4) or ``bench_uuid7(ms)`` (v7, RFC 9562: 48-bit ms, version 7, then the
random bits of a v4).

Indexes: the project's schema (``migrate``) is loaded, then its indexes on the three ledger
tables are dropped, the rows inserted, and the same definitions built again, the ones led by a
random key with ``fillfactor = 70`` (the page fill random inserts leave, about ln 2), the ones
led by an ever larger key with the default 90 (what appends leave), and the fillfactor reset
afterwards so that the drain's inserts split pages as usual. That is much faster than inserting
with the indexes present and gives the page fill those inserts would have left.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import asyncpg

ACCOUNTS = 1_000_000
LEDGERS = 10
JOB_LINES = 300_000  # a prefilled job's lines (the API's largest upload)
LEDGER_TABLES = ("transactions", "operations", "credit_annotations")
SIZE_TABLES = (*LEDGER_TABLES, "balances")

HELPERS = """
CREATE EXTENSION IF NOT EXISTS pg_walinspect;
CREATE TABLE IF NOT EXISTS bench_meta (base_ms bigint NOT NULL, step_ms bigint NOT NULL);
INSERT INTO bench_meta
    SELECT (extract(epoch FROM now()) * 1000)::bigint - {days} * 86400000::bigint, {step_ms}
    WHERE NOT EXISTS (SELECT FROM bench_meta);
-- RFC 9562 UUIDv7: 48-bit Unix ms, version 7, 12 + 62 random bits (variant 10) from a v4.
CREATE OR REPLACE FUNCTION bench_uuid7(ms bigint) RETURNS uuid LANGUAGE sql VOLATILE AS $$
    SELECT (lpad(to_hex(ms), 12, '0') || '7' || substr(h, 14, 3) || substr(h, 17))::uuid
    FROM (SELECT replace(gen_random_uuid()::text, '-', '') AS h) r
$$;
-- A v7 id that is the same for every line of one job (its first line's ms, md5 bits).
CREATE OR REPLACE FUNCTION bench_job7(ms bigint, j bigint) RETURNS uuid LANGUAGE sql AS $$
    SELECT (lpad(to_hex(ms), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid
    FROM (SELECT md5('job' || j) AS h) r
$$;
"""


def helpers_sql(days: int = 2, step_ms: int = 1) -> str:
    """The helpers, and the prefill's timeline: ``days`` ago, ``step_ms`` a transaction."""
    return HELPERS.replace("{days}", str(days)).replace("{step_ms}", str(step_ms))


def account_uuid_sql(expr: str) -> str:
    return f"md5('acct' || ({expr}))::uuid"


def _id(kind: str, ms: str) -> str:
    return "gen_random_uuid()" if kind == "v4" else f"bench_uuid7({ms})"


def transactions_sql(kind: str, accounts: int = ACCOUNTS) -> str:
    """Insert transactions $1 <= i < $2 and their two operations each."""
    ms = "(m.base_ms + g * m.step_ms)"
    return f"""
WITH t AS (
    INSERT INTO transactions (id, organization_id, ledger_id, description, status, asset_code,
                              amount, created_at, metadata, recorded_at)
    SELECT {_id(kind, ms)}, md5('org0')::uuid, md5('ledger' || (g % {LEDGERS}))::uuid,
           'load test transfer', 'APPROVED', 'BRL', (1 + g % 99999) / 100.0,
           to_timestamp({ms} / 1000.0), jsonb_build_object('source', 'prefill', 'n', g % 1000),
           to_timestamp({ms} / 1000.0)
    FROM generate_series($1::bigint, $2::bigint - 1) g, bench_meta m
    RETURNING id, amount, created_at
)
INSERT INTO operations (id, transaction_id, account_id, type, amount, asset_code, created_at)
SELECT {_id(kind, "(extract(epoch FROM t.created_at) * 1000)::bigint")}, t.id,
       {account_uuid_sql(f"floor(random() * {accounts})::int")}, k.type, t.amount, 'BRL',
       t.created_at
FROM t CROSS JOIN (VALUES ('DEBIT'), ('CREDIT')) k(type)
"""


def annotations_sql(kind: str) -> str:
    """Insert credit annotations $1 <= i < $2 (a job per JOB_LINES lines, random documents)."""
    ms = "(m.base_ms + g * m.step_ms)"
    job_ms = f"(m.base_ms + (g / {JOB_LINES}) * {JOB_LINES} * m.step_ms)"
    job = (
        f"md5('job' || (g / {JOB_LINES}))::uuid"
        if kind == "v4"
        else f"bench_job7({job_ms}, g / {JOB_LINES})"
    )
    return f"""
INSERT INTO credit_annotations (id, job_id, document, document_type, kind, creditor, amount,
                                occurred_on, reason, recorded_at)
SELECT {_id(kind, ms)}, {job}, lpad(floor(random() * 1e11)::bigint::text, 11, '0'), 'CPF',
       'RESTRICTION', 'Banco Exemplo S.A.', (g % 100000) / 100.0,
       to_timestamp({ms} / 1000.0)::date, 'overdue payment', to_timestamp({ms} / 1000.0)
FROM generate_series($1::bigint, $2::bigint - 1) g, bench_meta m
"""


def balances_sql(accounts: int = ACCOUNTS) -> str:
    """A balance for every account of the universe (inserted with the primary key present)."""
    return f"""
INSERT INTO balances (account_id, asset_code, available, updated_at)
SELECT {account_uuid_sql("n")}, 'BRL', 1000, now() FROM generate_series(0, {accounts - 1}) n
ON CONFLICT DO NOTHING
"""


@dataclass(slots=True)
class IndexDef:
    table: str
    name: str
    definition: str  # CREATE [UNIQUE] INDEX ...
    constraint: str | None  # the primary key's name when the index backs it


def random_keyed(index: str, kind: str) -> bool:
    """Is the index led by a random key (its inserts land anywhere)?"""
    if index in ("operations_account_idx", "credit_annotations_document_idx"):
        return True
    return kind == "v4" and (index.endswith("_pkey") or index == "operations_transaction_idx")


async def index_defs(conn: asyncpg.Connection) -> list[IndexDef]:
    rows = await conn.fetch(
        """
        SELECT c.relname AS tbl, i.relname AS name, pg_get_indexdef(x.indexrelid) AS def,
               k.conname
        FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
        JOIN pg_class c ON c.oid = x.indrelid
        LEFT JOIN pg_constraint k ON k.conindid = x.indexrelid AND k.contype = 'p'
        WHERE c.relname = ANY($1::text[]) ORDER BY c.relname, i.relname
        """,
        list(LEDGER_TABLES),
    )
    return [IndexDef(r["tbl"], r["name"], r["def"], r["conname"]) for r in rows]


async def foreign_keys(conn: asyncpg.Connection) -> list[tuple[str, str, str]]:
    rows = await conn.fetch(
        """
        SELECT conrelid::regclass::text AS tbl, conname, pg_get_constraintdef(oid) AS def
        FROM pg_constraint WHERE contype = 'f' AND conparentid = 0
          AND conrelid::regclass::text = ANY($1::text[])
        """,
        list(LEDGER_TABLES),
    )
    return [(r["tbl"], r["conname"], r["def"]) for r in rows]


async def partitioned(conn: asyncpg.Connection, table: str) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT FROM pg_partitioned_table WHERE partrelid = $1::regclass)",
            table,
        )
    )


async def drop_ledger_indexes(
    conn: asyncpg.Connection,
) -> tuple[list[IndexDef], list[tuple[str, str, str]]]:
    indexes, fks = await index_defs(conn), await foreign_keys(conn)
    for table, name, _ in fks:
        await conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
    for ix in indexes:
        if ix.constraint:
            await conn.execute(f"ALTER TABLE {ix.table} DROP CONSTRAINT {ix.constraint}")
        else:
            await conn.execute(f"DROP INDEX {ix.name}")
    return indexes, fks


def with_fillfactor(definition: str, fillfactor: int) -> str:
    """The definition with ``WITH (fillfactor = N)`` before its WHERE (or at its end), in place
    of any storage parameters it had."""
    definition = re.sub(r" WITH \([^)]*\)", "", definition)
    match = re.search(r"\) WHERE ", definition)
    where = match.start() + 1 if match else len(definition)
    return f"{definition[:where]} WITH (fillfactor = {fillfactor}){definition[where:]}"


async def create_index(conn: asyncpg.Connection, ix: IndexDef, kind: str) -> None:
    fill = 70 if random_keyed(ix.name, kind) else 90
    if await partitioned(conn, ix.table):
        await _create_partitioned_index(conn, ix, fill)
        return
    await conn.execute(with_fillfactor(ix.definition, fill))
    await conn.execute(f"ALTER INDEX {ix.name} RESET (fillfactor)")
    if ix.constraint:
        await conn.execute(
            f"ALTER TABLE {ix.table} ADD CONSTRAINT {ix.constraint} PRIMARY KEY USING INDEX "
            f"{ix.name}"
        )


async def _create_partitioned_index(conn: asyncpg.Connection, ix: IndexDef, fill: int) -> None:
    """On a partitioned table: the index of every partition (ON the parent, not ON ONLY);
    a primary key is added as a constraint (PostgreSQL has no USING INDEX for partitioned
    tables), with the default page fill of a build."""
    definition = ix.definition.replace(" ON ONLY ", " ON ")
    if ix.constraint:
        columns = definition[definition.index(" USING btree ") + len(" USING btree ") :]
        await conn.execute(
            f"ALTER TABLE {ix.table} ADD CONSTRAINT {ix.constraint} PRIMARY KEY {columns}"
        )
        return
    await conn.execute(with_fillfactor(definition, fill))
    children = await conn.fetch(
        "SELECT inhrelid::regclass::text AS c FROM pg_inherits WHERE inhparent = $1::regclass",
        ix.name,
    )
    for child in children:
        await conn.execute(f"ALTER INDEX {child['c']} RESET (fillfactor)")


async def restore_ledger_indexes(
    conn: asyncpg.Connection,
    indexes: list[IndexDef],
    fks: list[tuple[str, str, str]],
    kind: str,
) -> None:
    for ix in indexes:
        await create_index(conn, ix, kind)
    for table, name, definition in fks:
        await conn.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")


# -- measuring -------------------------------------------------------------------------------


@dataclass(slots=True)
class WalMark:
    lsn: str
    records: int
    fpi: int
    bytes: int
    checkpoints: int


async def wal_mark(conn: asyncpg.Connection) -> WalMark:
    row = await conn.fetchrow(
        """
        SELECT pg_current_wal_insert_lsn()::text AS lsn, w.wal_records, w.wal_fpi,
               w.wal_bytes::bigint AS wal_bytes, b.checkpoints_timed + b.checkpoints_req AS cp
        FROM pg_stat_wal w, pg_stat_bgwriter b
        """
    )
    assert row is not None
    return WalMark(row["lsn"], row["wal_records"], row["wal_fpi"], row["wal_bytes"], row["cp"])


async def wal_between(conn: asyncpg.Connection, a: WalMark, b: WalMark) -> int:
    return int(
        await conn.fetchval(
            "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)", b.lsn, a.lsn
        )
    )


async def table_sizes(conn: asyncpg.Connection) -> dict[str, int]:
    """pg_total_relation_size (heap + indexes + TOAST) of each table and its partitions."""
    rows = await conn.fetch(
        "SELECT t, coalesce((SELECT sum(pg_total_relation_size(p.relid))"
        " FROM pg_partition_tree(t) p), pg_total_relation_size(t)) AS s"
        " FROM unnest($1::text[]) t",
        list(SIZE_TABLES),
    )
    return {r["t"]: int(r["s"]) for r in rows}


async def relation_pages(conn: asyncpg.Connection) -> dict[str, int]:
    """Main-fork pages of every table and index of the ledger (for the page-touch model)."""
    rows = await conn.fetch(
        """
        SELECT c.relname, pg_relation_size(c.oid) / 8192 AS pages FROM pg_class c
        WHERE c.relname = ANY($1::text[]) OR c.oid IN (
            SELECT indexrelid FROM pg_index WHERE indrelid::regclass::text = ANY($1::text[]))
        """,
        list(SIZE_TABLES),
    )
    return {r["relname"]: int(r["pages"]) for r in rows}


# pg_walinspect (PG15): one row per WAL record; the relation is the first block reference's
# relfilenode; a record without block (commit, running xacts) counts under "-".
PER_RELATION = r"""
SELECT coalesce(coalesce(pg_partition_root(pg_filenode_relation(0, (m[1])::oid)),
                         pg_filenode_relation(0, (m[1])::oid))::text,
                CASE WHEN m IS NULL THEN '-' ELSE 'filenode ' || m[1] END) AS rel,
       count(*) AS records, sum(record_length)::bigint AS bytes,
       sum(fpi_length)::bigint AS fpi_bytes,
       sum((SELECT count(*) FROM regexp_matches(coalesce(block_ref, ''), 'FPW', 'g')))::bigint
           AS fpis
FROM pg_get_wal_records_info($1::text::pg_lsn,
                             least($2::text::pg_lsn, pg_current_wal_flush_lsn())) w
LEFT JOIN LATERAL regexp_match(coalesce(block_ref, ''), 'rel \d+/\d+/(\d+)') m ON true
GROUP BY 1 ORDER BY 3 DESC
"""


async def wal_per_relation(
    conn: asyncpg.Connection, start: str, end: str
) -> dict[str, dict[str, int]]:
    rows = await conn.fetch(PER_RELATION, start, end)
    return {
        r["rel"]: {
            "records": int(r["records"]),
            "bytes": int(r["bytes"]),
            "fpi_bytes": int(r["fpi_bytes"] or 0),
            "fpis": int(r["fpis"] or 0),
        }
        for r in rows
    }
