"""The ack frames themselves, read off the wire between the recorder and RabbitMQ.

The recorder's counters say what it meant to do; an AMQP frame tap (tests/faults/amqp_tap.py)
decodes what it actually sent: every Basic.Ack has ``multiple`` unset, every delivery tag is
acked once and only on the channel that delivered it, and no ack frame leaves before its row
is committed (the tap holds each ack frame while a separate connection looks for the row).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence

import asyncpg
import pytest

from bulk_recorder.infra.migrate import migrate
from consumer.tools.generator import Generator
from tests.conftest import wait_for
from tests.faults.amqp_tap import AmqpTap
from tests.faults.audit import audit_run, report_for
from tests.faults.conftest import via_proxy
from tests.faults.pg_locks import close_gate, relation_waiters, wait_for_relation_waiter

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

Messages = list[tuple[bytes, str | None]]

_COMMITTED = """
SELECT id::text FROM transactions WHERE id = ANY($1::uuid[])
UNION ALL
SELECT id::text FROM credit_annotations WHERE id = ANY($1::uuid[])
"""


def committed_check(
    conn: asyncpg.Connection, valid_ids: set[str]
) -> Callable[[Sequence[bytes]], Awaitable[list[bool | None]]]:
    """For each acked body: is its record's row visible (committed) to another session now?

    Bodies that are not valid records (dead-lettered, then acked) are not checked (None).
    """
    lock = asyncio.Lock()

    async def check(bodies: Sequence[bytes]) -> list[bool | None]:
        ids: list[str | None] = []
        for body in bodies:
            try:
                record_id = json.loads(body).get("id")
            except (ValueError, AttributeError):
                record_id = None
            ids.append(record_id if record_id in valid_ids else None)
        wanted = [i for i in ids if i is not None]
        async with lock:
            visible = {r[0] for r in await conn.fetch(_COMMITTED, wanted)} if wanted else set()
        return [None if i is None else i in visible for i in ids]

    return check


def _messages(
    seed: int,
    valid: int,
    duplicates: int,
    invalid: int,
    kinds: tuple[str, ...] = ("transaction", "credit_annotation"),
) -> Messages:
    gen = Generator.create(seed=seed)
    out: Messages = []
    for n in range(valid):
        kind = kinds[n % len(kinds)]
        out.append((json.dumps(gen.record(kind)).encode(), kind))
    out += out[:duplicates]  # the same bodies again: acked, recorded once
    for n in range(invalid):
        body, record_type, _ = gen.invalid(n)
        out.append((body, record_type))
    return out


async def test_every_ack_frame_is_single_once_on_its_channel_and_after_its_commit(
    make_settings, start_recorder, broker, db, database_url, services, amqp_tap: AmqpTap
) -> None:
    tap = amqp_tap
    await migrate(database_url)
    messages = _messages(seed=71, valid=240, duplicates=30, invalid=8)
    report, expected_dlq = report_for(messages)
    valid_ids = set().union(*report.ids.values())
    tap.check_ack = committed_check(await db(), valid_ids)
    rec = await start_recorder(
        make_settings(
            rabbitmq_url=via_proxy(services.rabbitmq_url, tap),
            bulk_recorder_size=20,
            bulk_recorder_flush_timeout_ms=50,
            rabbitmq_numbers_of_workers=3,
        )
    )
    await broker.publish_many(messages)
    await wait_for(
        lambda: (
            rec.value("bulk_recorder_messages_acked_total") == report.valid + report.duplicates
            and len(tap.acks()) == len(messages)
        )
    )
    await rec.shutdown()

    assert tap.problems() == []
    acks = tap.acks()
    # one ack per delivery, nothing else settled: no fault, so nothing rejected or released
    assert len(acks) == len(tap.delivered) == len(messages)
    assert {a.key for a in acks} == set(tap.delivered)
    assert [s for s in tap.settles if s.method != "ack"] == []
    # every valid record's ack was checked against the database, and found committed
    assert sum(a.committed is True for a in acks) == report.valid + report.duplicates
    audit = await audit_run(await db(), broker, report, faults=0, expected_dlq=expected_dlq)
    audit.assert_exact(dlq_surplus_allowed=False)


async def test_a_flush_whose_channel_died_mid_write_is_never_acked_on_the_new_channel(
    make_settings, start_recorder, broker, db, database_url, services, amqp_tap: AmqpTap
) -> None:
    """Tags 1..n of the dead channel are tags 1..n of the new one too (for other deliveries or,
    here, the redelivered copies): acking the old flush there would ack what is not written."""
    tap = amqp_tap
    await migrate(database_url)
    # annotations only: every write of them stops at the gate, the first statement of a flush
    messages = _messages(seed=72, valid=10, duplicates=0, invalid=0, kinds=("credit_annotation",))
    report, expected_dlq = report_for(messages)
    admin = await db()
    gate = await db()
    tap.check_ack = committed_check(admin, set().union(*report.ids.values()))
    rec = await start_recorder(
        make_settings(
            rabbitmq_url=via_proxy(services.rabbitmq_url, tap),
            bulk_recorder_size=len(messages),
            bulk_recorder_flush_timeout_ms=50,
            rabbitmq_numbers_of_workers=2,
        )
    )
    await close_gate(gate, "credit_annotations")
    await broker.publish_many(messages)
    first = await wait_for_relation_waiter(admin, "credit_annotations")  # the write is held

    tap.cut()  # the broker connection dies while the first flush waits for the database
    await wait_for(lambda: not rec.recorder.ready()[0])
    tap.restore()
    await wait_for(lambda: rec.value("bulk_recorder_broker_reconnects_total") == 1)

    # The broker redelivers the ten on the new channel: a second flush, held at the gate too.
    async def second_flush_waits() -> bool:
        return bool(await relation_waiters(admin, "credit_annotations", exclude=[first]))

    await wait_for(second_flush_waits)
    await gate.execute("ROLLBACK")  # both flushes commit now: one inserts, one finds the rows

    def settled() -> float:
        acked = rec.value("bulk_recorder_messages_acked_total")
        return float(acked + rec.value("bulk_recorder_messages_dropped_total"))

    await wait_for(lambda: settled() >= 2 * len(messages))  # both flushes are settled
    await rec.shutdown()

    assert tap.problems() == []
    # the old flush's deliveries were dropped (their tags mean nothing now), the new acked
    assert rec.value("bulk_recorder_messages_dropped_total") == len(messages)
    assert rec.value("bulk_recorder_messages_acked_total") == len(messages)
    acks = tap.acks()
    assert all(a.key[0] != 1 for a in acks)  # nothing acked on the cut connection
    assert len(acks) == len(messages)
    assert all(a.committed for a in acks)
    audit = await audit_run(admin, broker, report, faults=tap.faults, expected_dlq=expected_dlq)
    audit.assert_exact(dlq_surplus_allowed=False)
