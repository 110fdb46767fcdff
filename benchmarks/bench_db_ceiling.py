"""One PostgreSQL primary's ceiling for the recorder's writes: records/s as writers are added.

    python -m benchmarks.bench_db_ceiling                 # 1, 2, 4, 8 writers, 3 rounds (~4 min)
    python -m benchmarks.bench_db_ceiling --quick         # 1 and 2 writers, small (the test's)

No broker: the records are made and decoded first, and each flush of ``--size`` records is
planned by the recorder's own ``PgWriter.write`` (benchmarks/support/flush_plan.py: its sort, its
chunks, its ``INSERT ... ON CONFLICT (id) DO NOTHING`` statement with the operations and the
balance upserts as CTEs, autocommit or BEGIN/COMMIT as it chooses), all before the clock
starts. Then W writers, each on a connection of its own as a flush worker has, send those
flushes as fast as the database takes them, for W in ``--writers``; the same flushes for every
W, on tables emptied (TRUNCATE) before each point, in a database of the benchmark's own on the
server of ``DATABASE_URL`` (default 127.0.0.1:5432), created and dropped by it.

Per point: records/s, and CPU seconds over the same window of the database's backends (from
/proc/<pid>/stat of the processes pg_stat_activity lists for the database), of this process (the
writers), of the whole machine and of what else ran on it, in cores. Where the writers hold one
core, they were the limit; where a quarter of them or more wait on a lock (pg_stat_activity,
sampled every 20 ms), flushes waited for each other's balance rows; where the machine's cores
are busy, CPU was (the database's, or other processes' on a shared machine: read the CPU per
record then, which the neighbours barely move); where none of these, the writers waited on
commits (WAL flushes).
``--queue-rate`` is the one-queue figure the ceiling is set against.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass

import asyncpg

from benchmarks.support.env import database_url, run_main
from benchmarks.support.flush_plan import Flush, plan_flush, replay
from benchmarks.support.machine import PgCpu, facts_table, machine_cpu, machine_facts
from benchmarks.support.services import temp_database
from benchmarks.support.stats import Stat, emit, progress, save_json, table
from bulk_recorder.records import Record, decode
from consumer.tools.generator import Generator

TYPES = ("transaction", "credit_annotation")
TABLES = "transactions, operations, balances, credit_annotations, credit_annotation_job_repeats"
# The table holding one row per record of each type, counted after every point.
RECORD_TABLE = {"transaction": "transactions", "credit_annotation": "credit_annotations"}


@dataclass(frozen=True, slots=True)
class Point:
    """One (record type, writer count, round): the measured window."""

    record_type: str
    writers: int
    round: int
    records: int
    seconds: float
    pg_cpu_s: float
    writers_cpu_s: float
    machine_busy_s: float
    lock_waiters: float  # backends waiting on a lock, averaged over the window's samples

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def make_records(record_type: str, count: int, accounts: int, seed: int) -> list[Record]:
    """Valid records through the recorder's decode(); transactions move money between two of
    ``accounts`` accounts, drawn at random."""
    gen = Generator.create(seed)
    rng = random.Random(seed)
    gen.accounts = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(accounts)]
    return [decode(json.dumps(gen.record(record_type)).encode(), record_type) for _ in range(count)]


async def plan(record_type: str, args: argparse.Namespace) -> list[Flush]:
    records = make_records(record_type, args.records, args.accounts, seed=TYPES.index(record_type))
    return [
        await plan_flush(records[start : start + args.size])
        for start in range(0, len(records), args.size)
    ]


async def run_point(
    dsn: str, name: str, flushes: list[Flush], record_type: str, writers: int, round_: int
) -> Point:
    """Empty the tables, open ``writers`` connections (each warmed with one flush it rolls
    back, so its statements are prepared as a running flush worker's are), then time them
    draining ``flushes``."""
    admin = await asyncpg.connect(dsn)
    conns = [await asyncpg.connect(dsn) for _ in range(writers)]
    try:
        await admin.execute(f"TRUNCATE {TABLES}")
        for conn in conns:
            await _warm(conn, flushes[0])
        pending = deque(flushes)
        pg = PgCpu(database_url(), name)
        await pg.begin()
        busy0, cpu0, started = machine_cpu()[0], time.process_time(), time.perf_counter()
        stop = asyncio.Event()
        sampler = asyncio.create_task(_lock_waiters(admin, name, stop))
        done = await asyncio.gather(*(_drain(conn, pending) for conn in conns))
        seconds = time.perf_counter() - started
        stop.set()
        lock_waiters = await sampler
        writers_cpu, busy = time.process_time() - cpu0, machine_cpu()[0] - busy0
        pg_cpu = await pg.end()
        records = sum(f.records for f in flushes)
        stored = await admin.fetchval(f"SELECT count(*) FROM {RECORD_TABLE[record_type]}")
        if sum(done) != records or stored != records:
            raise RuntimeError(f"{records} records sent, {sum(done)} new, {stored} stored")
        if record_type == "transaction":  # double entry: the balances moved, and net to zero
            row = await admin.fetchrow("SELECT count(*), sum(available) FROM balances")
            moved, net = (row[0], row[1]) if row is not None else (0, None)
            if not moved or net != 0:
                raise RuntimeError(f"balances: {moved} rows, net {net}")
    finally:
        for conn in (*conns, admin):
            await conn.close()
    return Point(
        record_type, writers, round_, records, seconds, pg_cpu, writers_cpu, busy, lock_waiters
    )


async def _lock_waiters(conn: asyncpg.Connection, database: str, stop: asyncio.Event) -> float:
    """The mean number of the database's backends waiting on a lock (a balance row held by
    another flush), sampled every 20 ms until ``stop``."""
    samples: list[int] = []
    while not stop.is_set():
        samples.append(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = $1 AND wait_event_type = 'Lock'",
                database,
            )
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.02)
    return sum(samples) / len(samples) if samples else 0.0


async def _warm(conn: asyncpg.Connection, flush: Flush) -> None:
    transaction = conn.transaction()
    await transaction.start()
    try:
        await replay(conn, flush)
    finally:
        await transaction.rollback()


async def _drain(conn: asyncpg.Connection, pending: deque[Flush]) -> int:
    new = 0
    while pending:
        new += await replay(conn, pending.popleft())
    return new


async def main_async(args: argparse.Namespace) -> None:
    facts = await machine_facts()
    emit("Machine", facts_table(facts))
    types = [t for t in TYPES if t in args.types]
    plans: dict[str, list[Flush]] = {}
    for record_type in types:
        progress(f"planning {args.records:,} {record_type} records in flushes of {args.size}")
        plans[record_type] = await plan(record_type, args)
    points: list[Point] = []
    async with temp_database("bench_db_ceiling") as (dsn, name):
        progress(f"database {name}")
        for round_ in range(args.rounds):
            shift = round_ % len(args.writers)  # a noisy minute hits every writer count
            for writers in args.writers[shift:] + args.writers[:shift]:
                for record_type in types:
                    progress(f"round {round_ + 1}/{args.rounds}: {record_type}, {writers} writers")
                    point = await run_point(
                        dsn, name, plans[record_type], record_type, writers, round_
                    )
                    points.append(point)
    summary = report(points, types, args)
    save_json(
        args.json,
        {
            "facts": facts,
            "database": name,
            "config": {k: v for k, v in vars(args).items() if k != "json"},
            "points": [{**asdict(p), "rate": p.rate} for p in points],
            "summary": summary,
        },
    )


def limit(s: dict[str, Stat], writers: int, cores: int) -> str:
    """What bounded a point, from its readings (cores used over the window, lock waiters)."""
    pg_cores, busy_cores = s["pg"].median, s["busy"].median
    if s["writers"].median >= 0.9:
        return "the writers (one core)"
    if writers > 1 and s["locks"].median >= 0.25 * writers:
        return "row locks: flushes wait for each other"
    if busy_cores >= 0.9 * cores:
        if pg_cores >= 0.5 * busy_cores:
            return "CPU: the database's"
        return "CPU: other processes took most"
    return "waits: commits (WAL flushes)"


def _stats(points: list[Point]) -> dict[str, Stat]:
    names = ("rate", "pg", "writers", "busy", "others", "locks", "pg_us", "w_us")
    out: dict[str, Stat] = {k: Stat() for k in names}
    for p in points:
        out["rate"].add(p.rate)
        out["pg"].add(p.pg_cpu_s / p.seconds)
        out["writers"].add(p.writers_cpu_s / p.seconds)
        out["busy"].add(p.machine_busy_s / p.seconds)
        out["others"].add(max(0.0, p.machine_busy_s - p.pg_cpu_s - p.writers_cpu_s) / p.seconds)
        out["locks"].add(p.lock_waiters)
        out["pg_us"].add(p.pg_cpu_s / p.records * 1e6)
        out["w_us"].add(p.writers_cpu_s / p.records * 1e6)
    return out


def report(
    points: list[Point], types: list[str], args: argparse.Namespace
) -> list[dict[str, object]]:
    cores = os.cpu_count() or 1
    summary: list[dict[str, object]] = []
    for record_type in types:
        rows = []
        by_writers = {
            w: _stats([p for p in points if p.record_type == record_type and p.writers == w])
            for w in sorted(args.writers)
        }
        previous: Stat | None = None
        for writers, s in by_writers.items():
            gain = f"{s['rate'].median / previous.median:.2f}x" if previous else "-"
            rows.append(
                (
                    writers,
                    s["rate"].fmt(),
                    gain,
                    s["pg"].fmt(2),
                    s["writers"].fmt(2),
                    f"{s['busy'].fmt(2)} of {cores}",
                    s["others"].fmt(2),
                    f"{s['locks'].fmt(1)} of {writers}",
                    s["pg_us"].fmt(1),
                    s["w_us"].fmt(1),
                    limit(s, writers, cores),
                )
            )
            previous = s["rate"]
        emit(
            f"Database ceiling: {record_type}, flushes of {args.size}, {args.records:,} records "
            f"a point, {args.accounts:,} accounts (median (min-max) of {args.rounds} rounds)",
            table(
                [
                    "writers",
                    "records/s",
                    "vs the row above",
                    "PostgreSQL CPU (cores)",
                    "writers' CPU (cores)",
                    "machine busy (cores)",
                    "other processes (cores)",
                    "writers waiting on a lock",
                    "PostgreSQL CPU us/record",
                    "writers' CPU us/record",
                    "limit",
                ],
                rows,
            ),
        )
        peak_writers, peak = max(by_writers.items(), key=lambda item: item[1]["rate"].median)
        summary.append(
            {
                "record_type": record_type,
                "peak_writers": peak_writers,
                "peak_rate": peak["rate"].median,
                "pg_us_per_record": peak["pg_us"].median,
                "records_per_pg_core": 1e6 / peak["pg_us"].median,
                "vs_queue": peak["rate"].median / args.queue_rate,
            }
        )
    emit_summary(summary, args)
    return summary


def emit_summary(summary: list[dict[str, object]], args: argparse.Namespace) -> None:
    rows = [
        (
            s["record_type"],
            f"{s['peak_rate']:,.0f} ({s['peak_writers']} writers)",
            f"{s['pg_us_per_record']:,.1f}",
            f"{s['records_per_pg_core']:,.0f}",
            f"{s['vs_queue']:.2f}x",
        )
        for s in summary
    ]
    emit(
        f"The ceiling against one quorum queue ({args.queue_rate:,} msg/s)",
        table(
            [
                "record",
                "peak records/s here",
                "PostgreSQL CPU us/record at the peak",
                "records/s per PostgreSQL core (1e6 / us)",
                "peak / one queue",
            ],
            rows,
        ),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--types", nargs="+", choices=TYPES, default=list(TYPES))
    parser.add_argument("--records", type=int, default=100_000, help="records a point")
    parser.add_argument("--size", type=int, default=500, help="records a flush")
    parser.add_argument("--accounts", type=int, default=100_000, help="accounts transactions use")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--queue-rate",
        type=int,
        default=10_000,
        help="msg/s of one quorum queue, to set the ceiling against",
    )
    parser.add_argument("--quick", action="store_true", help="1 and 2 writers, small, one round")
    parser.add_argument("--json", help="write raw results here")
    return parser


def main() -> None:
    parser = build_parser()

    async def run(args: argparse.Namespace) -> None:
        if args.quick:
            args.writers, args.records, args.size, args.rounds = [1, 2], 4_000, 200, 1
            args.accounts = min(args.accounts, 10_000)
        await main_async(args)

    run_main(parser, run)


if __name__ == "__main__":
    main()
