"""The recorder's deliveries run in the channel's reader, not in a task each (deliver_inline):
in order, on one task, and a handler that raises loses no later delivery and no channel."""

from __future__ import annotations

import asyncio
import uuid

import aiormq
import pytest

from bulk_recorder.infra.aiormq_internals import deliver_inline
from tests.conftest import Services, wait_for

pytestmark = [pytest.mark.rabbitmq]

COUNT = 50


async def test_inline_deliveries_arrive_in_order_on_the_reader_and_survive_a_raise(
    services: Services,
) -> None:
    queue = f"brtest.inline.{uuid.uuid4().hex[:10]}"
    bodies: list[bytes] = []
    tasks: set[asyncio.Task[object] | None] = set()

    def handle(message: aiormq.abc.DeliveredMessage) -> None:
        bodies.append(message.body)
        tasks.add(asyncio.current_task())
        if message.body == b"7":
            raise RuntimeError("a handler bug")  # logged; the reader goes on

    async with aiormq.connect(services.rabbitmq_url) as connection:
        channel = await connection.channel()
        await channel.queue_declare(queue, durable=False, auto_delete=False)
        try:
            ok = await channel.basic_consume(queue, deliver_inline(channel, handle), no_ack=True)
            for i in range(COUNT):
                await channel.basic_publish(str(i).encode(), routing_key=queue)
            await wait_for(lambda: len(bodies) == COUNT)
            assert bodies == [str(i).encode() for i in range(COUNT)]
            assert len(tasks) == 1  # every delivery ran in the same task: the channel's reader
            assert not channel.is_closed
            assert ok.consumer_tag is not None
            await channel.basic_cancel(ok.consumer_tag)
        finally:
            await channel.queue_delete(queue)


async def test_another_consumer_of_the_channel_keeps_aiormqs_own_path(services: Services) -> None:
    queue = f"brtest.inline.{uuid.uuid4().hex[:10]}"
    inline: list[bytes] = []
    own: list[bytes] = []
    own_tasks: set[asyncio.Task[object] | None] = set()

    async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
        own.append(message.body)
        own_tasks.add(asyncio.current_task())

    async with aiormq.connect(services.rabbitmq_url) as connection:
        channel = await connection.channel()
        await channel.queue_declare(queue, durable=False, auto_delete=False)
        try:
            deliver_inline(channel, lambda message: inline.append(message.body))
            await channel.basic_consume(queue, on_message, no_ack=True)
            for i in range(5):
                await channel.basic_publish(str(i).encode(), routing_key=queue)
            await wait_for(lambda: len(own) == 5)
            assert inline == []
            assert len(own_tasks) == 5  # aiormq's task per delivery
        finally:
            await channel.queue_delete(queue)
