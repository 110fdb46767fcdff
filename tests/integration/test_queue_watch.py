"""The queue watch against the real broker: what its gauges read when the queue is deleted."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import pytest

from bulk_recorder.infra.metrics import Metrics
from consumer.queue_watch import QueueWatch
from consumer.topology import declare_topology
from tests.conftest import Broker, Services, wait_for

pytestmark = [pytest.mark.rabbitmq]


def _gauges(metrics: Metrics) -> tuple[float | None, float | None]:
    sample = metrics.registry.get_sample_value
    return sample("bulk_recorder_queue_messages"), sample("bulk_recorder_queue_consumers")


async def test_a_deleted_queue_reads_no_messages_and_no_consumers_not_the_last_count(
    services: Services, broker: Broker
) -> None:
    topo = broker.topology
    connection = await aio_pika.connect(services.rabbitmq_url)
    try:
        metrics = Metrics()
        watch = QueueWatch(metrics, topo.queue, lambda: connection)

        async def hold(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            return None  # held unacked: it dies with the queue

        await (await broker.channel.get_queue(topo.queue)).consume(hold)
        await broker.publish(b"{}", "transaction")
        assert await watch.look()
        assert _gauges(metrics)[1] == 1
        await broker.channel.queue_delete(topo.queue)
        assert await watch.look()
        assert _gauges(metrics) == (0, 0)  # before: (0 or 1, 1), the cancelled consumer kept
        # declared again (as publish does): the watch looks through a new channel
        await declare_topology(await connection.channel(), topo)
        await broker.publish(b"{}", "transaction")
        assert await watch.look()
        assert _gauges(metrics) == (1, 0)
    finally:
        await connection.close()


async def test_the_dlq_depth_counts_every_dead_letter_the_recorder_did_not_count_too(
    services: Services, broker: Broker
) -> None:
    """bulk_recorder_dlq_messages reads <queue>.dlq as the queue gauges read the queue: a
    message the broker dead-letters (here a reject without requeue, as past x-delivery-limit)
    is in it, though no recorder counted it; a deleted DLQ reads 0, never the last count."""
    topo = broker.topology
    connection = await aio_pika.connect(services.rabbitmq_url)
    try:
        metrics = Metrics()
        watch = QueueWatch(metrics, topo.queue, lambda: connection, dlq=topo.dead_letter_queue)
        dlq = "bulk_recorder_dlq_messages"
        assert await watch.look()
        assert metrics.registry.get_sample_value(dlq) == 0
        await broker.publish_many([(b"{}", "transaction")] * 3)
        queue = await broker.channel.get_queue(topo.queue)
        for _ in range(3):
            message = await queue.get(timeout=10)
            await message.reject(requeue=False)  # the broker dead-letters it to the DLX

        async def three_dead_letters() -> bool:
            return await broker.ready_count(topo.dead_letter_queue) == 3

        await wait_for(three_dead_letters, timeout=10)
        assert await watch.look()
        assert metrics.registry.get_sample_value(dlq) == 3
        assert _gauges(metrics) == (0, 0)  # the main queue's look is unchanged
        dead_lettered = "bulk_recorder_messages_dead_lettered_total"
        assert (
            sum(
                metrics.registry.get_sample_value(dead_lettered, {"reason": r}) or 0
                for r in ("decode", "type", "validation", "database")
            )
            == 0
        )  # the broker's dead letters: only the depth sees them
        await broker.channel.queue_delete(topo.dead_letter_queue)
        assert await watch.look()
        assert metrics.registry.get_sample_value(dlq) == 0
        assert _gauges(metrics) == (0, 0)
    finally:
        await connection.close()


@pytest.mark.exclusive(reason="times the watch's 5 s period within 3 s")
async def test_the_queue_is_looked_at_every_5_seconds(services: Services, broker: Broker) -> None:
    """docs/reference.md: the queue gauges come from a passive declare every 5 s (the recorder's
    watch keeps its default). The first look is at start (it sees the message published before);
    a message published just after it is seen at the second look, 5 s later."""
    topo = broker.topology
    connection = await aio_pika.connect(services.rabbitmq_url)
    stop = asyncio.Event()
    try:
        metrics = Metrics()
        watch = QueueWatch(metrics, topo.queue, lambda: connection)
        await broker.publish(b"{}", "transaction")
        started = time.monotonic()
        task = asyncio.create_task(watch.run(stop))
        await wait_for(lambda: _gauges(metrics)[0] == 1, timeout=10, interval=0.01)  # the first
        await broker.publish(b"{}", "transaction")
        # past 8 s the period is already wrong: not waited for (a 15 s one would hold it 15 s)
        late = started + 8.0 - time.monotonic()
        await wait_for(lambda: _gauges(metrics)[0] == 2, timeout=late, interval=0.01)
        seen = time.monotonic() - started
        stop.set()
        await asyncio.wait_for(task, 10)
    finally:
        stop.set()
        await connection.close()
    assert 5.0 <= seen < 8.0, seen
