"""Reading the DLQ in tests without changing it."""

from __future__ import annotations

from functools import partial

import aio_pika

from consumer.tools.dlq import reason_of
from tests.conftest import Broker, wait_for


async def ready(channel: aio_pika.abc.AbstractChannel, queue: str, at_least: int) -> bool:
    declared = await channel.declare_queue(queue, passive=True)
    return int(declared.declaration_result.message_count or 0) >= at_least


async def dlq_contents(broker: Broker, queue: str) -> list[tuple[bytes, str | None, str]]:
    """Body, message id and reason of every message in the DLQ, in order; left in place. Each
    is nacked back in the order read, one at a time, waiting until the queue shows it back: a
    quorum queue returns a closed channel's unacked messages, or a burst of nacks, in an order
    of its own."""
    connection = await aio_pika.connect(broker.url)
    try:
        channel = await connection.channel()
        q = await channel.declare_queue(queue, passive=True)
        got = []
        while (message := await q.get(no_ack=False, fail=False)) is not None:
            got.append(message)
        for n, message in enumerate(got, start=1):
            await message.nack(requeue=True)
            await wait_for(partial(ready, channel, queue, n), interval=0.002)
    finally:
        await connection.close()
    return [(m.body, m.message_id, reason_of(m.headers)) for m in got]
