"""A publisher nack is an outage, not a refusal of the row (issue 11, item 4, relay side).

RabbitMQ nacks a publish when a queue it is routed to cannot take it: a quorum queue that lost
its leader or its majority, or a queue at its length limit with ``x-overflow: reject-publish``.
None of that is the row's fault: the row must not be counted as refused (nor parked after
``max_attempts``), and the relay must replace its connection and channel and back off, as for a
lost confirm. Made for real here: a second queue bound to the exchange with ``x-max-length 0``
and ``reject-publish`` makes the broker nack every publish until it is deleted.
"""

from __future__ import annotations

import json
import logging

import pytest

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer.outbox import enqueue, notify
from bulk_recorder.producer.relay import RelayConfig
from consumer.tools.generator import Generator
from tests.conftest import Broker, wait_for
from tests.integration.producer_support import running_relay

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

ROWS = 30


async def test_a_nacked_publish_leaves_the_row_untouched_and_replaces_the_channel(
    make_settings, database_url, db, broker: Broker, caplog
) -> None:
    settings = make_settings()
    await migrate(database_url)
    conn = await db()
    full = await broker.channel.declare_queue(
        f"{broker.topology.queue}.full",
        arguments={"x-max-length": 0, "x-overflow": "reject-publish"},
    )
    await full.bind(broker.topology.exchange, routing_key="#")
    caplog.set_level(logging.INFO, logger="bulk_recorder")
    config = RelayConfig(batch_size=10, lanes=2, poll_interval_s=0.2, max_attempts=2)
    try:
        async with running_relay(settings, config) as relay:
            await wait_for(lambda: relay.relay.ready()[0], timeout=30)
            gen = Generator.create(seed=1101)
            ids = set()
            async with conn.transaction():
                for _ in range(ROWS):
                    record = gen.credit_annotation()
                    await enqueue(
                        conn, "credit_annotation", record["id"], json.dumps(record).encode()
                    )
                    ids.add(record["id"])
                await notify(conn)

            def failures() -> float:
                return sum(
                    relay.value("bulk_recorder_outbox_publish_failures_total", reason=r)
                    for r in ("refused", "nacked", "lost")
                )

            # every row nacked at least twice: on the old code that parked every one of them
            await wait_for(lambda: failures() >= 2 * ROWS, timeout=60)
            rows = await conn.fetch("SELECT attempts, parked_at FROM outbox")
            assert len(rows) == ROWS, "a nacked row was taken for sent"
            assert [r["attempts"] for r in rows] == [0] * ROWS, "a nack counted as a refusal"
            assert all(r["parked_at"] is None for r in rows)
            assert relay.value("bulk_recorder_outbox_publish_failures_total", reason="nacked") > 0
            assert relay.value("bulk_recorder_outbox_publish_failures_total", reason="refused") == 0
            assert any("replacing" in r.getMessage() for r in caplog.records), (
                "the channel was not replaced after a nack"
            )

            await full.delete(if_unused=False, if_empty=False)

            async def drained() -> bool:
                return int(await conn.fetchval("SELECT count(*) FROM outbox")) == 0

            await wait_for(drained, timeout=60)
            assert relay.relay.ready()[0]
    finally:
        await broker.channel.queue_delete(f"{broker.topology.queue}.full")
    queued = {json.loads(m.body)["id"] for m in await broker.drain(broker.topology.queue)}
    assert queued == ids
