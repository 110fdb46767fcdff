"""Declaring and deleting the broker topology against the real RabbitMQ."""

from __future__ import annotations

import asyncio
import sys
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


@pytest.mark.postgres
async def test_relay_with_other_queue_arguments_exits_3_naming_the_queue_and_the_mismatch(
    make_settings, broker, database_url
) -> None:
    """Issue 18 item 6: the relay used to log "not reachable" and retry for ever (readiness
    "broker down"); like ``consume``, a queue with other arguments is exit 3 and one line."""
    from bulk_recorder.infra.migrate import migrate
    from tests.conftest import settings_env

    await migrate(database_url)
    # the broker fixture declared the queue with delivery limit 5; ask for 7
    settings = make_settings(rabbitmq_delivery_limit=7)
    env = settings_env(settings, METRICS_PORT="0")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "consumer.cli",
        "relay",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:  # never leave a looping relay behind if the test fails
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = err.decode()
    assert proc.returncode == 3, text
    assert "not reachable" not in text, text
    [line] = [line for line in text.splitlines() if "PRECONDITION_FAILED" in line]
    assert settings.rabbitmq_queue in line
    assert "RABBITMQ_DELIVERY_LIMIT" in line
