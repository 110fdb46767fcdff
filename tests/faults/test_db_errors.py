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
from consumer.tools.loadgen import Generator
from tests.conftest import Broker, RunningRecorder, wait_for
from tests.faults.audit import audit_run, report_for
from tests.faults.pg_locks import (
    close_gate,
    relation_waiters,
    wait_for_relation_waiter,
    wait_for_xact_waiter,
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


def batch(seed: int) -> tuple[dict[str, Any], list[tuple[bytes, str | None]]]:
    """One transaction and three annotations: one flush of four."""
    gen = Generator.create(seed=seed)
    tx = gen.transaction()
    messages: list[tuple[bytes, str | None]] = [(json.dumps(tx).encode(), "transaction")]
    for _ in range(3):
        messages.append((json.dumps(gen.credit_annotation()).encode(), "credit_annotation"))
    return tx, messages


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
    """The flush inserts transaction A, then waits at a gate on ``operations``; a partner that
    holds ``balances`` starts waiting for A; the gate opens, the flush reaches ``balances`` and
    closes the cycle. Its short deadlock_timeout makes it the victim; the partner's long one
    keeps it waiting. A fresh gate is queued behind the flush before each opening, so every
    retry stops at a gate again."""
    await migrate(database_url)
    admin = await db()
    await admin.execute(
        f"ALTER DATABASE \"{database_name(database_url)}\" SET deadlock_timeout = '100ms'"
    )
    partner, gates = await db(), [await db(), await db()]
    await partner.execute("SET deadlock_timeout = '60s'")
    partner_pid = await pid_of(partner)
    gate_pids = [await pid_of(g) for g in gates]
    mine = [await pid_of(admin), partner_pid, *gate_pids]
    tx, messages = batch(seed=102)
    await partner.execute("BEGIN")
    await partner.execute("LOCK TABLE balances IN SHARE ROW EXCLUSIVE MODE")
    await close_gate(gates[0], "operations")
    rec = await start(start_recorder, make_settings)
    await broker.publish_many(messages)
    for n in range(CYCLES):
        gate, queued_gate = gates[n % 2], gates[(n + 1) % 2]
        await wait_for_relation_waiter(admin, "operations", exclude=mine)  # A is inserted
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
        await wait_for_xact_waiter(admin, partner_pid)  # the partner waits for the flush
        queued = asyncio.create_task(close_gate(queued_gate, "operations"))

        async def queued_behind(pid: int = gate_pids[(n + 1) % 2]) -> bool:
            return pid in await relation_waiters(admin, "operations")

        await wait_for(queued_behind)
        await gate.execute("COMMIT")  # the flush goes on to balances: a cycle, and its victim
        await wait_for(lambda: len(write_errors) > n)  # noqa: B023 - this attempt failed
        await asyncio.wait_for(clash, 30)  # the partner got A: the flush rolled back
        await partner.execute("ROLLBACK TO SAVEPOINT cycle")
        await asyncio.wait_for(queued, 30)
    await partner.execute("ROLLBACK")
    await gates[CYCLES % 2].execute("COMMIT")
    await recorded_once(rec, broker, db, messages)
    assert write_errors == ["40P01"] * CYCLES
    assert rec.value("bulk_recorder_db_retries_total") == CYCLES


async def test_serialization_failure_of_the_flush_is_an_outage(
    make_settings, start_recorder, broker, db, database_url, write_errors: list[str]
) -> None:
    """Repeatable read: the flush's snapshot is taken at its first insert; a gate holding
    ``balances`` has updated the debited account's row and commits while the flush waits for
    it, so the flush's upsert meets a row changed after its snapshot. A fresh gate, queued
    behind the flush, updates the row again for the next attempt."""
    await migrate(database_url)
    admin = await db()
    await admin.execute(
        f'ALTER DATABASE "{database_name(database_url)}"'
        " SET default_transaction_isolation = 'repeatable read'"
    )
    tx, messages = batch(seed=103)
    debit = next(op for op in tx["operations"] if op["type"] == "DEBIT")
    await admin.execute(
        "INSERT INTO balances (account_id, asset_code, available) VALUES ($1, $2, 0)",
        debit["account_id"],
        debit["asset_code"],
    )
    touch = "UPDATE balances SET available = available WHERE account_id = $1 AND asset_code = $2"
    gates = [await db(), await db()]
    gate_pids = [await pid_of(g) for g in gates]
    mine = [await pid_of(admin), *gate_pids]

    async def open_gate_and_touch(conn: asyncpg.Connection) -> None:
        await conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
        await conn.execute("LOCK TABLE balances IN SHARE ROW EXCLUSIVE MODE")
        await conn.execute(touch, debit["account_id"], debit["asset_code"])

    await open_gate_and_touch(gates[0])
    rec = await start(start_recorder, make_settings)
    await broker.publish_many(messages)
    for n in range(CYCLES):
        gate, queued_gate = gates[n % 2], gates[(n + 1) % 2]
        await wait_for_relation_waiter(admin, "balances", exclude=mine)  # snapshot taken
        queued = asyncio.create_task(open_gate_and_touch(queued_gate))

        async def queued_behind(pid: int = gate_pids[(n + 1) % 2]) -> bool:
            return pid in await relation_waiters(admin, "balances")

        await wait_for(queued_behind)
        await gate.execute("COMMIT")  # the flush's upsert meets the committed update: 40001
        await wait_for(lambda: len(write_errors) > n)  # noqa: B023 - this attempt failed
        await asyncio.wait_for(queued, 30)
    await gates[CYCLES % 2].execute("ROLLBACK")
    await recorded_once(rec, broker, db, messages)
    assert write_errors == ["40001"] * CYCLES
    assert rec.value("bulk_recorder_db_retries_total") == CYCLES
