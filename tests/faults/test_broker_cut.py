"""RabbitMQ connections cut while records flow: reconnect, drop the dead channel's deliveries."""

from __future__ import annotations

import asyncio
import random

import pytest

from bulk_recorder.infra.migrate import migrate
from consumer.tools.loadgen import LoadSpec, publish_load
from tests.conftest import wait_for
from tests.faults.audit import (
    audit_run,
    check_counters,
    row_counts,
    wait_for_rows,
    wait_until_consumed,
    wait_until_settled,
)
from tests.faults.conftest import long_run, scale, via_proxy

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.slow]


@long_run
async def test_broker_cut_repeatedly_during_a_stream(
    make_settings, start_recorder, broker, db, services, database_url, mq_proxy
) -> None:
    settings = make_settings(rabbitmq_url=via_proxy(services.rabbitmq_url, mq_proxy))
    await migrate(database_url)
    conn = await db()
    cuts = scale(3, 10)
    spec = LoadSpec("mixed", scale(20_000, 100_000), duplicates=0.05, invalid=0.01, seed=31)
    rng = random.Random(31)
    rec = await start_recorder(settings)
    publisher = asyncio.create_task(
        publish_load(services.rabbitmq_url, settings.rabbitmq_exchange, spec)
    )
    step = spec.count // (cuts + 2)
    for n in range(cuts):
        await wait_for_rows(conn, await row_counts(conn) + rng.randint(step // 2, step))
        mq_proxy.cut()
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        mq_proxy.restore()
        reconnects = n + 1
        await wait_for(
            lambda: rec.value("bulk_recorder_broker_reconnects_total") == reconnects  # noqa: B023
        )
    report = await publisher
    await wait_until_settled(db, broker, report)
    await wait_until_consumed(broker.topology.queue)
    await rec.shutdown()
    audit = await audit_run(conn, broker, report, faults=mq_proxy.faults)
    audit.assert_exact(dlq_surplus_allowed=True)
    check_counters(rec, report, audit, broker_faults=True)
    assert rec.value("bulk_recorder_messages_rejected_total") == 0
