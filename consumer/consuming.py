"""The recorder's consuming connection: connect, QoS, declare, consume, and again after a loss.

:class:`Consuming` keeps one connection up through :func:`keep_connected`: on each, the
topology declared with the contract's arguments, then one channel per shard it consumes, each
with QoS ``settings.channel_prefetch`` and ``basic.consume`` while intake is allowed
(:class:`consumer.intake.IntakePause` may hold it). The connection never publishes, so a broker
alarm never blocks its acks.

The shards consumed: 1 to ``RABBITMQ_QUEUE_SHARDS`` (those of ``RABBITMQ_QUEUE_SHARDS_CONSUMED``
if set), plus the leftover shards past N that still exist (a deployment that had more), found
at connect time and again at each look of the queue watch (:meth:`Consuming.reconcile`). A
channel per shard keeps one shard's trouble (a channel error, a cancel) out of the others'
channels, and each delivery is acked on the channel that delivered it. A leftover shard found
empty is let go (basic.cancel, its channel kept for what it delivered) so that, once no
recorder holds anything of it, its consumer count drops to 0 and ``shards prune`` may delete
it; a message showing up there again is consumed again.

When the broker cancels the consumer (Basic.Cancel: its queue was deleted), the recorder is not
ready at once and goes round the loop: its channel and deliveries dropped, a new connection,
the topology declared again, then consume. A routed shard the queue watch finds gone while we
hold a consumer on it is taken the same way (the broker's notice can be lost: RabbitMQ 3.10 once
kept a deleted quorum queue's consumer on the channel and sent nothing). A broker that keeps
cancelling at once is met with a growing backoff, not a busy loop. A topology the broker refuses
ends the loop: the recorder stops, and ``run`` raises it (exit 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

import aio_pika
from aiormq.abc import AbstractChannel
from pamqp import commands as spec

from bulk_recorder.infra.aiormq_internals import (
    InlineHandler,
    close_connection,
    deliver_inline,
    unblock_writers,
)
from bulk_recorder.infra.backoff import RETRY
from bulk_recorder.infra.broker import BrokerNodes, TopologyMismatch, broker_failures_suppressed
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.infra.reconnect import Session, keep_connected
from bulk_recorder.infra.stop_budget import CLOSE_OK_S, Deadline
from consumer.last_acks import consumers_with_ours, wait_applied
from consumer.topology import Topology, declare_or_mismatch, existing_leftovers

log = logging.getLogger(__name__)

# Runs in the channel's reader, once per delivery, without a task of its own (deliver_inline):
# it must not block; what may wait (a dead letter) it starts as a task itself.
OnMessage = InlineHandler


class Consuming:
    """The consumer side of the recorder's broker connection.

    ``paused()`` says whether intake is held; ``drop_channel(channel)`` forgets a dead
    channel's deliveries (the recorder's buffers)."""

    def __init__(
        self,
        nodes: BrokerNodes,
        topology: Topology,
        metrics: Metrics,
        *,
        prefetch: int,
        on_message: OnMessage,
        paused: Callable[[], bool],
        drop_channel: Callable[[AbstractChannel], None],
        shards_consumed: tuple[int, ...] = (),
    ) -> None:
        self._nodes = nodes
        self.topology = topology
        self._subset = frozenset(shards_consumed)  # empty: every shard
        self.metrics = metrics
        self.prefetch = prefetch
        self._on_message = on_message
        self._paused = paused
        self._drop_channel = drop_channel
        self.connection: aio_pika.abc.AbstractConnection | None = None
        self.channel: AbstractChannel | None = None  # the first shard's (or the declaring one)
        self.by_queue: dict[str, AbstractChannel] = {}  # queue -> the channel consuming it
        self.ok = False  # consuming, or ready to (intake paused)
        self.cancelled_note: str | None = None  # why not consuming, until declared again
        self.mismatch: TopologyMismatch | None = None
        self._tags: dict[str, str] = {}  # queue -> consumer tag, while consuming it
        self._let_go: set[str] = set()  # leftover shards found empty: not consumed for now
        self._on_cancel: Callable[[spec.Basic.Cancel], None] | None = None
        self._shard_gone: Callable[[str], None] | None = None  # as a cancel of that queue would
        self._lock = asyncio.Lock()
        self._closing = False
        self._with_ours: dict[str, int] = {}  # queue -> its consumers just before our last cancel
        self._connected_before = False
        self._quick_cancels = 0  # consumers the broker cancelled soon after they started, in a row

    def status(self) -> str:
        broker = "up" if self.ok else "down"
        if self.cancelled_note is not None:
            broker += f" ({self.cancelled_note})"
        missing = self.missing()
        if self.ok and missing:
            broker += f" (no consumer on {', '.join(missing)})"
        return broker

    def wanted(self, number: int) -> bool:
        """Whether this recorder consumes shard ``number`` (RABBITMQ_QUEUE_SHARDS_CONSUMED)."""
        return not self._subset or number in self._subset

    def routed_queues(self) -> list[str]:
        """The shards 1 to N this recorder consumes."""
        topology = self.topology
        return [topology.shard_queue(k) for k in range(1, topology.shards + 1) if self.wanted(k)]

    def missing(self) -> list[str]:
        """Routed shards without our consumer while intake is allowed: not ready."""
        if not self.ok or self._paused() or self._closing:
            return []
        return [queue for queue in self.routed_queues() if queue not in self._tags]

    def ready(self) -> bool:
        """Connected, and consuming every routed shard it should (or intake paused)."""
        return self.ok and not self.missing()

    def queue_of(self, channel: AbstractChannel) -> str:
        """The shard queue ``channel`` consumes (RABBITMQ_QUEUE if it is none of ours)."""
        for queue, consuming in self.by_queue.items():
            if consuming is channel:
                return queue
        return self.topology.queue

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop``, through every loss of the broker; the connection stays open
        at the end for the final flush's acks (:meth:`close` closes it). A topology the broker
        refuses sets ``stop`` and is kept in ``mismatch``."""
        try:
            await keep_connected(
                self._nodes,
                Session(self._open, lambda c: self._consume_until_lost(c, stop), self._lost),
                stop,
                what="consumer connection",
                logger=log,
                fatal=(TopologyMismatch,),
                close_on_stop=False,
            )
        except TopologyMismatch as exc:
            self.mismatch = exc
            stop.set()

    async def _open(self, connection: aio_pika.abc.AbstractConnection) -> None:
        consume_channel = await connection.channel(publisher_confirms=False)
        await consume_channel.set_qos(prefetch_count=self.prefetch)
        await declare_or_mismatch(consume_channel, self.topology)
        first = await consume_channel.get_underlay_channel()
        leftovers = await existing_leftovers(first.connection, self.topology)
        queues = self.routed_queues()
        queues += [self.topology.shard_queue(k) for k in leftovers if self.wanted(k)]
        shard_channels: dict[str, AbstractChannel] = {}
        for queue in queues:
            shard_channels[queue] = (
                first if not shard_channels else await self._shard_channel(connection)
            )
        self.connection = connection
        self.by_queue = shard_channels
        self._let_go.clear()
        self.channel = next(iter(shard_channels.values()), first)
        if self._connected_before:
            self.metrics.broker_reconnects.inc()
        self._connected_before = True
        self.ok = True
        self.cancelled_note = None
        log.info("consuming from %s", ", ".join(queues) or "no shard")

    async def _shard_channel(self, connection: aio_pika.abc.AbstractConnection) -> AbstractChannel:
        channel = await connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=self.prefetch)
        return await channel.get_underlay_channel()

    async def _consume_until_lost(
        self, connection: aio_pika.abc.AbstractConnection, stop: asyncio.Event
    ) -> int:
        """The backoff attempt to reconnect with: a broker that keeps cancelling our consumer
        at once is met with a growing backoff, not a busy loop."""
        assert self.channel is not None
        started = time.monotonic()
        if not await self._wait_and_consume(stop, connection, self.channel):
            return 0
        quick = time.monotonic() - started < RETRY.cap_s
        self._quick_cancels = self._quick_cancels + 1 if quick else 0
        return self._quick_cancels

    async def _lost(self, stopping: bool) -> None:
        """Forget the channel's deliveries and close its connection (unless shutting down)."""
        self.ok = False
        channel, connection = self.channel, self.connection
        if channel is None or stopping:
            return
        shard_channels = list(self.by_queue.values()) or [channel]
        for each in shard_channels:
            self._drop_channel(each)
        if self.channel is channel:
            self.channel = None
            self.by_queue = {}
            self._tags.clear()
        if connection is not None:
            with broker_failures_suppressed():
                await connection.close()
        for each in shard_channels:
            await unblock_writers(each)

    async def _wait_and_consume(
        self,
        stop: asyncio.Event,
        connection: aio_pika.abc.AbstractConnection,
        channel: AbstractChannel,
    ) -> bool:
        """Consume (unless intake is paused); return on stop or when the connection dies, or
        True when the broker cancelled the consumer (Basic.Cancel: its queue was deleted)."""
        cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def shard_gone(queue: str, how: str = "cancelled by the broker") -> None:
            self.ok = False
            self.cancelled_note = f"consumer of {queue} {how}"
            if not cancelled.done():
                cancelled.set_result(None)

        def on_cancel(frame: spec.Basic.Cancel) -> None:
            # in the channel's reader (no RPC here); its deliveries die with it, in the loop
            queue = self._cancelled(str(frame.consumer_tag))
            if queue is None:
                return  # a leftover shard deleted (drained and pruned): nothing to declare
            log.warning(
                "the broker cancelled our consumer of %s (queue deleted?): declaring it again",
                queue,
            )
            shard_gone(queue)

        self._on_cancel = on_cancel
        self._shard_gone = lambda queue: shard_gone(queue, "lost: its queue is gone")
        shard_channels = list(self.by_queue.values()) or [channel]
        for each in shard_channels:
            each.on_consumer_cancel_callbacks.add(on_cancel)
        await self.start()
        closed = asyncio.ensure_future(connection.closed())
        stopped = asyncio.ensure_future(stop.wait())
        watched = {closed, channel.closing, stopped, cancelled}
        watched |= {each.closing for each in shard_channels}
        try:
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._on_cancel = None
            self._shard_gone = None
            for each in list(self.by_queue.values()) or shard_channels:
                each.on_consumer_cancel_callbacks.discard(on_cancel)
            for fut in (closed, stopped):
                fut.cancel()
        # the cancel, or the queue watch finding the queue gone, said so as it came
        return cancelled.done() and not stop.is_set()

    def _cancelled(self, tag: str) -> str | None:
        """The broker cancelled consumer ``tag``: its queue, if it must be declared again (a
        routed shard, or a tag not known yet: its consume is still under way); None for a
        leftover shard (deleted once drained)."""
        for queue, mine in list(self._tags.items()):
            if mine != tag:
                continue
            del self._tags[queue]
            number = self.topology.shard_number(queue)
            if number is not None and number > self.topology.shards:
                self._let_go.add(queue)
                return None
            return queue
        return self.topology.queue

    async def start(self) -> None:
        """basic.consume on each shard's channel, once, and only while intake is allowed."""
        async with self._lock:
            for queue, channel in list(self.by_queue.items()):
                if (
                    self._paused()
                    or self._closing
                    or channel.is_closed
                    or queue in self._tags
                    or queue in self._let_go
                ):
                    continue
                callback = deliver_inline(channel, self._on_message)
                ok = await channel.basic_consume(queue, callback, no_ack=False)
                self._tags[queue] = str(ok.consumer_tag)

    async def stop(self, *, for_good: bool = False) -> None:
        """basic.cancel of every shard's consumer; ``for_good`` (a shutdown): never again."""
        self._closing = self._closing or for_good
        async with self._lock:
            tags, self._tags = self._tags, {}
            for queue, tag in tags.items():
                channel = self.by_queue.get(queue)
                if channel is not None and not channel.is_closed:
                    with broker_failures_suppressed():
                        if for_good:  # what the close waits to see fall (last_acks.py)
                            with_ours = await consumers_with_ours(channel, queue)
                            if with_ours is not None:
                                self._with_ours[queue] = with_ours
                        await channel.basic_cancel(tag)

    async def reconcile(
        self,
        leftovers: Mapping[int, int | None],
        gone: frozenset[str] = frozenset(),
        looked_through: aio_pika.abc.AbstractConnection | None = None,
    ) -> None:
        """The queue watch's look at the leftover shards past N that exist now (number ->
        messages ready, None when its leader gave no count): consume a new one, let go of an
        empty one, consume again one that holds messages again, leave one with no count as it
        is, forget one that is gone (pruned). A routed shard in ``gone``
        that we hold a consumer on was deleted without the broker's cancel reaching us: go
        round the loop as a cancel would (unless the look went through an older connection,
        which a cancel has already replaced)."""
        connection = self.connection
        if connection is None or connection.is_closed or not self.ok:
            return
        if looked_through is None or looked_through is connection:
            lost = sorted(queue for queue in gone if queue in self._tags)
            if lost and self._shard_gone is not None:
                log.warning(
                    "%s gone with no cancel from the broker: declaring it again", ", ".join(lost)
                )
                for queue in lost:
                    del self._tags[queue]
                    self._shard_gone(queue)
                return
        topology = self.topology
        wanted = {
            topology.shard_queue(k): ready for k, ready in leftovers.items() if self.wanted(k)
        }
        async with self._lock:
            for queue in [q for q in self.by_queue if q not in wanted]:
                number = topology.shard_number(queue)
                if number is not None and number > topology.shards and queue not in self._tags:
                    del self.by_queue[queue]  # pruned: nothing of it is held (no consumer)
                    self._let_go.discard(queue)
            for queue, ready in wanted.items():
                if queue not in self.by_queue:
                    channel = await self._shard_channel(connection)
                    if self._on_cancel is not None:
                        channel.on_consumer_cancel_callbacks.add(self._on_cancel)
                    self.by_queue[queue] = channel
                    log.info("consuming leftover shard %s too", queue)
                if ready is None:
                    continue  # a late 0 and 0 (consumer/queue_count.py): no count to act on
                if ready == 0 and queue in self._tags:
                    tag = self._tags.pop(queue)
                    with broker_failures_suppressed():
                        await self.by_queue[queue].basic_cancel(tag)
                if ready == 0:
                    self._let_go.add(queue)
                else:
                    self._let_go.discard(queue)
        await self.start()

    async def close(self, deadline: Deadline, *, then_s: float = 0.0) -> None:
        """Close the connection a stop left open, once the broker has had the final acks.

        First one round trip on the consuming channel (a Basic.Qos that changes nothing: its
        reply comes after the broker's channel has handled every ack written before it), then
        the wait for the queue to apply them (:mod:`consumer.last_acks`), then the close (which
        still writes every frame queued before it); all within what is left of the stop budget
        less ``then_s`` (the steps after this one).
        """
        if self.connection is None:
            return
        reserve = then_s + CLOSE_OK_S  # the close may outlast its bound by CLOSE_OK_S
        shard_channels = [c for c in self.by_queue.values() or [self.channel] if c is not None]
        if any(not channel.is_closed for channel in shard_channels):
            with broker_failures_suppressed(), contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline.left(reserve)):
                    for channel in shard_channels:  # acks are per channel: a round trip on each
                        if not channel.is_closed:
                            await channel.basic_qos(prefetch_count=self.prefetch)
                    await wait_applied(self.by_queue, self._with_ours, shard_channels)
        with broker_failures_suppressed(), contextlib.suppress(TimeoutError):
            await close_connection(self.connection, deadline.left(reserve))
