"""Declaring and deleting the broker topology against the real RabbitMQ."""

from __future__ import annotations

import uuid

import aio_pika
import aiormq
import pytest

from consumer.topology import Topology, declare_topology, delete_topology

pytestmark = [pytest.mark.rabbitmq]


async def exists(connection: aio_pika.abc.AbstractConnection, kind: str, name: str) -> bool:
    channel = await connection.channel()
    try:
        if kind == "queue":
            await channel.declare_queue(name, passive=True)
        else:
            await channel.get_exchange(name, ensure=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    await channel.close()
    return True


async def test_delete_topology_removes_all_four_even_with_a_backlog_and_a_missing_one(
    services,
) -> None:
    suffix = uuid.uuid4().hex[:10]
    topo = Topology(exchange=f"brtest.{suffix}", queue=f"brtest.{suffix}.records", delivery_limit=5)
    connection = await aio_pika.connect(services.rabbitmq_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await declare_topology(channel, topo)
        await declare_topology(channel, topo)  # idempotent
        exchange = await channel.get_exchange(topo.exchange)
        for n in range(2000):
            await exchange.publish(aio_pika.Message(b"{}", type="transaction"), routing_key=str(n))
        assert (
            await channel.declare_queue(topo.queue, passive=True)
        ).declaration_result.message_count == 2000
        await channel.queue_delete(topo.dead_letter_queue)  # already gone: the rest still go

        left = await delete_topology(connection, topo)

        assert left == []
        for kind, name in (
            ("queue", topo.queue),
            ("queue", topo.dead_letter_queue),
            ("exchange", topo.exchange),
            ("exchange", topo.dead_letter_exchange),
        ):
            assert not await exists(connection, kind, name), f"{kind} {name} still there"
    finally:
        await delete_topology(connection, topo)
        await connection.close()
