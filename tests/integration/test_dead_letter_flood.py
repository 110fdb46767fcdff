"""The DLQ tests' flooder counts only what the broker took: its count is what the flood test
waits for in the DLQ, so a message it counts and the broker drops fails that test for nothing.
The broker is stalled for real (SIGSTOP on a node of the test's own) while the flood runs and
as it stops, as a starved broker is on a busy machine."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aio_pika
import pytest

from tests.conftest import wait_for
from tests.integration.dead_letter_flood import flood_id
from tests.integration.test_dlq_arrivals import flooding_at
from tests.rigs.rabbitmq_node import RabbitNode, available

pytestmark = pytest.mark.skipif(not available(), reason="rabbitmq-server is not installed")

EXCHANGE = "flood-check"
QUEUE = "flood-check"
STALL_S = 4.0  # the broker reads nothing; the flooders' frames pile up behind it


@pytest.fixture
def flood_node(tmp_path: Path) -> Iterator[RabbitNode]:
    with RabbitNode(f"brflood{uuid.uuid4().hex[:8]}", tmp_path / "rabbit") as node:
        yield node


@pytest.fixture
async def flood_queue(
    flood_node: RabbitNode,
) -> AsyncIterator[tuple[aio_pika.abc.AbstractChannel, aio_pika.abc.AbstractQueue]]:
    connection = await aio_pika.connect(flood_node.url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(EXCHANGE, aio_pika.ExchangeType.FANOUT)
        queue = await channel.declare_queue(
            QUEUE, durable=True, arguments={"x-queue-type": "quorum"}
        )
        await queue.bind(exchange)
        yield channel, queue


def stall(node: RabbitNode, sig: signal.Signals) -> None:
    assert node.proc is not None
    os.killpg(node.proc.pid, sig)


async def test_a_stalled_broker_loses_none_of_what_the_flooders_counted(
    flood_node: RabbitNode,
    flood_queue: tuple[aio_pika.abc.AbstractChannel, aio_pika.abc.AbstractQueue],
) -> None:
    channel, queue = flood_queue
    async with flooding_at(flood_node.url, EXCHANGE) as flooders:
        await flooders.go()
        await asyncio.sleep(1)  # flowing before the stall
        stall(flood_node, signal.SIGSTOP)
        try:
            await asyncio.sleep(STALL_S)
            flooders.stop()  # told to stop while the broker still reads nothing
            await asyncio.sleep(1)
        finally:
            stall(flood_node, signal.SIGCONT)
        counts = await flooders.counted()
        assert all(process.returncode == 0 for process in flooders.processes)
    assert all(count > 0 for count in counts)

    async def every_counted_one_arrived() -> bool:
        declared = await channel.declare_queue(QUEUE, passive=True)
        arrived = int(declared.declaration_result.message_count or 0)
        assert arrived <= sum(counts), f"{arrived} arrived, {sum(counts)} counted"
        return arrived == sum(counts)

    await wait_for(every_counted_one_arrived, timeout=60)
    got: list[str] = []
    while (message := await queue.get(no_ack=True, fail=False)) is not None:
        got.append(message.message_id or "")
    for k, count in enumerate(counts):
        assert [i for i in got if i.startswith(f"flood-{k}-")] == [
            flood_id(str(k), n) for n in range(count)
        ]
