"""Real PostgreSQL errors that mean "try again", provoked on the recorder's own flush.

A deadlock (40P01) whose victim is the flush, a serialization failure (40001), a cancelled
statement (57014, pg_cancel_backend) and a terminated backend (57P01, pg_terminate_backend):
each is an outage, never bad data. Nothing is rejected or dead-lettered, the flush is retried
and everything is recorded once. Each fault is made several times in a row on the same batch,
so a recorder that took it for bad data would split the batch down to single rows and reject
one (tests/faults/pg_locks.py holds the flush at a lock while the fault is set up).

A per-database setting (ALTER DATABASE ... SET) reaches the recorder's sessions and picks the
victim: a short deadlock_timeout, or repeatable read as the default isolation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.recorder.writer import PgWriter, WriteResult
from consumer.tools.generator import Generator
from tests.conftest import Broker, RunningRecorder, wait_for
from tests.faults.audit import audit_run, report_for
from tests.faults.pg_locks import (
    close_gate,
    wait_for_blocked_by,
    wait_for_relation_waiter,
)

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

CYCLES = 3  # enough for a batch of 4 to be split down to one row: 4 -> 2 -> 1
Connect = Callable[[], Awaitable[asyncpg.Connection]]


def sqlstate_of(exc: BaseException) -> str:
    """The first SQLSTATE in the exception's chain, or its type when it has none."""
    seen: BaseException | None = exc
    while seen is not None:
        state = getattr(seen, "sqlstate", None)
        if state:
            return str(state)
        seen = seen.__cause__ or seen.__context__
    return type(exc).__name__


@pytest.fixture
def write_errors(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQLSTATE of every failure of the recorder's writer (a spy: behaviour unchanged)."""
    seen: list[str] = []
    original = PgWriter.write

    async def spy(self: PgWriter, records: Any) -> WriteResult:
        try:
            return await original(self, records)
        except Exception as exc:
            seen.append(sqlstate_of(exc.__cause__ or exc))
            raise

    monkeypatch.setattr(PgWriter, "write", spy)
    return seen


def database_name(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/")


async def pid_of(conn: asyncpg.Connection) -> int:
    return int(await conn.fetchval("SELECT pg_backend_pid()"))


def batch(
    seed: int, transactions: int = 1
) -> tuple[dict[str, Any], list[tuple[bytes, str | None]]]:
    """``transactions`` transactions and annotations to make four messages: one flush of four.
    Returns the first transaction too."""
    gen = Generator.create(seed=seed)
    txs = [gen.transaction() for _ in range(transactions)]
    messages: list[tuple[bytes, str | None]] = [
        (json.dumps(tx).encode(), "transaction") for tx in txs
    ]
    for _ in range(4 - transactions):
        messages.append((json.dumps(gen.credit_annotation()).encode(), "credit_annotation"))
    return txs[0], messages


LOCK_ROW = "SELECT 1 FROM balances WHERE account_id = $1 AND asset_code = $2 FOR UPDATE"


async def own_balance_row(admin: asyncpg.Connection, tx: dict[str, Any]) -> tuple[str, str]:
    """Store the balance row of the transaction's debited account; its key."""
    debit = next(op for op in tx["operations"] if op["type"] == "DEBIT")
    key = (debit["account_id"], debit["asset_code"])
    await admin.execute(
        "INSERT INTO balances (account_id, asset_code, available) VALUES ($1, $2, 0)", *key
    )
    return key


async def start(start_recorder: Any, make_settings: Any) -> RunningRecorder:
    rec: RunningRecorder = await start_recorder(
        make_settings(
            bulk_recorder_size=4, bulk_recorder_flush_timeout_ms=50, rabbitmq_numbers_of_workers=1
        )
    )
    return rec


async def recorded_once(
    rec: RunningRecorder,
    broker: Broker,
    connect: Connect,
    messages: list[tuple[bytes, str | None]],
) -> None:
    """Everything acked, nothing rejected or dead-lettered, the exact audit."""
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == len(messages))
    await rec.shutdown()
    assert rec.value("bulk_recorder_messages_rejected_total") == 0
    assert rec.value("bulk_recorder_messages_released_total") == 0
    assert rec.value("bulk_recorder_messages_dead_lettered_total", reason="database") == 0
    assert rec.value("bulk_recorder_fallback_total") == 0  # never split as if it were data
    report, expected = report_for(messages)
    audit = await audit_run(await connect(), broker, report, faults=CYCLES, expected_dlq=expected)
    audit.assert_exact(dlq_surplus_allowed=False)


async def test_admin_shutdown_of_the_flush_is_an_outage(
    make_settings, start_recorder, broker, db, database_url, write_errors: list[str]
) -> None:
    """pg_cancel_backend (57014) and pg_terminate_backend (57P01) on the flush's backend.

    A terminated backend reaches asyncpg as a lost connection (InterfaceError after 08003), a
    cancelled statement as 57014 on a live connection: both must be retried."""
    await migrate(database_url)
    admin, gate = await db(), await db()
    mine = [await pid_of(admin), await pid_of(gate)]
    _, messages = batch(seed=101)
    await close_gate(gate, "credit_annotations")
    rec = await start(start_recorder, make_settings)
    await broker.publish_many(messages)
    for n, how in enumerate(["pg_cancel_backend"] * CYCLES + ["pg_terminate_backend"] * CYCLES):
        pid = await wait_for_relation_waiter(admin, "credit_annotations", exclude=mine)
        assert await admin.fetchval(f"SELECT {how}($1)", pid)
        await wait_for(lambda: len(write_errors) > n)  # noqa: B023 - this attempt failed
    await gate.execute("ROLLBACK")
    await recorded_once(rec, broker, db, messages)
    assert write_errors[:CYCLES] == ["57014"] * CYCLES
    # the terminated connection: asyncpg reports it lost (08003), or the server's 57P01 first
    assert len(write_errors) == 2 * CYCLES
    assert set(write_errors[CYCLES:]) <= {"08003", "57P01"}, write_errors
    assert rec.value("bulk_recorder_db_retries_total") == 2 * CYCLES


async def test_deadlock_victim_flush_is_an_outage(
    make_settings, start_recorder, broker, db, database_url, write_errors: list[str]
) -> None:
    """A partner holds the balance row of the flush's debited account. The flush's statement
    inserts transaction A and its operations, then waits for that row; the partner then inserts
    A and waits for the flush: a cycle. The flush's short deadlock_timeout makes it the victim;
    the partner's long one keeps it waiting. The partner rolls back to a savepoint (A goes, the
    row lock stays), so every retry meets the same cycle."""
    await migrate(database_url)
    admin = await db()
    await admin.execute(
        f"ALTER DATABASE \"{database_name(database_url)}\" SET deadlock_timeout = '1s'"
    )
    tx, messages = batch(seed=102)
    debit = await own_balance_row(admin, tx)
    partner = await db()
    await partner.execute("SET deadlock_timeout = '60s'")
    partner_pid = await pid_of(partner)
    mine = [await pid_of(admin), partner_pid]
    await partner.execute("BEGIN")
    await partner.execute(LOCK_ROW, *debit)
    rec = await start(start_recorder, make_settings)
    await broker.publish_many(messages)
    for n in range(CYCLES):
        await wait_for_blocked_by(admin, partner_pid, exclude=mine)  # A is in, the row is not
        await partner.execute("SAVEPOINT cycle")
        clash = asyncio.create_task(
            partner.execute(
                "INSERT INTO transactions (id, organization_id, ledger_id, status, asset_code,"
                " amount) VALUES ($1, $2, $3, 'PENDING', $4, 1)",
                tx["id"],
                tx["organization_id"],
                tx["ledger_id"],
                tx["asset_code"],
            )
        )
        await wait_for(lambda: len(write_errors) > n)  # noqa: B023 - this attempt failed
        await asyncio.wait_for(clash, 30)  # the partner got A: the flush rolled back
        await partner.execute("ROLLBACK TO SAVEPOINT cycle")
    await partner.execute("ROLLBACK")
    await recorded_once(rec, broker, db, messages)
    assert write_errors == ["40P01"] * CYCLES
    assert rec.value("bulk_recorder_db_retries_total") == CYCLES


async def test_serialization_failure_of_the_flush_is_an_outage(
    make_settings, start_recorder, broker, db, database_url, write_errors: list[str]
) -> None:
    """Repeatable read: the flush's snapshot is taken when its statement starts. Its two
    transactions move four balance rows; three gates have each updated one of them, uncommitted. The
    flush upserts the rows in key order and waits for the first gate's row; that gate commits,
    so the flush meets a row changed after its snapshot (40001). The retry's snapshot sees that
    row, and waits at the next gate's: one failure per gate, in order."""
    await migrate(database_url)
    admin = await db()
    await admin.execute(
        f'ALTER DATABASE "{database_name(database_url)}"'
        " SET default_transaction_isolation = 'repeatable read'"
    )
    _, messages = batch(seed=103, transactions=2)
    operations = [op for body, _ in messages[:2] for op in json.loads(body)["operations"]]
    keys = sorted({(op["account_id"], op["asset_code"]) for op in operations})[:CYCLES]
    gates = [await db() for _ in keys]
    gate_pids = [await pid_of(g) for g in gates]
    mine = [await pid_of(admin), *gate_pids]
    for gate, key in zip(gates, keys, strict=True):
        await admin.execute(
            "INSERT INTO balances (account_id, asset_code, available) VALUES ($1, $2, 0)", *key
        )
        await gate.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        await gate.execute(
            "UPDATE balances SET available = available WHERE account_id = $1 AND asset_code = $2",
            *key,
        )
    rec = await start(start_recorder, make_settings)
    await broker.publish_many(messages)
    for n, gate in enumerate(gates):
        await wait_for_blocked_by(admin, gate_pids[n], exclude=mine)  # the flush waits here
        await gate.execute("COMMIT")  # the flush's upsert meets the committed update: 40001
        await wait_for(lambda: len(write_errors) > n)  # noqa: B023 - this attempt failed
    await recorded_once(rec, broker, db, messages)
    assert write_errors == ["40001"] * CYCLES
    assert rec.value("bulk_recorder_db_retries_total") == CYCLES
