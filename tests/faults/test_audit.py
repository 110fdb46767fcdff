"""The audit's "main queue empty" check is a real one: a message held unacked is not "empty".

A passive declare counts ready messages only. The audit (``settled_count``) first waits until
the broker reports no consumer on the queue; a quorum queue keeps counting a consumer, even a
cancelled one, while it holds unacked messages, so with no consumer left nothing is unacked and
the ready count is the whole queue (ready + unacked).
"""

from __future__ import annotations

import aio_pika
import pytest

from tests.conftest import Broker, wait_for
from tests.faults.audit import settled_count

pytestmark = [pytest.mark.rabbitmq]


async def test_settled_count_waits_until_no_consumer_holds_a_message(broker: Broker) -> None:
    queue = broker.topology.queue
    await broker.publish_many([(b"{}", "transaction")] * 20)
    holder = await aio_pika.connect(broker.url)
    try:
        channel = await holder.channel()
        await channel.set_qos(prefetch_count=10)
        held: list[aio_pika.abc.AbstractIncomingMessage] = []
        consumer = await channel.get_queue(queue)

        async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            held.append(message)  # never acked

        tag = await consumer.consume(hold)
        await wait_for(lambda: len(held) == 10)
        await consumer.cancel(tag)  # intake stopped, ten still unacked
        assert await broker.ready_count(queue) == 10  # what a bare ready count would report

        declared = await broker.channel.declare_queue(queue, passive=True)
        assert declared.declaration_result.consumer_count == 1  # the cancelled holder
        with pytest.raises(AssertionError, match="condition not met"):
            await settled_count(broker, queue, timeout=0.5)  # no answer while ten are held
    finally:
        await holder.close()  # the held ten go back
    assert await settled_count(broker, queue) == 20
