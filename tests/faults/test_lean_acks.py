"""The lean ack path respects a closing channel as aiormq's basic_ack does (issue 8, suspicion 1).

``ack_each`` writes Basic.Ack frames into the connection's write queue itself. When the broker
closes the channel (here: an ack of an unknown delivery tag, 406; in production e.g. the
consumer timeout), aiormq answers Close-Ok at once and marks the channel closing; it is closed
for ``is_closed`` only a few loop turns later. An ack written in between reaches the broker after
the Close-Ok, on a channel that no longer exists, and the broker closes the WHOLE connection
(504 CHANNEL_ERROR "expected 'channel.open'"), taking every other channel with it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiormq
import pytest

from consumer.delivery import AmqpDelivery, DeadLetterer, ack_each
from tests.conftest import Services, wait_for

pytestmark = [pytest.mark.rabbitmq]

MESSAGES = 10


@dataclass
class Consuming:
    connection: aiormq.abc.AbstractConnection
    channel: aiormq.abc.AbstractChannel
    queue: str
    deliveries: list[AmqpDelivery]

    async def close_channel_from_the_broker(self) -> None:
        """Ack a tag the channel never delivered: the broker closes it (406)."""
        await self.channel.basic_ack(MESSAGES + 1_000_000, wait=False)


@pytest.fixture
async def consuming(services: Services) -> AsyncIterator[Consuming]:
    """A channel holding MESSAGES unacked deliveries of a queue of its own."""
    queue = f"brtest.lean.{uuid.uuid4().hex[:10]}"
    connection = await aiormq.connect(services.rabbitmq_url)
    try:
        setup = await connection.channel()
        await setup.queue_declare(queue)
        await asyncio.gather(
            *(setup.basic_publish(b"x", routing_key=queue) for _ in range(MESSAGES))
        )
        channel = await connection.channel(publisher_confirms=False)
        await channel.basic_qos(prefetch_count=MESSAGES)
        delivered: list[aiormq.abc.DeliveredMessage] = []

        async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
            delivered.append(message)

        await channel.basic_consume(queue, on_message)
        await wait_for(lambda: len(delivered) == MESSAGES)
        unused = DeadLetterer.__new__(DeadLetterer)  # never called: nothing is dead-lettered
        deliveries = [AmqpDelivery(channel, m, unused) for m in delivered]
        yield Consuming(connection, channel, queue, deliveries)
    finally:
        await connection.close()
        async with aiormq.connect(services.rabbitmq_url) as cleanup:
            await (await cleanup.channel()).queue_delete(queue)


async def test_acks_after_the_broker_closed_the_channel_never_close_the_connection(
    consuming: Consuming,
) -> None:
    channel = consuming.channel
    await consuming.close_channel_from_the_broker()
    # A flush worker keeps acking, once each loop turn, until it sees the close. The broker
    # discards what reaches it between its Close and our Close-Ok, so one tag does for all.
    deadline = asyncio.get_running_loop().time() + 30
    while not channel.is_closed and asyncio.get_running_loop().time() < deadline:
        await ack_each([consuming.deliveries[0]])
        await asyncio.sleep(0)
    assert channel.is_closed, "the broker's Channel.Close never arrived"
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
        await channel.closing

    # The connection and its other channels live on.
    probe = await consuming.connection.channel()
    declared = await probe.queue_declare(consuming.queue, passive=True)
    assert declared.message_count is not None
    assert not consuming.connection.is_closed


async def test_acks_queued_before_the_close_are_dropped_when_the_writer_takes_them(
    consuming: Consuming,
) -> None:
    """A put can wait for room in the write queue while the Close arrives: the check that
    counts is the one made when the writer takes the frames."""
    from bulk_recorder.infra.aiormq_internals import AckFrames  # the frames the lean path queues

    queued = AckFrames(consuming.channel, [consuming.deliveries[0].tag])
    assert queued.payload
    await consuming.close_channel_from_the_broker()
    with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed):
        await consuming.channel.closing
    assert queued.payload == b""
