"""The load generator's batched publishes on a real broker: every message confirmed and in the
queue once, and a nack reported, never hidden.

``infra.aiormq_internals.write_publishes`` writes many publishes at once and leaves their
confirms to aiormq's own handling; these tests check it against RabbitMQ itself: the count and
order of what arrives, and a real nack (a queue with ``x-overflow: reject-publish`` nacks what
exceeds its length).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import aiormq
import pytest

from bulk_recorder.infra.aiormq_internals import write_publishes
from consumer.tools.loadgen import LoadSpec, publish_load
from tests.conftest import Services, unique_name

pytestmark = [pytest.mark.rabbitmq]


@pytest.fixture
async def channel(services: Services) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    connection = await aio_pika.connect(services.rabbitmq_url)
    try:
        yield await connection.channel()
    finally:
        await connection.close()


async def _queue(
    channel: aio_pika.abc.AbstractChannel, **arguments: Any
) -> tuple[aio_pika.abc.AbstractExchange, aio_pika.abc.AbstractQueue]:
    exchange = await channel.declare_exchange(unique_name("pbx"), "topic", auto_delete=True)
    queue = await channel.declare_queue(unique_name("pbq"), arguments=dict(arguments))
    await queue.bind(exchange, "#")
    return exchange, queue


async def test_a_batch_is_confirmed_and_arrives_once_in_order(
    services: Services, channel: aio_pika.abc.AbstractChannel
) -> None:
    exchange, queue = await _queue(channel)
    try:
        connection = await aio_pika.connect(services.rabbitmq_url)
        try:
            publisher = await connection.channel(publisher_confirms=True)
            raw = await publisher.get_underlay_channel()
            sent = []
            for round_ in range(3):  # the delivery tags go on across batches
                batch = [
                    (
                        exchange.name,
                        "k",
                        aiormq.spec.Basic.Properties(message_id=f"{round_}-{n}"),
                        json.dumps({"n": n}).encode(),
                    )
                    for n in range(250)
                ]
                sent += [props.message_id for _, _, props, _ in batch]
                confirmations = [await future for future in await write_publishes(raw, batch)]
                assert all(isinstance(c, aiormq.spec.Basic.Ack) for c in confirmations)
        finally:
            await connection.close()
        received = []
        async with queue.iterator(no_ack=True) as messages:
            async for message in messages:
                received.append(message.message_id)
                if len(received) == len(sent):
                    break
        assert received == sent
        declared = await channel.declare_queue(queue.name, passive=True)
        assert declared.declaration_result.message_count == 0
    finally:
        await queue.delete(if_unused=False, if_empty=False)


async def test_nacked_publishes_fail_the_load(
    services: Services, channel: aio_pika.abc.AbstractChannel
) -> None:
    exchange, queue = await _queue(channel, **{"x-max-length": 5, "x-overflow": "reject-publish"})
    try:
        with pytest.raises(RuntimeError, match="publishes failed") as failed:
            await publish_load(
                services.rabbitmq_url, exchange.name, LoadSpec("transaction", 40, in_flight=1000)
            )
        assert "DeliveryError" in str(failed.value)
        declared = await channel.declare_queue(queue.name, passive=True)
        assert declared.declaration_result.message_count == 5
    finally:
        await queue.delete(if_unused=False, if_empty=False)


async def test_bodies_of_a_frame_and_more_are_confirmed_and_arrive_byte_for_byte(
    services: Services, channel: aio_pika.abc.AbstractChannel
) -> None:
    """A body as large as a frame or larger goes out in frames of ``frame_max - 8`` bytes, as
    aiormq's basic_publish writes it, between bodies of one frame, in one batch."""
    exchange, queue = await _queue(channel)
    try:
        connection = await aio_pika.connect(services.rabbitmq_url)
        try:
            publisher = await connection.channel(publisher_confirms=True)
            raw = await publisher.get_underlay_channel()
            assert isinstance(raw, aiormq.Channel)
            frame = raw.max_content_size  # frame_max less a content frame's 8 bytes
            assert raw.connection.connection_tune.frame_max == frame + 8
            sizes = [10, frame - 1, frame, frame + 1, 3 * frame + 5, 0, 1_048_576, 7]
            bodies = [bytes([n % 251]) * size for n, size in enumerate(sizes)]
            batch = [
                (exchange.name, "k", aiormq.spec.Basic.Properties(message_id=str(n)), body)
                for n, body in enumerate(bodies)
            ]
            confirmations = [await future for future in await write_publishes(raw, batch)]
            assert all(isinstance(c, aiormq.spec.Basic.Ack) for c in confirmations)
            # The channel goes on: the next batch is matched with its own confirms.
            [after] = await write_publishes(
                raw, [(exchange.name, "k", aiormq.spec.Basic.Properties(message_id="after"), b"z")]
            )
            assert isinstance(await after, aiormq.spec.Basic.Ack)
        finally:
            await connection.close()
        received = []
        async with queue.iterator(no_ack=True) as messages:
            async for message in messages:
                received.append((message.message_id, message.body))
                if len(received) == len(bodies) + 1:
                    break
        assert received == [(str(n), body) for n, body in enumerate(bodies)] + [("after", b"z")]
    finally:
        await queue.delete(if_unused=False, if_empty=False)
