"""The known limits of docs/guarantees.md, shown for real: what happens, and how soon.

- Every return counts: a valid message held by a recorder that crashes, again and again, is
  dead-lettered by the broker past RABBITMQ_DELIVERY_LIMIT, with x-death and no reason header.
- A held (partitioned) database connection becomes an outage after asyncpg's client-side
  command timeout (BULK_RECORDER_DB_COMMAND_TIMEOUT_S), not a server-side statement timeout.
- A held broker connection is noticed through the AMQP heartbeat (``?heartbeat=N``) and
  re-established once the network heals.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.recorder.writer import PgWriter
from consumer.delivery import ERROR_HEADER
from consumer.tools.generator import Generator
from consumer.topology import Topology
from tests.conftest import Broker, wait_for
from tests.faults.audit import audit_run, report_for, settled_count
from tests.faults.conftest import via_proxy
from tests.faults.pg_locks import close_gate, wait_for_backends_gone, wait_for_relation_waiter

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


async def test_a_valid_message_held_through_crashes_is_dead_lettered_by_the_broker(
    make_settings, recorders, db, database_url, services, topology: Topology
) -> None:
    """Each crash returns the message it held; the broker counts every return, and after
    RABBITMQ_DELIVERY_LIMIT of them it dead-letters the message itself (x-death, reason
    delivery_limit) without the recorder's reason header."""
    limit = 2  # a small limit keeps the run short; the default 5 takes six crashes
    limited = Topology(topology.exchange, topology.queue, delivery_limit=limit)
    broker = Broker(services.rabbitmq_url, limited)
    await broker.open()
    try:
        await migrate(database_url)
        admin, gate = await db(), await db()
        await close_gate(gate, "credit_annotations")  # every flush of it waits: it is held
        body = json.dumps(Generator.create(seed=111).credit_annotation()).encode()
        await broker.publish(body, "credit_annotation")
        settings = make_settings(rabbitmq_delivery_limit=limit)
        proc = await recorders.start(settings)
        for crash in range(1, limit + 2):
            if crash > 1:
                await proc.start()
            held_by = await wait_for_relation_waiter(admin, "credit_annotations", timeout=60)
            await proc.kill()  # SIGKILL while its flush holds the message
            await admin.fetchval("SELECT pg_terminate_backend($1)", held_by)  # its orphan
            # so the next waiter found is the next recorder's
            await wait_for_backends_gone(admin, [held_by])
            if crash <= limit:  # returned: back in the queue, not dead-lettered yet
                assert await settled_count(broker, limited.queue) == 1
                assert await broker.ready_count(limited.dead_letter_queue) == 0

        async def dead_lettered() -> bool:
            return await broker.ready_count(limited.dead_letter_queue) == 1

        await wait_for(dead_lettered)
        assert await settled_count(broker, limited.queue) == 0
        [message] = await broker.drain(limited.dead_letter_queue)
        assert message.body == body
        headers: dict[str, Any] = dict(message.headers or {})
        assert ERROR_HEADER not in headers  # no reason: the recorder never judged it
        [death] = headers["x-death"]
        assert death["reason"] == "delivery_limit"
        assert death["queue"] == limited.queue
        assert proc.kills == limit + 1
        await gate.execute("ROLLBACK")
        assert await admin.fetchval("SELECT count(*) FROM credit_annotations") == 0
    finally:
        await broker.close()


async def test_a_held_database_connection_is_an_outage_after_the_command_timeout(
    make_settings, start_recorder, broker, db, database_url, pg_proxy, monkeypatch
) -> None:
    """A partition: the flush's statement gets no answer and no error. asyncpg's command
    timeout (the setting, 1 s here instead of 15) ends the wait with TimeoutError: an outage,
    retried, nothing judged; everything is recorded once the network heals."""
    seen: list[str] = []
    original = PgWriter.write

    async def spy(self, records):
        try:
            return await original(self, records)
        except Exception as exc:
            seen.append(" <- ".join(_chain(exc.__cause__ or exc)))
            raise

    monkeypatch.setattr(PgWriter, "write", spy)
    await migrate(database_url)
    rec = await start_recorder(
        make_settings(
            database_url=via_proxy(database_url, pg_proxy),
            bulk_recorder_db_command_timeout_s=1.0,
            rabbitmq_numbers_of_workers=1,
            bulk_recorder_size=5,
            bulk_recorder_flush_timeout_ms=50,
        )
    )
    gen = Generator.create(seed=112)
    messages: list[tuple[bytes, str | None]] = [
        (json.dumps(gen.credit_annotation()).encode(), "credit_annotation") for _ in range(5)
    ]
    pg_proxy.blackhole()  # the pool's connection stays open; nothing gets through
    await broker.publish_many(messages)
    # Noticed within the command timeout and a margin, far sooner than the 15 s default.
    await wait_for(lambda: rec.value("bulk_recorder_paused") == 1, timeout=10)
    assert "TimeoutError" in seen[0].split(" <- "), seen  # no error: the wait just ended
    assert rec.value("bulk_recorder_messages_acked_total") == 0
    pg_proxy.restore()
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == len(messages))
    await rec.shutdown()
    assert rec.value("bulk_recorder_messages_rejected_total") == 0
    assert rec.value("bulk_recorder_messages_released_total") == 0
    report, expected = report_for(messages)
    audit = await audit_run(await db(), broker, report, faults=1, expected_dlq=expected)
    audit.assert_exact(dlq_surplus_allowed=False)


def _chain(exc: BaseException | None) -> list[str]:
    """The exception's type and those it was raised from or while handling."""
    names = []
    while exc is not None:
        names.append(type(exc).__name__)
        exc = exc.__cause__ or exc.__context__
    return names


@pytest.mark.exclusive(
    reason="counts reconnects under a 1 s heartbeat, which a busy machine misses"
)
async def test_a_held_broker_connection_is_noticed_by_the_heartbeat_and_reopened(
    make_settings, start_recorder, broker, db, services, mq_proxy
) -> None:
    """With ``?heartbeat=1`` a broker connection that is held (no error, no bytes) is given up
    after aiormq's grace of three missed heartbeats, long before the 60 s default would allow,
    and a new one is opened when the network heals."""
    heartbeat = 1
    url = via_proxy(services.rabbitmq_url, mq_proxy) + f"?heartbeat={heartbeat}"
    rec = await start_recorder(make_settings(rabbitmq_url=url, bulk_recorder_flush_timeout_ms=50))
    gen = Generator.create(seed=113)
    before = json.dumps(gen.credit_annotation()).encode()
    after = json.dumps(gen.credit_annotation()).encode()
    await broker.publish(before, "credit_annotation")
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 1)
    mq_proxy.blackhole()
    # (heartbeat + 1) x 3 = 6 s of silence, then the connection is closed: well within 30 s,
    # where the default heartbeat (60 s) would take three minutes.
    await wait_for(lambda: not rec.recorder.ready()[0], timeout=30)
    assert rec.value("bulk_recorder_broker_reconnects_total") == 0
    mq_proxy.restore()
    await wait_for(lambda: rec.value("bulk_recorder_broker_reconnects_total") == 1, timeout=30)
    await broker.publish(after, "credit_annotation")
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 2)
    await rec.shutdown()
    report, expected = report_for([(before, "credit_annotation"), (after, "credit_annotation")])
    audit = await audit_run(await db(), broker, report, faults=1, expected_dlq=expected)
    audit.assert_exact(dlq_surplus_allowed=False)
