"""The database-ceiling benchmark (benchmarks/bench_db_ceiling.py) runs end to end in its quick
mode, so that it cannot rot between the runs whose figures docs/performance.md quotes: the
flushes planned by the recorder's own writer, 1 and 2 writers replaying them on the machine's
PostgreSQL in a database of the benchmark's own, its CPU readings, its tables, and the database
dropped afterwards. It proves no promise of the service and no speed, only that the benchmark
still measures what it says.

The flush plan is checked against the writer it copies: what it replays is what
``PgWriter.write`` sends, statement for statement, one transaction or autocommit alike.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import asyncpg
import pytest

from benchmarks.bench_db_ceiling import make_records
from benchmarks.support.flush_plan import plan_flush, replay
from bulk_recorder.infra.migrate import migrate
from bulk_recorder.recorder.statements import (
    APPLY_BALANCES,
    INSERT_ANNOTATIONS,
    WRITE_TRANSACTIONS,
)
from tests.conftest import Services, with_database

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.postgres]


async def test_a_planned_flush_is_the_writers_flush(database_url: str) -> None:
    transactions = make_records("transaction", 1_000, accounts=50, seed=1)
    one = await plan_flush(transactions[:200])
    assert [s.sql for s in one.steps] == [WRITE_TRANSACTIONS]
    assert not one.in_transaction  # one statement: autocommit, as the writer sends it
    # past 1,000 operations: two chunks and the balances at the end, in one transaction
    many = await plan_flush(transactions)
    assert [s.sql for s in many.steps] == [WRITE_TRANSACTIONS, WRITE_TRANSACTIONS, APPLY_BALANCES]
    assert many.in_transaction
    annotations = await plan_flush(make_records("credit_annotation", 300, accounts=50, seed=2))
    assert [s.sql for s in annotations.steps] == [INSERT_ANNOTATIONS]
    # replayed on the real schema: every record new once, none the second time
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        assert await replay(conn, many) == 1_000
        assert await replay(conn, many) == 0
        assert await conn.fetchval("SELECT count(*) FROM operations") == 2_000
        assert await conn.fetchval("SELECT sum(available) FROM balances") == 0
        assert await replay(conn, annotations) == 300
    finally:
        await conn.close()


async def _databases(services: Services) -> set[str]:
    conn = await asyncpg.connect(with_database(services.database_url, "postgres"))
    try:
        rows = await conn.fetch(
            "SELECT datname FROM pg_database WHERE datname LIKE 'bench_db_ceiling_%'"
        )
    finally:
        await conn.close()
    return {r["datname"] for r in rows}


async def test_quick_mode_end_to_end(services: Services, tmp_path: Path) -> None:
    out = tmp_path / "ceiling.json"
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.bench_db_ceiling", "--quick", "--json", str(out),
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "DATABASE_URL": services.database_url},
    )  # fmt: skip
    stdout_bytes, stderr_bytes = await asyncio.wait_for(process.communicate(), 240)
    stdout = stdout_bytes.decode()
    assert process.returncode == 0, stderr_bytes.decode()[-3000:]
    data = json.loads(out.read_text())
    points = {(p["record_type"], p["writers"]): p for p in data["points"]}
    assert set(points) == {(t, w) for t in ("transaction", "credit_annotation") for w in (1, 2)}
    for p in points.values():
        assert p["records"] == 4_000
        assert p["rate"] > 0
        assert p["pg_cpu_s"] > 0, "the database's backends were not read"
        assert p["writers_cpu_s"] > 0
        assert p["machine_busy_s"] > 0
        assert 0 <= p["lock_waiters"] <= p["writers"]
    summary = {s["record_type"]: s for s in data["summary"]}
    assert set(summary) == {"transaction", "credit_annotation"}
    for s in summary.values():
        assert s["peak_writers"] in (1, 2)
        assert s["records_per_pg_core"] > 0
    for title in (
        "Database ceiling: transaction",
        "Database ceiling: credit_annotation",
        "The ceiling against one quorum queue (10,000 msg/s)",
        "| writers waiting on a lock |",
    ):
        assert title in stdout
    assert data["database"].startswith("bench_db_ceiling_")
    assert data["database"] not in await _databases(services), "the database was left behind"
