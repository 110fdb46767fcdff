"""An outage never spends a message's delivery budget.

On quorum queues (RabbitMQ 3.10) every return of a delivery (a nack with requeue, a closed
channel) counts toward ``x-delivery-limit``, and past it the broker dead-letters the message
itself. A database that accepts connections but refuses writes (a read-only primary, SQLSTATE
25006) used to loop resume, fail, release until good data was in the DLQ. Here a trigger refuses
the writes for real; the delivery limit is 3 and deliveries are released after 1 s.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from collections.abc import AsyncIterator

import asyncpg
import pytest

from bulk_recorder.infra.migrate import migrate
from consumer.tools.generator import Generator
from tests.conftest import Broker, RunningRecorder, Services, wait_for
from tests.faults.audit import audit_run, check_counters, report_for, row_counts

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

DELIVERY_LIMIT = 3
RELEASE_AFTER_S = 1.0

# Every refusal bumps a sequence first: nextval is not rolled back with the failed statement,
# so the test can count the writes the database refused.
_READ_ONLY = """
CREATE SEQUENCE refusals;
CREATE FUNCTION refuse_writes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_NARGS > 0 THEN  -- a row trigger that refuses only the rows of one creditor
        IF NEW.creditor <> TG_ARGV[0] THEN
            RETURN NEW;
        END IF;
    END IF;
    PERFORM nextval('refusals');
    RAISE EXCEPTION 'cannot execute INSERT in a read-only transaction' USING ERRCODE = '25006';
END $$;
"""


@pytest.fixture
async def limited_broker(services: Services, topology) -> AsyncIterator[Broker]:
    """The test's queues, declared with delivery limit 3 (as the recorder will declare them)."""
    b = Broker(services.rabbitmq_url, dataclasses.replace(topology, delivery_limit=DELIVERY_LIMIT))
    await b.open()
    yield b
    await b.close()


def _settings(make_settings, **extra):
    return make_settings(
        rabbitmq_delivery_limit=DELIVERY_LIMIT,
        bulk_recorder_release_after_s=RELEASE_AFTER_S,
        **extra,
    )


async def _refusals(conn: asyncpg.Connection) -> int:
    value = await conn.fetchval(
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM refusals"
    )
    return int(value)


def _dead(rec: RunningRecorder) -> float:
    return sum(
        rec.value("bulk_recorder_messages_dead_lettered_total", reason=r)
        for r in ("decode", "type", "validation", "database")
    )


async def test_a_read_only_database_for_several_release_cycles_dead_letters_nothing(
    make_settings, start_recorder, limited_broker, db, database_url
) -> None:
    broker = limited_broker
    topo = broker.topology
    await migrate(database_url)
    conn = await db()
    await conn.execute(_READ_ONLY)
    for table in ("transactions", "credit_annotations"):
        await conn.execute(
            f"CREATE TRIGGER read_only BEFORE INSERT ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION refuse_writes()"
        )
    rec = await start_recorder(_settings(make_settings, bulk_recorder_size=10))
    gen = Generator.create(seed=84)
    messages = [
        (json.dumps(gen.record(t)).encode(), t)
        for t in ("transaction", "credit_annotation")
        for _ in range(15)
    ]
    await broker.publish_many(messages)

    # The outage lasts five release periods (the fault's length, not a wait for an event); before
    # the fix a valid message was in the DLQ after three.
    loop = asyncio.get_running_loop()
    outage_ends = loop.time() + 5 * RELEASE_AFTER_S
    await wait_for(lambda: rec.value("bulk_recorder_messages_released_total") >= len(messages))
    refused = await _refusals(conn)
    received = rec.value("bulk_recorder_messages_received_total")

    async def outage_over_or_dead_lettered() -> bool:
        if await broker.ready_count(topo.dead_letter_queue) > 0:
            return True
        return loop.time() >= outage_ends and await _refusals(conn) >= refused + 2

    await wait_for(outage_over_or_dead_lettered, timeout=60)
    dead_lettered = await broker.ready_count(topo.dead_letter_queue)
    assert dead_lettered == 0, f"{dead_lettered} valid messages dead-lettered by the outage"
    assert rec.value("bulk_recorder_paused") == 1
    assert not rec.recorder.ready()[0]
    assert await row_counts(conn) == 0
    # the resume probe is a real write: it fails too, so intake stays paused (a `SELECT 1`
    # probe passes, and the recorder goes round resume, fail, release)
    assert rec.value("bulk_recorder_messages_received_total") == received

    for table in ("transactions", "credit_annotations"):
        await conn.execute(f"DROP TRIGGER read_only ON {table}")
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == len(messages))
    assert rec.value("bulk_recorder_paused") == 0
    await rec.shutdown()
    assert _dead(rec) == 0
    assert rec.value("bulk_recorder_messages_rejected_total") == 0
    report, _ = report_for(messages)
    audit = await audit_run(conn, broker, report, faults=1, expected_dlq=Counter())
    audit.assert_exact(dlq_surplus_allowed=False)
    check_counters(rec, report, audit)


async def test_writes_refused_while_the_probe_passes_spend_no_delivery(
    make_settings, start_recorder, limited_broker, db, database_url
) -> None:
    """The database refuses only these rows (a transient SQLSTATE), so every probe passes and
    the recorder goes round resume, fail, release: far more rounds than the delivery limit,
    and still nothing is dead-lettered."""
    broker = limited_broker
    topo = broker.topology
    await migrate(database_url)
    conn = await db()
    await conn.execute(_READ_ONLY)
    await conn.execute(
        "CREATE TRIGGER read_only BEFORE INSERT ON credit_annotations "
        "FOR EACH ROW EXECUTE FUNCTION refuse_writes('held back')"
    )
    rec = await start_recorder(_settings(make_settings, bulk_recorder_size=5))
    gen = Generator.create(seed=85)
    records = [gen.credit_annotation() for _ in range(5)]
    for record in records:
        record["creditor"] = "held back"
    messages = [(json.dumps(r).encode(), "credit_annotation") for r in records]
    await broker.publish_many(messages)

    async def rounds_or_dead_lettered() -> bool:
        if await broker.ready_count(topo.dead_letter_queue) > 0:
            return True
        released = rec.value("bulk_recorder_messages_released_total")
        return bool(released >= len(messages) * (DELIVERY_LIMIT + 2))

    await wait_for(rounds_or_dead_lettered, timeout=90)
    dead_lettered = await broker.ready_count(topo.dead_letter_queue)
    assert dead_lettered == 0, f"{dead_lettered} valid messages dead-lettered by the outage"

    await conn.execute("DROP TRIGGER read_only ON credit_annotations")
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == len(messages))
    await rec.shutdown()
    assert _dead(rec) == 0
    report, _ = report_for(messages)
    audit = await audit_run(conn, broker, report, faults=1, expected_dlq=Counter())
    audit.assert_exact(dlq_surplus_allowed=False)
    check_counters(rec, report, audit)
