"""Growth: the recorder's rate, CPU, WAL and disk per record as its tables grow (issue 28).

    python -m benchmarks.bench_growth --quick          # empty and 50,000 rows, 2,000 messages
    python -m benchmarks.bench_growth --points 0 2000000 10000000 --json PATH   # the full run

A private PostgreSQL 15 server (initdb into a temporary folder, removed at the end): WAL is
cluster-wide, so other work on a shared server would move the WAL position, and
``wal_compression`` is changed between rounds (ALTER SYSTEM + reload). One database per id kind
(v4: random, v7: time-ordered, RFC 9562), its schema made by the project's ``migrate``.

For each point (rows prefilled by SQL, added to the same databases from point to point; see
``benchmarks/support/growth_sql.py`` for how and why the indexes are built after the load), each
round pre-fills a quorum queue with ``--count`` records (v4 or v7 ids, two accounts of the
million), forces a CHECKPOINT, and drains it with ONE recorder process (``python -m consumer``):
rate from the first 1% to the last ack, CPU of the recorder and of the database's backends,
WAL bytes (``pg_wal_lsn_diff`` over the round), full-page images (``pg_stat_wal``), and the
tables' growth on disk (``pg_total_relation_size``). With pg_walinspect, the round's WAL per
relation. The variants of a round (id kind x record type x wal_compression) run in an order
rotated from round to round.

At the largest point: each secondary index of the ledger dropped in turn (one round each, the
index built again afterwards), and a longer drain with a CHECKPOINT forced every N records
(the job of checkpoint_timeout / max_wal_size).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks.support.env import REPO, run_main
from benchmarks.support.growth_load import fill_queue
from benchmarks.support.growth_sql import (
    ACCOUNTS,
    annotations_sql,
    balances_sql,
    create_index,
    drop_ledger_indexes,
    helpers_sql,
    index_defs,
    relation_pages,
    restore_ledger_indexes,
    table_sizes,
    transactions_sql,
    wal_between,
    wal_mark,
    wal_per_relation,
)
from benchmarks.support.machine import PgCpu, facts_table, machine_facts
from benchmarks.support.private_pg import available, private_server
from benchmarks.support.recorder import RecorderConfig, RecorderProcess, drain
from benchmarks.support.services import temp_topology
from benchmarks.support.stats import emit, progress, save_json
from bulk_recorder.infra.migrate import migrate
from consumer.topology import Topology
from tests.rigs.postgres_server import PgServer

KINDS = ["v4", "v7", "v7p"]
PARTITIONING_SQL = REPO / "bulk_recorder" / "sql" / "partitioning" / "partitioned_ledger.sql"

CHUNK = 500_000
PARTITION_DAYS = 30  # v7p: the prefill spread over this many daily partitions
TABLE_OF = {"transaction": "transactions", "credit_annotation": "credit_annotations"}
SECONDARY = {
    "transaction": ["transactions_ledger_created_idx", "operations_transaction_idx",
                    "operations_account_idx"],
    "credit_annotation": ["credit_annotations_document_idx", "credit_annotations_job_idx"],
}  # fmt: skip
# Not in the shipped schema since migration 011 (no query of the project reads them); a
# deployment that serves account statements or look-ups by document from this database creates
# them as docs/performance.md says. --optional-indexes measures such a deployment.
OPTIONAL_INDEXES = {
    "operations_account_idx": "CREATE INDEX operations_account_idx"
    " ON operations (account_id, created_at)",
    "credit_annotations_document_idx": "CREATE INDEX credit_annotations_document_idx"
    " ON credit_annotations (document)",
}


def server_settings(args: argparse.Namespace) -> dict[str, str]:
    return {
        "shared_buffers": args.shared_buffers,
        "fsync": "on",
        "synchronous_commit": "on",
        "full_page_writes": "on",
        "wal_level": "replica",
        "max_wal_size": args.max_wal_size,
        "min_wal_size": "1GB",
        "checkpoint_timeout": "1d",  # the maximum: no timed checkpoint inside a round
        "checkpoint_completion_target": "0.9",
        "log_checkpoints": "on",
        "maintenance_work_mem": "1GB",
        "max_parallel_maintenance_workers": "1",
        "wal_compression": "off",
    }


class Run:
    """The private server, the databases per id kind, the results gathered so far."""

    def __init__(self, args: argparse.Namespace, server: PgServer) -> None:
        self.args = args
        self.server = server
        self.prefilled: dict[str, int] = dict.fromkeys(args.ids, 0)
        self.partitioning_sql = ""
        if "v7p" in args.ids:
            path = Path(args.partitioning_sql)
            if not path.exists():
                raise SystemExit(f"v7p needs the partitioning script: {path} is missing")
            self.partitioning_sql = path.read_text(encoding="utf-8")
        self.out: dict[str, Any] = {
            "settings": server_settings(args),
            "count": args.count,
            "types": args.types,
            "ids": args.ids,
            "compression": args.compression,
            "accounts": args.accounts,
            "prefill": "indexes built after the load, fillfactor 70 where led by a random key",
            "points": [],
            "rounds": [],
            "index_rounds": [],
            "checkpoint_spacing": [],
        }

    def db(self, kind: str) -> str:
        return f"growth_{kind}"

    def dsn(self, kind: str) -> str:
        return self.server.dsn(self.db(kind))

    def save(self) -> None:
        save_json(self.args.json, self.out)

    async def connect(self, kind: str) -> asyncpg.Connection:
        return await asyncpg.connect(self.dsn(kind), command_timeout=None)

    # -- databases and prefill ---------------------------------------------------------------

    async def create_databases(self) -> None:
        admin = await asyncpg.connect(self.server.dsn())
        try:
            for kind in self.args.ids:
                await admin.execute(f"CREATE DATABASE {self.db(kind)}")
        finally:
            await admin.close()
        for kind in self.args.ids:
            await migrate(self.dsn(kind))
            conn = await self.connect(kind)
            try:
                if self.args.optional_indexes:
                    for statement in OPTIONAL_INDEXES.values():
                        await conn.execute(statement)
                if kind == "v7p":
                    await self.partition(conn)
                else:
                    await conn.execute(helpers_sql())
            finally:
                await conn.close()

    async def partition(self, conn: asyncpg.Connection) -> None:
        """The ledger tables partitioned by day of (v7) id, PARTITIONS_DAYS days of prefill
        behind today (a partition each), today's and the next days' partitions for the drain."""
        await conn.execute(self.partitioning_sql)
        step = max(1, PARTITION_DAYS * 86_400_000 // max(max(self.args.points), 1))
        await conn.execute(helpers_sql(days=PARTITION_DAYS + 1, step_ms=step))
        await conn.execute(
            "SELECT count(*) FROM bulk_recorder_create_partitions("
            "now() - make_interval(days => $1), now() + interval '2 days', 'day')",
            PARTITION_DAYS + 1,
        )

    async def grow(self, kind: str, target: int) -> dict[str, float]:
        """Prefill ``kind``'s database up to ``target`` transactions (and annotations)."""
        have = self.prefilled[kind]
        took: dict[str, float] = {}
        if target <= have:
            return took
        conn = await self.connect(kind)
        try:
            began = time.monotonic()
            indexes, fks = await drop_ledger_indexes(conn)
            for lo in range(have, target, CHUNK):
                hi = min(lo + CHUNK, target)
                if "transaction" in self.args.types:
                    await conn.execute(transactions_sql(kind, self.args.accounts), lo, hi)
                if "credit_annotation" in self.args.types:
                    await conn.execute(annotations_sql(kind), lo, hi)
                progress(f"{kind}: prefilled {hi:,} of {target:,}")
            took["insert_s"] = time.monotonic() - began
            began = time.monotonic()
            await restore_ledger_indexes(conn, indexes, fks, kind)
            took["indexes_s"] = time.monotonic() - began
            if have == 0 and "transaction" in self.args.types:
                began = time.monotonic()
                await conn.execute(balances_sql(self.args.accounts))
                took["balances_s"] = time.monotonic() - began
            began = time.monotonic()
            await conn.execute("VACUUM (ANALYZE)")
            took["vacuum_s"] = time.monotonic() - began
        finally:
            await conn.close()
        self.prefilled[kind] = target
        return took

    async def describe_point(self, kind: str, size: int, took: dict[str, float]) -> None:
        conn = await self.connect(kind)
        try:
            rows = {
                t: int(await conn.fetchval(f"SELECT count(*) FROM {t}"))
                for t in ("transactions", "operations", "credit_annotations", "balances")
            }
            point = {
                "size": size,
                "kind": kind,
                "rows": rows,
                "sizes": await table_sizes(conn),
                "pages": await relation_pages(conn),
                "prefill_s": took,
            }
        finally:
            await conn.close()
        self.out["points"].append(point)
        progress(f"{kind} at {size:,}: {rows} rows, {point['sizes']} bytes")

    # -- one drain ---------------------------------------------------------------------------

    async def set_compression(self, value: str) -> None:
        admin = await asyncpg.connect(self.server.dsn())
        try:
            await admin.execute(f"ALTER SYSTEM SET wal_compression = '{value}'")
            await admin.execute("SELECT pg_reload_conf()")
        finally:
            await admin.close()
        for _ in range(200):  # the postmaster applies the reload a moment later
            check = await asyncpg.connect(self.server.dsn())
            try:
                shown = await check.fetchval("SHOW wal_compression")
            finally:
                await check.close()
            if shown == value or (value == "on" and shown == "pglz"):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"wal_compression still {shown!r}, not {value!r}")

    async def drain_round(
        self,
        kind: str,
        record_type: str,
        compression: str,
        count: int,
        *,
        checkpoint_every: int = 0,
        filled: Topology | None = None,
    ) -> dict[str, Any]:
        """One drain; ``filled``: a queue already holding the ``count`` records."""
        await self.set_compression(compression)
        async with contextlib.AsyncExitStack() as stack:
            topology = filled
            if topology is None:
                topology = await stack.enter_async_context(temp_topology("bench_growth"))
                await fill_queue(topology, count, record_type, kind, self.args.accounts)
            conn = await self.connect(kind)
            try:
                return await self._measure(
                    conn, kind, topology, record_type, count, checkpoint_every
                )
            finally:
                await conn.close()

    async def _measure(
        self,
        conn: asyncpg.Connection,
        kind: str,
        topology: Any,
        record_type: str,
        count: int,
        checkpoint_every: int,
    ) -> dict[str, Any]:
        forced: list[asyncio.Task[Any]] = []
        side = await self.connect(kind)
        next_at = checkpoint_every

        def on_sample(now: float, acked: float, rss: list[float]) -> None:
            nonlocal next_at
            if checkpoint_every and acked >= next_at and acked < count:
                next_at += checkpoint_every
                if not forced or forced[-1].done():
                    forced.append(
                        asyncio.get_running_loop().create_task(side.execute("CHECKPOINT"))
                    )

        try:
            await conn.execute("CHECKPOINT")
            sizes0 = await table_sizes(conn)
            mark0 = await wal_mark(conn)
            recorder = RecorderProcess(self.dsn(kind), topology, RecorderConfig())
            try:
                result = await drain(
                    [recorder], count, PgCpu(self.server.dsn(), self.db(kind)), on_sample=on_sample
                )
            finally:
                code = recorder.stop()
            if forced:
                await asyncio.gather(*forced)
            mark1 = await wal_mark(conn)
        finally:
            await side.close()
        if code:
            raise RuntimeError(f"recorder exited with {code}")
        sizes1 = await table_sizes(conn)
        inserted = int(
            result.metrics.get(
                f"bulk_recorder_rows_inserted_total{{table={TABLE_OF[record_type]}}}", 0
            )
        )
        if inserted != count:
            raise RuntimeError(f"{inserted} rows inserted, {count} published")
        per_relation = None
        if self.args.walinspect and not checkpoint_every:  # a CHECKPOINT recycles the WAL
            per_relation = await wal_per_relation(conn, mark0.lsn, mark1.lsn)
        done = result.rate * result.seconds
        return {
            "rate": result.rate,
            "seconds": result.seconds,
            "cpu_us": (result.recorder_cpu_s + result.pg_cpu_s) / done * 1e6,
            "recorder_cpu_us": result.recorder_cpu_s / done * 1e6,
            "pg_cpu_us": result.pg_cpu_s / done * 1e6,
            "wal_bytes": await wal_between(conn, mark0, mark1),
            "wal_records": mark1.records - mark0.records,
            "wal_fpi": mark1.fpi - mark0.fpi,
            "checkpoints": mark1.checkpoints - mark0.checkpoints,
            "forced_checkpoints": len(forced),
            "disk_bytes": sum(sizes1.values()) - sum(sizes0.values()),
            "disk_by_table": {t: sizes1[t] - sizes0[t] for t in sizes1},
            "per_relation": per_relation,
        }


def variants(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """Every id kind x record type x wal_compression; v7p with wal_compression off only (the
    setting's effect is measured on the plain tables)."""
    return [
        (k, t, c)
        for k in args.ids
        for t in args.types
        for c in args.compression
        if k != "v7p" or c == "off"
    ]


def schedule(args: argparse.Namespace) -> list[tuple[int, str, str, str]]:
    """(round, kind, record type, wal_compression) in the order they run: rotated a round."""
    combos = variants(args)
    out: list[tuple[int, str, str, str]] = []
    for r in range(args.rounds):
        shift = r % len(combos)
        out.extend((r, *combo) for combo in combos[shift:] + combos[:shift])
    return out


async def fill_ahead(
    run: Run, stack: contextlib.AsyncExitStack, queues: dict[tuple[int, str, str, str], Topology]
) -> None:
    """Fill a queue for each round of the point (while the prefill runs: the broker and the
    publisher use the CPU PostgreSQL leaves)."""
    for key in schedule(run.args):
        _, kind, record_type, _ = key
        topology = await stack.enter_async_context(temp_topology("bench_growth"))
        await fill_queue(topology, run.args.count, record_type, kind, run.args.accounts)
        queues[key] = topology


async def measure_point(
    run: Run, size: int, queues: dict[tuple[int, str, str, str], Topology]
) -> None:
    args = run.args
    for key in schedule(args):
        r, kind, record_type, compression = key
        progress(f"size {size:,} round {r + 1}/{args.rounds}: {kind} {record_type} "
                 f"wal_compression={compression}")  # fmt: skip
        figures = await run.drain_round(
            kind, record_type, compression, args.count, filled=queues[key]
        )
        run.out["rounds"].append(
            {"size": size, "round": r, "kind": kind, "type": record_type,
             "compression": compression, **figures}
        )  # fmt: skip
        run.save()
        progress(f"  {figures['rate']:,.0f} msg/s, {figures['wal_bytes'] / args.count:,.0f} "
                 f"WAL B/record, {figures['wal_fpi'] / args.count:.2f} FPI/record")  # fmt: skip


async def index_rounds(run: Run, size: int) -> None:
    """Each secondary index dropped in turn: one drain without it, then built again."""
    args = run.args
    for kind in args.drop_in or args.ids:
        for record_type in args.types:
            for name in (n for n in SECONDARY[record_type] if n in args.drop_indexes):
                conn = await run.connect(kind)
                try:
                    found = [i for i in await index_defs(conn) if i.name == name]
                    if not found:  # an optional index this run did not create
                        continue
                    ix = found[0]
                    await conn.execute(f"DROP INDEX {name}")
                finally:
                    await conn.close()
                try:
                    progress(f"size {size:,}: {kind} {record_type} without {name}")
                    figures = await run.drain_round(kind, record_type, "off", args.count)
                finally:
                    conn = await run.connect(kind)
                    try:
                        await create_index(conn, ix, kind)
                    finally:
                        await conn.close()
                run.out["index_rounds"].append(
                    {"size": size, "kind": kind, "type": record_type, "dropped": name,
                     **figures}
                )  # fmt: skip
                run.save()


async def checkpoint_spacing(run: Run, size: int) -> None:
    args = run.args
    for kind in args.spacing_in or args.ids:
        for every in args.checkpoint_every:
            progress(f"size {size:,}: {kind}, {args.spacing_count:,} records, CHECKPOINT every "
                     f"{every or 'never'}")  # fmt: skip
            figures = await run.drain_round(
                kind, "transaction", "off", args.spacing_count, checkpoint_every=every
            )
            run.out["checkpoint_spacing"].append(
                {"size": size, "kind": kind, "every": every, "count": args.spacing_count,
                 **figures}
            )  # fmt: skip
            run.save()


async def main_async(args: argparse.Namespace) -> None:
    if args.quick:
        args.points, args.count, args.rounds = [0, 50_000], 2_000, 1
        args.shared_buffers, args.max_wal_size = "256MB", "4GB"
        args.spacing_count, args.checkpoint_every = 4_000, [1_000, 0]
        args.accounts = 10_000
    if not available():
        raise SystemExit("PostgreSQL 15 server binaries not found (/usr/lib/postgresql/15/bin)")
    facts = await machine_facts()
    emit("Machine", facts_table(facts))
    with private_server(server_settings(args), Path(args.data_base)) as server:
        run = Run(args, server)
        run.out["facts"] = facts
        run.out["server"] = await server_facts(server)
        await run.create_databases()
        for size in sorted(args.points):
            async with contextlib.AsyncExitStack() as stack:
                queues: dict[tuple[int, str, str, str], Topology] = {}
                filler = asyncio.create_task(fill_ahead(run, stack, queues))
                took = await asyncio.gather(*(run.grow(kind, size) for kind in args.ids))
                await filler
                for kind, spent in zip(args.ids, took, strict=True):
                    await run.describe_point(kind, size, spent)
                run.save()
                await measure_point(run, size, queues)
        largest = max(args.points)
        if args.drop_indexes:
            await index_rounds(run, largest)
        if args.checkpoint_every:
            await checkpoint_spacing(run, largest)
        run.save()
    from benchmarks.growth_report import render

    for title, body in render(run.out):
        emit(title, body)


async def server_facts(server: PgServer) -> dict[str, str]:
    conn = await asyncpg.connect(server.dsn())
    try:
        names = ("server_version", "shared_buffers", "max_wal_size", "checkpoint_timeout",
                 "fsync", "synchronous_commit", "full_page_writes", "wal_level",
                 "data_checksums", "autovacuum")  # fmt: skip
        return {n: str(await conn.fetchval(f"SHOW {n}")) for n in names}
    finally:
        await conn.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="empty and 50,000 rows, 2,000 msgs")
    parser.add_argument("--points", type=int, nargs="+", default=[0, 2_000_000, 10_000_000])
    parser.add_argument("--count", type=int, default=30_000, help="records a round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--accounts", type=int, default=ACCOUNTS, help="the accounts' universe")
    parser.add_argument(
        "--ids",
        nargs="+",
        default=["v4", "v7"],
        choices=KINDS,
        help="v4: random ids, v7: time-ordered, v7p: v7 with the ledger tables "
        "partitioned by day of id",
    )
    parser.add_argument("--types", nargs="+", default=["transaction", "credit_annotation"],
                        choices=list(TABLE_OF))  # fmt: skip
    parser.add_argument("--compression", nargs="+", default=["off", "on"])
    parser.add_argument("--partitioning-sql", default=str(PARTITIONING_SQL),
                        help="v7p: the script that partitions the ledger tables")  # fmt: skip
    parser.add_argument("--no-walinspect", dest="walinspect", action="store_false")
    parser.add_argument(
        "--optional-indexes",
        action="store_true",
        help="add the indexes migration 011 dropped (account statements, documents)",
    )
    parser.add_argument(
        "--drop-indexes",
        nargs="*",
        default=[n for v in SECONDARY.values() for n in v],
        help="at the largest point, one round without each (none: skip)",
    )
    parser.add_argument(
        "--drop-in",
        nargs="*",
        choices=["v4", "v7"],
        help="the id kinds of those rounds (default: all of --ids)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        nargs="*",
        default=[10_000, 30_000, 0],
        help="0: no forced checkpoint",
    )
    parser.add_argument(
        "--spacing-in",
        nargs="*",
        choices=KINDS,
        help="the id kinds of the spacing drains (default: all of --ids)",
    )
    parser.add_argument("--spacing-count", type=int, default=90_000)
    parser.add_argument("--shared-buffers", default="3GB")
    parser.add_argument("--max-wal-size", default="12GB")
    parser.add_argument("--data-base", default="/var/tmp", help="where the data folder goes")
    parser.add_argument("--json", help="write raw results here (for the charts)")
    return parser


def main() -> None:
    run_main(build_parser(), main_async)


if __name__ == "__main__":
    main()
