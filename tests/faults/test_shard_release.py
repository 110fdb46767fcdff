"""A release during a database outage puts each delivery's copy back on the shard it came from.

On the local broker at RABBITMQ_QUEUE_SHARDS=1, with a leftover shard ``<queue>.shard-2``
(declared here, as a deployment that had two shards leaves it): the records wait on both queues,
the database is cut, the recorder releases what it holds (a copy republished through the
default exchange, then the original acked) and pauses intake. Each copy must be back on its own
queue: a copy of a leftover's delivery sent to RABBITMQ_QUEUE would move records between shards
(and, past N, onto a routed one: harmless there, but on a subset recorder's shard, to a queue
it does not consume). Then the database is back and everything is recorded once.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aio_pika
import pytest

from bulk_recorder.infra.migrate import migrate
from consumer.tools.generator import Generator
from consumer.topology import Topology
from tests.conftest import Broker, wait_for
from tests.faults.audit import row_counts
from tests.faults.conftest import via_proxy

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.slow]


@pytest.fixture
async def leftover(broker: Broker, topology: Topology) -> AsyncIterator[str]:
    two = Topology(topology.exchange, topology.queue, topology.delivery_limit, shards=2)
    name = two.shard_queue(2)
    await broker.channel.declare_queue(name, durable=True, arguments=two.queue_arguments(2))
    yield name
    await broker.channel.queue_delete(name)


async def _publish(broker: Broker, queue: str, bodies: list[bytes]) -> None:
    for body in bodies:
        await broker.channel.default_exchange.publish(
            aio_pika.Message(
                body, type="transaction", delivery_mode=aio_pika.DeliveryMode.PERSISTENT
            ),
            routing_key=queue,
        )


async def test_a_released_delivery_goes_back_to_the_shard_it_came_from(
    make_settings, start_recorder, broker, db, database_url, pg_proxy, topology, leftover
) -> None:
    await migrate(database_url)
    settings = make_settings(
        database_url=via_proxy(database_url, pg_proxy),
        bulk_recorder_release_after_s=1.0,
        bulk_recorder_size=20,
    )
    gen = Generator.create(seed=4103)
    on_one = [json.dumps(gen.transaction()).encode() for _ in range(40)]
    on_two = [json.dumps(gen.transaction()).encode() for _ in range(60)]
    rec = await start_recorder(settings)
    pg_proxy.cut()
    await _publish(broker, topology.queue, on_one)
    await _publish(broker, leftover, on_two)
    await wait_for(lambda: rec.value("bulk_recorder_messages_released_total") > 0, timeout=60)

    async def back_where_they_were() -> bool:
        on_queue = await broker.ready_count(topology.queue)
        on_leftover = await broker.ready_count(leftover)
        return (on_queue, on_leftover) == (len(on_one), len(on_two))

    # intake paused: every copy waits on its own queue, nothing moved to the other
    await wait_for(back_where_they_were, timeout=60)
    assert rec.value("bulk_recorder_messages_acked_total") == 0

    pg_proxy.restore()
    total = len(on_one) + len(on_two)
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == total, timeout=60)
    await rec.shutdown()
    assert await row_counts(await db()) == total
    assert await broker.ready_count(topology.queue) == 0
    assert await broker.ready_count(leftover) == 0
