"""Rows/s for each way of writing a 1,000-row chunk with ``ON CONFLICT (id) DO NOTHING``.

    python -m benchmarks.bench_writer                       # quick: 20 chunks a cell, 3 runs
    python -m benchmarks.bench_writer --chunks 100 --prefill 1000000   # full size

Methods, each chunk in its own transaction (BEGIN ... COMMIT), as the recorder does:
- ``values``: one multi-row ``INSERT ... VALUES ($1..$9), ($10..$18) ... RETURNING id``;
- ``unnest``: ``INSERT ... SELECT FROM unnest($1::uuid[], ...) RETURNING id`` (what
  bulk_recorder/writer.py did before it sent uuids and numerics as text arrays);
- ``joined``: the same, but every column whose text cannot hold a comma is sent as one
  comma-joined string and split by ``string_to_array`` (free text stays an array);
- ``copy_temp``: COPY into a temp table ``ON COMMIT DELETE ROWS``, then ``INSERT ... SELECT``;
- ``executemany``: one statement per row, pipelined by asyncpg (cannot say which ids were new);
- ``copy_plain``: plain COPY into the table, no conflict handling (the limit; aborts on a
  duplicate, so only at 0% duplicates);
- ``pgwriter``: the real ``PgWriter.write`` (for transactions it also writes the operations and
  the balances of the new transactions, so its rows/s counts transactions).

Cases: 0% and 50% duplicates (half of each chunk repeats ids of the previous chunk), ids sorted
(UUIDv7 sorted within the chunk, as the writer sorts) or random (UUIDv4, unsorted). Each
(table, id order, run) starts from a fresh table pre-filled with ``--prefill`` rows of the same
id kind, and the methods take turns (their order rotates per run). Rows/s counts rows offered.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import msgspec

from benchmarks.support.env import run_main
from benchmarks.support.machine import facts_table, machine_facts
from benchmarks.support.services import temp_database
from benchmarks.support.stats import Stat, emit, progress, ratio, save_json, table
from bulk_recorder.infra.ids import uuid7
from bulk_recorder.recorder.writer import ANNOTATION_COLUMNS, TRANSACTION_COLUMNS, PgWriter
from bulk_recorder.records import CreditAnnotation, Record, Transaction, decode
from consumer.tools.generator import Generator

CHUNK = 1000
TABLES: dict[str, tuple[str, ...]] = {
    "credit_annotations": ANNOTATION_COLUMNS,
    "transactions": TRANSACTION_COLUMNS,
}
TYPES: dict[str, tuple[str, ...]] = {
    "credit_annotations": (
        "uuid",
        "uuid",
        "text",
        "text",
        "text",
        "text",
        "numeric",
        "date",
        "text",
    ),
    "transactions": (
        "uuid",
        "uuid",
        "uuid",
        "text",
        "text",
        "text",
        "numeric",
        "timestamptz",
        "jsonb",
    ),
}
METHODS = ("values", "unnest", "joined", "copy_temp", "executemany", "copy_plain", "pgwriter")
ORDERS = ("sorted", "random")


# -- rows --------------------------------------------------------------------------------------


def make_records(table_name: str, count: int, order: str, seed: int = 1) -> list[Record]:
    """Valid records through decode(); UUIDv7 ids for "sorted", UUIDv4 for "random"."""
    gen = Generator.create(seed)
    rng = random.Random(seed)
    record_type = "transaction" if table_name == "transactions" else "credit_annotation"
    out: list[Record] = []
    for _ in range(count):
        body = json.dumps(gen.record(record_type)).encode()
        record = decode(body, record_type)
        if order == "random":
            record = msgspec.structs.replace(record, id=str(uuid.UUID(int=rng.getrandbits(128))))
        out.append(record)
    return out


def fresh_ids(records: Sequence[Record], order: str, rng: random.Random) -> list[Record]:
    """The same records under new ids of the same kind (so no chunk repeats another's ids);
    a transaction's operations get new ids too."""

    def new_id() -> str:
        if order == "random":
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        return uuid7(rng)

    out: list[Record] = []
    for r in records:
        if isinstance(r, Transaction):
            ops = tuple(msgspec.structs.replace(op, id=new_id()) for op in r.operations)
            out.append(msgspec.structs.replace(r, id=new_id(), operations=ops))
        else:
            out.append(msgspec.structs.replace(r, id=new_id()))
    return out


def row_of(record: Record) -> tuple[Any, ...]:
    if isinstance(record, Transaction):
        t = record
        return (
            t.id,
            t.organization_id,
            t.ledger_id,
            t.description,
            t.status,
            t.asset_code,
            t.amount,
            t.created_at,
            t.metadata,
        )
    assert isinstance(record, CreditAnnotation)
    a = record
    return (
        a.id,
        a.job_id,
        a.document,
        a.document_type,
        a.kind,
        a.creditor,
        a.amount,
        a.occurred_on,
        a.reason,
    )


# -- methods -----------------------------------------------------------------------------------

Conn = asyncpg.Connection
Method = Callable[[Conn, str, Sequence[tuple[Any, ...]]], Awaitable[int]]


def _values_sql(table_name: str, rows: int) -> str:
    cols = TABLES[table_name]
    n = len(cols)
    groups = ",".join(
        "(" + ",".join(f"${i * n + j + 1}" for j in range(n)) + ")" for i in range(rows)
    )
    return (
        f"INSERT INTO {table_name} ({','.join(cols)}) VALUES {groups} "
        "ON CONFLICT (id) DO NOTHING RETURNING id"
    )


async def m_values(conn: Conn, table_name: str, rows: Sequence[tuple[Any, ...]]) -> int:
    flat = [v for row in rows for v in row]
    return len(await conn.fetch(_values_sql(table_name, len(rows)), *flat))


def _unnest_sql(table_name: str) -> str:
    cols = TABLES[table_name]
    arrays = ", ".join(f"${i + 1}::{t}[]" for i, t in enumerate(TYPES[table_name]))
    return (
        f"INSERT INTO {table_name} ({','.join(cols)}) SELECT * FROM unnest({arrays}) "
        "ON CONFLICT (id) DO NOTHING RETURNING id"
    )


async def m_unnest(conn: Conn, table_name: str, rows: Sequence[tuple[Any, ...]]) -> int:
    columns = [list(col) for col in zip(*rows, strict=True)]
    return len(await conn.fetch(_unnest_sql(table_name), *columns))


# Columns whose text never holds a comma (uuids, codes, amounts, dates, normalized documents):
# the "joined" method sends each as ONE comma-joined string, split by PostgreSQL.
JOINABLE: dict[str, tuple[bool, ...]] = {
    "credit_annotations": (True, True, True, True, True, False, True, True, False),
    "transactions": (True, True, True, False, True, True, True, True, False),
}


def _joined_sql(table_name: str) -> str:
    cols = TABLES[table_name]
    args = ", ".join(
        f"string_to_array(${i + 1}, ',', '')::{t}[]" if joinable else f"${i + 1}::{t}[]"
        for i, (t, joinable) in enumerate(zip(TYPES[table_name], JOINABLE[table_name], strict=True))
    )
    return (
        f"INSERT INTO {table_name} ({','.join(cols)}) SELECT * FROM unnest({args}) "
        "ON CONFLICT (id) DO NOTHING RETURNING id"
    )


async def m_joined(conn: Conn, table_name: str, rows: Sequence[tuple[Any, ...]]) -> int:
    """unnest, but comma-free columns travel as one string each: asyncpg then encodes one
    text value instead of checking and encoding 1,000 array elements (see RESULTS.md 8)."""
    params: list[Any] = []
    for col, joinable in zip(zip(*rows, strict=True), JOINABLE[table_name], strict=True):
        if joinable:
            params.append(",".join("" if v is None else str(v) for v in col))
        else:
            params.append(list(col))
    return len(await conn.fetch(_joined_sql(table_name), *params))


async def m_copy_temp(conn: Conn, table_name: str, rows: Sequence[tuple[Any, ...]]) -> int:
    cols = TABLES[table_name]
    tmp = f"tmp_{table_name}"
    await conn.copy_records_to_table(tmp, records=rows, columns=cols)
    got = await conn.fetch(
        f"INSERT INTO {table_name} ({','.join(cols)}) SELECT {','.join(cols)} FROM {tmp} "
        "ON CONFLICT (id) DO NOTHING RETURNING id"
    )
    return len(got)


async def m_executemany(conn: Conn, table_name: str, rows: Sequence[tuple[Any, ...]]) -> int:
    cols = TABLES[table_name]
    params = ",".join(f"${i + 1}" for i in range(len(cols)))
    await conn.executemany(
        f"INSERT INTO {table_name} ({','.join(cols)}) VALUES ({params}) "
        "ON CONFLICT (id) DO NOTHING",
        rows,
    )
    return -1  # executemany cannot tell which rows were new


async def m_copy_plain(conn: Conn, table_name: str, rows: Sequence[tuple[Any, ...]]) -> int:
    await conn.copy_records_to_table(table_name, records=rows, columns=TABLES[table_name])
    return len(rows)


ROW_METHODS: dict[str, Method] = {
    "values": m_values,
    "unnest": m_unnest,
    "joined": m_joined,
    "copy_temp": m_copy_temp,
    "executemany": m_executemany,
    "copy_plain": m_copy_plain,
}


async def prepare_connection(conn: Conn) -> None:
    for table_name in TABLES:
        await conn.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS tmp_{table_name} "
            f"(LIKE {table_name} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
        )


async def prefill(conn: Conn, table_name: str, records: Sequence[Record]) -> None:
    rows = [row_of(r) for r in records]
    for start in range(0, len(rows), 50_000):
        await conn.copy_records_to_table(
            table_name, records=rows[start : start + 50_000], columns=TABLES[table_name]
        )
    await conn.execute(f"VACUUM ANALYZE {table_name}")


# -- one cell ----------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Cell:
    table: str
    order: str
    dup: int  # percent
    method: str


async def run_cell(
    conn: Conn,
    pool: asyncpg.Pool,
    cell: Cell,
    template: list[Record],
    previous: list[Record],
    chunks: int,
    rng: random.Random,
) -> tuple[float, float, list[Record]]:
    """Write ``chunks`` chunks; returns (rows offered per second, client CPU us per row, the
    last chunk). Client CPU is this process's CPU time over the timed writes: the Python and
    asyncpg work per row (encoding), which the recorder pays on its single core."""
    elapsed = cpu = 0.0
    writer = PgWriter(pool) if cell.method == "pgwriter" else None
    method = ROW_METHODS.get(cell.method)
    last = previous
    for _ in range(chunks):
        new = fresh_ids(template[: CHUNK - CHUNK * cell.dup // 100], cell.order, rng)
        repeats = rng.sample(last, CHUNK * cell.dup // 100) if cell.dup else []
        chunk = new + repeats
        if cell.order == "sorted":
            chunk.sort(key=lambda r: r.id)
        else:
            rng.shuffle(chunk)
        if writer is not None:
            started, cpu0 = time.perf_counter(), time.process_time()
            await writer.write(chunk)
        else:
            assert method is not None
            rows = [row_of(r) for r in chunk]
            started, cpu0 = time.perf_counter(), time.process_time()
            async with conn.transaction():
                await method(conn, cell.table, rows)
        elapsed += time.perf_counter() - started
        cpu += time.process_time() - cpu0
        last = new
    return chunks * CHUNK / elapsed, cpu / (chunks * CHUNK) * 1e6, last


async def main_async(args: argparse.Namespace) -> None:
    facts = await machine_facts()
    emit("Machine", facts_table(facts))
    tables = [t for t in TABLES if args.table in (t, "both")]
    methods = [m for m in METHODS if m in args.methods]
    results: dict[tuple[str, str, int, str], Stat] = {}
    cpu: dict[tuple[str, str, int, str], Stat] = {}
    for run in range(args.runs):
        for table_name in tables:
            for order in ORDERS:
                progress(f"run {run + 1}/{args.runs}: {table_name}, ids {order}")
                template = make_records(table_name, CHUNK, order, seed=run + 1)
                rng = random.Random(run * 100 + ORDERS.index(order))
                async with temp_database("bench_writer") as (dsn, _):
                    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
                    assert pool is not None
                    conn = await asyncpg.connect(dsn)
                    try:
                        await prepare_connection(conn)
                        seed_records = fresh_ids(
                            template * (max(args.prefill, CHUNK) // CHUNK), order, rng
                        )
                        await prefill(conn, table_name, seed_records)
                        last = seed_records[-CHUNK:]
                        rotated = methods[run % len(methods) :] + methods[: run % len(methods)]
                        for dup in (0, 50):
                            for method in rotated:
                                if method == "copy_plain" and dup:
                                    continue
                                cell = Cell(table_name, order, dup, method)
                                rate, cpu_us, last = await run_cell(
                                    conn, pool, cell, template, last, args.chunks, rng
                                )
                                key = (table_name, order, dup, method)
                                results.setdefault(key, Stat()).add(rate)
                                cpu.setdefault(key, Stat()).add(cpu_us)
                    finally:
                        await conn.close()
                        await pool.close()
    report(results, cpu, tables, methods, args)
    save_json(
        args.json,
        {
            "facts": facts,
            "results": [
                {
                    "table": k[0],
                    "order": k[1],
                    "dup": k[2],
                    "method": k[3],
                    "values": s.values,
                    "cpu_us": cpu[k].values,
                }
                for k, s in results.items()
            ],
        },
    )


def report(
    results: dict[tuple[str, str, int, str], Stat],
    cpu: dict[tuple[str, str, int, str], Stat],
    tables: list[str],
    methods: list[str],
    args: argparse.Namespace,
) -> None:
    for table_name in tables:
        rows = []
        for order in ORDERS:
            for dup in (0, 50):
                base = results.get((table_name, order, dup, "unnest"))
                for method in methods:
                    stat = results.get((table_name, order, dup, method))
                    if stat is None:
                        continue
                    vs = ratio(stat, base).fmt(2, "x") if base is not None else "-"
                    cpu_us = cpu[(table_name, order, dup, method)].fmt(1)
                    rows.append((f"ids {order}", f"{dup}%", method, stat.fmt(), vs, cpu_us))
        emit(
            f"Writer: {table_name}, 1,000-row chunks, one transaction each "
            f"({args.chunks} chunks a cell, table pre-filled with {args.prefill:,} rows, "
            f"median (min-max) of {args.runs} runs)",
            table(
                [
                    "ids",
                    "duplicates",
                    "method",
                    "rows/s offered",
                    "vs unnest (same run)",
                    "client CPU us/row",
                ],
                rows,
            ),
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--chunks", type=int, default=20, help="1,000-row chunks per cell")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prefill", type=int, default=100_000, help="rows in the table first")
    parser.add_argument("--table", choices=(*TABLES, "both"), default="both")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--json", help="write raw results here (for the charts)")
    return parser


def main() -> None:
    run_main(build_parser(), main_async)


if __name__ == "__main__":
    main()
