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
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import aio_pika
import aiormq
import pytest

from bulk_recorder.infra.aiormq_internals import close_connection
from bulk_recorder.infra.broker import BrokerNodes
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.infra.stop_budget import StopBudget
from consumer import last_acks
from consumer.consuming import Consuming as RecorderConsuming
from consumer.delivery import AmqpDelivery, DeadLetterer, ack_each
from consumer.topology import Topology
from tests.conftest import Services, leader_suspended, leader_suspended_for, wait_for

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


async def test_acks_written_just_before_our_own_close_still_reach_the_broker(
    services: Services,
) -> None:
    """At the end of an orderly stop the last acks sit in the write queue when the recorder closes
    its connection. They must be written before the close, not dropped as if the broker had
    closed the channel: a dropped ack after a release leaves the message twice in the queue."""
    queue = f"brtest.lean.{uuid.uuid4().hex[:10]}"
    async with aiormq.connect(services.rabbitmq_url) as setup_connection:
        setup = await setup_connection.channel()
        await setup.queue_declare(queue)
        await asyncio.gather(
            *(setup.basic_publish(b"x", routing_key=queue) for _ in range(MESSAGES))
        )
    connection = await aio_pika.connect(services.rabbitmq_url)
    try:
        channel = await (await connection.channel(publisher_confirms=False)).get_underlay_channel()
        await channel.basic_qos(prefetch_count=MESSAGES)
        delivered: list[aiormq.abc.DeliveredMessage] = []

        async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
            delivered.append(message)

        await channel.basic_consume(queue, on_message)
        await wait_for(lambda: len(delivered) == MESSAGES)
        unused = DeadLetterer.__new__(DeadLetterer)  # never called: nothing is dead-lettered
        # A large publish on another channel keeps the writer busy, as a full socket does.
        other = await (await connection.channel(publisher_confirms=False)).get_underlay_channel()
        busy = asyncio.ensure_future(
            other.basic_publish(b"y" * 32_000_000, routing_key=f"{queue}.nowhere")
        )
        await asyncio.sleep(0)  # the big frame is queued first
        assert await ack_each([AmqpDelivery(channel, m, unused) for m in delivered]) == MESSAGES
        await close_connection(connection, 10)
        await asyncio.gather(busy, return_exceptions=True)
    finally:
        await connection.close()
    left = await _back_in_the_queue(services.rabbitmq_url, queue)
    assert left == 0, f"{left} of {MESSAGES} acked deliveries went back to the queue"


# Rounds of the close below. Whether a queue falls behind the acks is a race: a close that gave
# it no time lost 217 of 250 acks in one run and none in another (its mutant survived one whole
# mutants run in two, and 2 of 6 runs by hand). Each round is a new chance to catch it.
CLOSE_ROUNDS = 5


@pytest.mark.parametrize("round_", range(CLOSE_ROUNDS))
async def test_the_last_acks_before_our_own_close_are_applied_by_a_quorum_queue(
    services: Services, round_: int
) -> None:
    """On a quorum queue the broker's channel holds back settles once 32 of them are unapplied
    and drops what it holds when the channel ends, so acks written just before the close, as an
    orderly stop writes a batch's or a release's, can be lost even though they reached the
    broker. The recorder's close must leave the broker the time to apply them: every acked
    message is gone from the queue, in every round."""
    async with _stopped_holding(services) as (queue, consuming, ack_all):
        assert await ack_all() == HELD
        await consuming.close(StopBudget("consume", (("close", 30.0),)).deadline())
    left = await _back_in_the_queue(services.rabbitmq_url, queue)
    assert left == 0, f"{left} of {HELD} acked deliveries went back to the queue"


async def test_acks_the_queue_applies_late_are_waited_for(
    services: Services,
) -> None:
    """The queue's leader too slow to apply the last acks: its Raft server suspended while they
    are written, and resumed by the node LATE_S after the close starts. The broker's channel
    sends the first settles to the suspended leader and holds back the rest; a close after a
    fixed 0.2 s (the linger it had) dropped what was held back, and those messages came back to
    the queue (a loaded machine's broker did the same: 217 of 250 in a make mutants run). The
    close waits for the queue to apply them, LAST_ACKS_WAIT_S at most within its stop budget:
    until the stop's cancelled consumer, which a quorum queue keeps while it holds unacked
    deliveries, is gone from the queue's consumer count."""
    async with contextlib.AsyncExitStack() as stack:
        queue, consuming, ack_all = await stack.enter_async_context(_stopped_holding(services))
        start = await stack.enter_async_context(
            leader_suspended_for(services.rabbitmq_url, queue, LATE_S)
        )
        assert await ack_all() == HELD
        budget = StopBudget("consume", (("close", 30.0),)).deadline()
        await start()
        await consuming.close(budget)
    left = await _back_in_the_queue(services.rabbitmq_url, queue)
    assert left == 0, f"{left} of {HELD} acked deliveries went back to the queue"


async def test_the_close_waits_for_the_last_acks_no_longer_than_its_bound(
    services: Services, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Past LAST_ACKS_WAIT_S (here 1 s) the close goes on without the sign, well inside its 30 s
    budget: a leader that stays suspended holds up the stop that long, not for its whole budget.
    The cost is the one docs/guarantees.md states: the acks the leader had not applied come
    back to the queue, for a redelivery that ON CONFLICT makes harmless."""
    monkeypatch.setattr(last_acks, "LAST_ACKS_WAIT_S", 1.0)
    async with contextlib.AsyncExitStack() as stack:
        queue, consuming, ack_all = await stack.enter_async_context(_stopped_holding(services))
        await stack.enter_async_context(leader_suspended(queue))  # until the close has ended
        assert await ack_all() == HELD
        budget = StopBudget("consume", (("close", 30.0),)).deadline()
        with caplog.at_level(logging.WARNING, logger="consumer.last_acks"):
            async with asyncio.timeout(15):  # the budget's 30 s would end it too, later
                await consuming.close(budget)
    assert f"{queue} still counted 1 consumers 1 s after our cancel and acks" in caplog.text
    left = await _back_in_the_queue(services.rabbitmq_url, queue)
    assert 0 < left <= HELD, left


def _ignore(message: aiormq.abc.DeliveredMessage) -> None:
    return None


async def _back_in_the_queue(url: str, queue: str) -> int:
    """Messages in ``queue`` once it has handled our channel's end (no consumer left): the acked
    deliveries the broker returned. The queue is deleted."""
    async with aiormq.connect(url) as check_connection:
        check = await check_connection.channel()

        async def consumer_gone() -> bool:
            return (await check.queue_declare(queue, passive=True)).consumer_count == 0

        await wait_for(consumer_gone)
        left = (await check.queue_declare(queue, passive=True)).message_count
        assert left is not None
        await check.queue_delete(queue)
    return left


HELD = 250  # deliveries the stopped consumer holds
# How long the leader stays suspended once the close has started: well inside the close's wait
# for the last acks (LAST_ACKS_WAIT_S, 5 s), so that they are applied while it waits. Timed on
# the node: a resume through rabbitmqctl came 3 s late in a loaded make test, past that wait,
# and 217 of 250 acks were lost.
LATE_S = 2.0


@contextlib.asynccontextmanager
async def _stopped_holding(
    services: Services,
) -> AsyncIterator[tuple[str, RecorderConsuming, Callable[[], Awaitable[int]]]]:
    """A new quorum queue whose ``HELD`` messages the recorder's consuming side holds unacked
    after its stop (intake off, as before the flush): the queue, the consuming side, and what
    acks every delivery. Its connection is closed at the end."""
    queue = f"brtest.lean.{uuid.uuid4().hex[:10]}"
    count = HELD
    async with aiormq.connect(services.rabbitmq_url) as setup_connection:
        setup = await setup_connection.channel()
        await setup.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
        await asyncio.gather(*(setup.basic_publish(b"x", routing_key=queue) for _ in range(count)))
    connection = await aio_pika.connect(services.rabbitmq_url)
    consuming = RecorderConsuming(
        BrokerNodes.from_setting(services.rabbitmq_url),
        Topology(exchange="unused", queue=queue, delivery_limit=5),
        Metrics(),
        prefetch=count,
        on_message=_ignore,
        paused=lambda: False,
        drop_channel=lambda channel: None,
    )
    try:
        channel = await (await connection.channel(publisher_confirms=False)).get_underlay_channel()
        await channel.basic_qos(prefetch_count=count)
        delivered: list[aiormq.abc.DeliveredMessage] = []

        async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
            delivered.append(message)

        ok = await channel.basic_consume(queue, on_message)
        await wait_for(lambda: len(delivered) == count)
        assert ok.consumer_tag is not None
        consuming.connection, consuming.channel = connection, channel
        consuming.by_queue, consuming._tags = {queue: channel}, {queue: str(ok.consumer_tag)}
        await consuming.stop(for_good=True)  # the recorder's stop: intake off, then the flush
        unused = DeadLetterer.__new__(DeadLetterer)  # never called: nothing is dead-lettered

        async def ack_all() -> int:
            return await ack_each([AmqpDelivery(channel, m, unused) for m in delivered])

        yield queue, consuming, ack_all
    finally:
        await connection.close()
