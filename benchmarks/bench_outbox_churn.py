"""The outbox under churn (issue 28, item 5): the relay's claim and the outbox's size as millions
of rows pass through it, on a private PostgreSQL server (its own port, removed at the end).

    python -m benchmarks.bench_outbox_churn                                 # 10M rows, defaults
    python -m benchmarks.bench_outbox_churn --variant long-tx               # a long transaction
    python -m benchmarks.bench_outbox_churn --rows 1200000 --every 300000   # quick look

Rows go through the outbox as the API and the relay move them: 300,000-line jobs back to back,
each COPYed in one transaction by ``copy_to_outbox`` with its job row, then drained by
``--lanes`` connections running the relay's own claim (``relay_claim.claim`` with its cursor)
and the relay's own settlement statements (the delete, the relay-activity stamp, the job's
``published`` count) in batches of ``--batch-size``. No broker: a publish is not SQL, and the
SQL is what the outbox's churn costs.

At the start (a fresh outbox) and every ``--every`` rows, with the next job committed and
pending (a realistic backlog): the claim's median time over ``--claims`` claims (each rolled
back) and the buffers EXPLAIN (ANALYZE, BUFFERS) says it touched, for the claim before this
change (``old``: from the start of the pending index, its window bounds found twice), the
relay's claim from its cursor (``cursor``) and its rescan from the start (``rescan``); the
outbox's heap (pg_table_size) and index (pg_indexes_size) bytes, its live and dead tuples
(pg_stat_user_tables) and how many autovacuums ran. ``long-tx`` holds a transaction that took
an xid (``SELECT txid_current()``) open from ``--hold-from`` rows for ``--hold-rows`` rows, then
ends it. ``--table-settings none`` resets the outbox's storage parameters (as before migration
010) to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

import asyncpg

from benchmarks.support.env import run_main
from benchmarks.support.private_pg import private_server
from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer.outbox import copy_to_outbox, notify, stamp_published
from bulk_recorder.producer.relay_batch import _COUNT_PUBLISHED, _DELETE_SENT
from bulk_recorder.producer.relay_claim import (
    CLAIM,
    CLAIM_WINDOW,
    EVERY_SCAN,
    INDEX_SCANS_ONLY,
    ClaimCursor,
    claim,
)
from consumer.tools.generator import Generator

JOB_ROWS = 300_000
# The claim before issue 28 item 5, verbatim: both window bounds from the start of the index.
OLD_CLAIM = """
SELECT id, record_type, job_id, body, attempts, traceparent, tracestate
FROM outbox
WHERE parked_at IS NULL AND available_at <= now()
  AND id >= (SELECT min(id) FROM outbox WHERE parked_at IS NULL AND available_at <= now())
  AND id < (SELECT min(id) FROM outbox WHERE parked_at IS NULL AND available_at <= now()) + $2
ORDER BY id
LIMIT $1
FOR UPDATE SKIP LOCKED
"""
TABLE_SETTINGS = (  # what migration 010 sets
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_vacuum_cost_delay",
)
SERVER_SETTINGS = {"fsync": "off", "synchronous_commit": "off"}  # durability is not measured here


@dataclass
class Point:
    rows_passed: int
    note: str
    old_ms: float
    cursor_ms: float
    rescan_ms: float
    old_buffers: int
    cursor_buffers: int
    rescan_buffers: int
    heap_bytes: int
    index_bytes: int
    live: int
    dead: int
    autovacuums: int


def _buffers(raw: str) -> int:
    plan = json.loads(raw)[0]["Plan"]  # the top node's counts include its children's
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


async def _measure_claim(
    conn: asyncpg.Connection, sql: str, args: tuple[Any, ...], claims: int
) -> tuple[float, int]:
    """Median ms of ``claims`` claims (each rolled back) and the buffers of one more; the
    relay's own claim after its plan settings, as ``relay_claim.claim`` runs it."""
    times = []
    for _ in range(claims):
        tx = conn.transaction()
        await tx.start()
        began = time.perf_counter()
        if sql is CLAIM:
            await conn.execute(INDEX_SCANS_ONLY)
        await conn.fetch(sql, *args)
        if sql is CLAIM:
            await conn.execute(EVERY_SCAN)
        times.append((time.perf_counter() - began) * 1000)
        await tx.rollback()
    async with conn.transaction():
        if sql is CLAIM:
            await conn.execute(INDEX_SCANS_ONLY)
        raw = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args)
        tx_buffers = _buffers(raw)
    return statistics.median(times), tx_buffers


async def measure(
    conn: asyncpg.Connection, cursor: ClaimCursor, args: argparse.Namespace, passed: int, note: str
) -> Point:
    window = CLAIM_WINDOW * args.batch_size * args.lanes
    old = await _measure_claim(conn, OLD_CLAIM, (args.batch_size, window), args.claims)
    cur = await _measure_claim(conn, CLAIM, (args.batch_size, window, cursor.floor), args.claims)
    rescan = await _measure_claim(conn, CLAIM, (args.batch_size, window, 0), args.claims)
    if cur[1] > 5 * 708:  # far over a fresh outbox's: show the plan
        async with conn.transaction():
            await conn.execute(INDEX_SCANS_ONLY)
            plan = await conn.fetch(
                f"EXPLAIN (ANALYZE, BUFFERS) {CLAIM}", args.batch_size, window, cursor.floor
            )
        print("\n".join(f"#   {r[0]}" for r in plan))
    await conn.execute("SELECT pg_stat_force_next_flush()")
    row = await conn.fetchrow(
        "SELECT pg_table_size('outbox') AS heap, pg_indexes_size('outbox') AS idx,"
        " n_live_tup, n_dead_tup, autovacuum_count"
        " FROM pg_stat_user_tables WHERE relname = 'outbox'"
    )
    assert row is not None
    point = Point(
        passed, note, round(old[0], 2), round(cur[0], 2), round(rescan[0], 2),
        old[1], cur[1], rescan[1], row["heap"], row["idx"],
        row["n_live_tup"], row["n_dead_tup"], row["autovacuum_count"],
    )  # fmt: skip
    print(json.dumps(asdict(point)), flush=True)
    return point


async def insert_job(conn: asyncpg.Connection, body: bytes) -> uuid.UUID:
    """One job as the API writes it: its row and its outbox rows in one transaction."""
    job_id = uuid.uuid4()
    rows = (("credit_annotation", str(uuid.uuid4()), str(job_id), body) for _ in range(JOB_ROWS))
    async with conn.transaction():
        await conn.execute(
            "INSERT INTO credit_annotation_jobs (id, content_type, accepted)"
            " VALUES ($1, 'application/x-ndjson', $2)",
            job_id,
            JOB_ROWS,
        )
        await copy_to_outbox(conn, rows)
        await notify(conn)
    return job_id


async def _lane(conn: asyncpg.Connection, cursor: ClaimCursor, args: argparse.Namespace) -> int:
    """Claim and settle batches as a relay lane does until a claim finds nothing."""
    window = CLAIM_WINDOW * args.batch_size * args.lanes
    moved = 0
    while True:
        began = time.monotonic()
        async with conn.transaction():
            rows = await claim(conn, cursor, args.batch_size, window)
            if not rows:
                return moved
            await conn.execute(_DELETE_SENT, [r["id"] for r in rows])
            await stamp_published(conn)
            per_job: dict[str, int] = {}
            for r in rows:
                per_job[str(r["job_id"])] = per_job.get(str(r["job_id"]), 0) + 1
            jobs = sorted(per_job)
            await conn.execute(_COUNT_PUBLISHED, jobs, [per_job[j] for j in jobs])
        moved += len(rows)
        if args.rate:  # the relay's own pace: a lane publishes rate / lanes rows a second
            await asyncio.sleep(
                max(0.0, len(rows) * args.lanes / args.rate - (time.monotonic() - began))
            )


async def drain(
    lanes: list[asyncpg.Connection], cursor: ClaimCursor, args: argparse.Namespace
) -> int:
    return sum(await asyncio.gather(*(_lane(c, cursor, args) for c in lanes)))


async def churn(dsn: str, args: argparse.Namespace) -> list[Point]:
    conn = await asyncpg.connect(dsn)
    lanes = [await asyncpg.connect(dsn) for _ in range(args.lanes)]
    holder: asyncpg.Connection | None = None
    cursor = ClaimCursor()
    gen = Generator.create(28)
    body = json.dumps(gen.credit_annotation()).encode()
    points: list[Point] = []
    passed, next_point, released_at = 0, 0, None
    try:
        while passed < args.rows:
            await insert_job(conn, body)  # pending while we measure: a realistic backlog
            held = holder is not None
            holding = args.hold_from <= passed < args.hold_from + args.hold_rows
            if args.variant == "long-tx" and holder is None and holding:
                holder = await asyncpg.connect(dsn)
                await holder.execute("BEGIN; SELECT txid_current()")
                held = True
            if holder is not None and passed >= args.hold_from + args.hold_rows:
                await holder.execute("COMMIT")
                await holder.close()
                holder, held, released_at = None, False, time.monotonic()
            after = (
                released_at is not None and passed < args.hold_from + args.hold_rows + 6 * JOB_ROWS
            )
            if passed >= next_point or after:
                note = "long tx open" if held else ""
                if released_at is not None:
                    note = f"{time.monotonic() - released_at:.0f} s after release"
                points.append(await measure(conn, cursor, args, passed, note))
                next_point = passed + args.every
            began = time.monotonic()
            moved = await drain(lanes, cursor, args)
            passed += moved
            print(f"# {passed:,} rows passed; {moved / (time.monotonic() - began):,.0f} rows/s",
                  flush=True)  # fmt: skip
        await insert_job(conn, body)
        points.append(await measure(conn, cursor, args, passed, "end"))
    finally:
        if holder is not None:
            await holder.close()
        for c in (conn, *lanes):
            await c.close()
    return points


def ratios(points: list[Point]) -> str:
    """A markdown table: each measure, and its ratio to the fresh outbox's (the first point)."""
    f = points[0]

    def r(v: float, base: float) -> str:
        return f"{v / base:.2f}x" if base else "-"

    lines = [
        "| rows passed | note | claim old ms (x) | claim cursor ms (x) | rescan ms | buffers old"
        " / cursor / rescan | heap MB (x) | index MB (x) | dead tuples | autovacuums |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {p.rows_passed:,} | {p.note} | {p.old_ms} ({r(p.old_ms, f.old_ms)})"
            f" | {p.cursor_ms} ({r(p.cursor_ms, f.cursor_ms)}) | {p.rescan_ms}"
            f" | {p.old_buffers:,} / {p.cursor_buffers:,} / {p.rescan_buffers:,}"
            f" | {p.heap_bytes / 2**20:.0f} ({r(p.heap_bytes, f.heap_bytes)})"
            f" | {p.index_bytes / 2**20:.1f} ({r(p.index_bytes, f.index_bytes)})"
            f" | {p.dead:,} | {p.autovacuums} |"
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # remove the server on a kill too
    settings = {**SERVER_SETTINGS, **({"autovacuum_naptime": args.naptime} if args.naptime else {})}
    with private_server(settings, name=f"churn-{args.variant}") as server:
        dsn = server.dsn("churn")
        await migrate(dsn)
        if args.table_settings == "none":
            conn = await asyncpg.connect(dsn)
            await conn.execute(f"ALTER TABLE outbox RESET ({', '.join(TABLE_SETTINGS)})")
            await conn.close()
        began = time.monotonic()
        points = await churn(dsn, args)
        print(f"# {args.variant}, table settings {args.table_settings}, rate {args.rate or 'max'},"
              f" naptime {args.naptime or 'default'}:"
              f" {points[-1].rows_passed:,} rows in {time.monotonic() - began:.0f} s")  # fmt: skip
        print(ratios(points))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variant", choices=("defaults", "long-tx"), default="defaults")
    p.add_argument("--table-settings", choices=("migrated", "none"), default="migrated")
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--every", type=int, default=900_000)
    p.add_argument("--hold-from", type=int, default=900_000)
    p.add_argument("--hold-rows", type=int, default=1_800_000)
    p.add_argument("--batch-size", type=int, default=500)
    p.add_argument("--lanes", type=int, default=2)
    p.add_argument("--claims", type=int, default=30)
    p.add_argument("--rate", type=int, default=0, help="rows/s the lanes settle (0: no cap)")
    p.add_argument("--naptime", default="", help="the server's autovacuum_naptime (default 1min)")
    return p


if __name__ == "__main__":
    run_main(parser(), main)
