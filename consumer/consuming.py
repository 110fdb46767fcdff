"""The recorder's consuming connection: connect, QoS, declare, consume, and again after a loss.

:class:`Consuming` keeps one connection up through :func:`keep_connected`: on each, a channel
with QoS ``settings.channel_prefetch``, the topology declared with the contract's arguments,
and ``basic.consume`` while intake is allowed (:class:`consumer.intake.IntakePause` may hold
it). The connection never publishes, so a broker alarm never blocks its acks.

When the broker cancels the consumer (Basic.Cancel: its queue was deleted), the recorder is not
ready at once and goes round the loop: its channel and deliveries dropped, a new connection,
the topology declared again, then consume. A broker that keeps cancelling at once is met with a
growing backoff, not a busy loop. A topology the broker refuses ends the loop: the recorder
stops, and ``run`` raises it (exit 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

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
from consumer.topology import Topology, declare_or_mismatch

log = logging.getLogger(__name__)

# How long an orderly stop lets the broker apply its last acks before closing. AMQP 0-9-1 has no
# ack confirmation, and a quorum queue's channel (RabbitMQ 3.10, rabbit_fifo_client) holds back
# settles once 32 of its commands are unapplied, sends them as those are applied (about a
# millisecond), and drops what it still holds when the channel ends: an ack lost after a
# release leaves its message twice in the queue. Measured: 217 of 250 acks written just before
# a close were lost; none after a round trip and this linger.
LAST_ACKS_LINGER_S = 0.2

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
    ) -> None:
        self._nodes = nodes
        self.topology = topology
        self.metrics = metrics
        self.prefetch = prefetch
        self._on_message = on_message
        self._paused = paused
        self._drop_channel = drop_channel
        self.connection: aio_pika.abc.AbstractConnection | None = None
        self.channel: AbstractChannel | None = None
        self.ok = False  # consuming, or ready to (intake paused)
        self.cancelled_note: str | None = None  # why not consuming, until declared again
        self.mismatch: TopologyMismatch | None = None
        self._consumer_tag: str | None = None
        self._lock = asyncio.Lock()
        self._closing = False
        self._connected_before = False
        self._quick_cancels = 0  # consumers the broker cancelled soon after they started, in a row

    def status(self) -> str:
        broker = "up" if self.ok else "down"
        if self.cancelled_note is not None:
            broker += f" ({self.cancelled_note})"
        return broker

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
        self.connection = connection
        self.channel = await consume_channel.get_underlay_channel()
        if self._connected_before:
            self.metrics.broker_reconnects.inc()
        self._connected_before = True
        self.ok = True
        self.cancelled_note = None
        log.info("consuming from %s", self.topology.queue)

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
        self._drop_channel(channel)
        if self.channel is channel:
            self.channel = None
            self._consumer_tag = None
        if connection is not None:
            with broker_failures_suppressed():
                await connection.close()
        await unblock_writers(channel)

    async def _wait_and_consume(
        self,
        stop: asyncio.Event,
        connection: aio_pika.abc.AbstractConnection,
        channel: AbstractChannel,
    ) -> bool:
        """Consume (unless intake is paused); return on stop or when the connection dies, or
        True when the broker cancelled the consumer (Basic.Cancel: its queue was deleted)."""
        cancelled: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_cancel(frame: spec.Basic.Cancel) -> None:
            # in the channel's reader (no RPC here); its deliveries die with it, in the loop
            self.ok = False
            self.cancelled_note = f"consumer of {self.topology.queue} cancelled by the broker"
            if not cancelled.done():
                cancelled.set_result(None)

        channel.on_consumer_cancel_callbacks.add(on_cancel)
        await self.start()
        closed = asyncio.ensure_future(connection.closed())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait(
                {closed, channel.closing, stopped, cancelled}, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            channel.on_consumer_cancel_callbacks.discard(on_cancel)
            for fut in (closed, stopped):
                fut.cancel()
        if not cancelled.done() or stop.is_set():
            return False
        log.warning("the broker cancelled our consumer (queue deleted?): declaring it again")
        return True

    async def start(self) -> None:
        """basic.consume on the current channel, once, and only while intake is allowed."""
        async with self._lock:
            channel = self.channel
            if (
                self._paused()
                or self._closing
                or channel is None
                or channel.is_closed
                or self._consumer_tag is not None
            ):
                return
            callback = deliver_inline(channel, self._on_message)
            ok = await channel.basic_consume(self.topology.queue, callback, no_ack=False)
            self._consumer_tag = ok.consumer_tag

    async def stop(self, *, for_good: bool = False) -> None:
        """basic.cancel; ``for_good`` (a shutdown): never consume again."""
        self._closing = self._closing or for_good
        async with self._lock:
            channel, tag = self.channel, self._consumer_tag
            self._consumer_tag = None
            if channel is not None and tag is not None and not channel.is_closed:
                with broker_failures_suppressed():
                    await channel.basic_cancel(tag)

    async def close(self, deadline: Deadline, *, then_s: float = 0.0) -> None:
        """Close the connection a stop left open, once the broker has had the final acks.

        First one round trip on the consuming channel (a Basic.Qos that changes nothing: its
        reply comes after the broker's channel has handled every ack written before it), then
        :data:`LAST_ACKS_LINGER_S` for the queue to apply them, then the close (which still
        writes every frame queued before it); all within what is left of the stop budget less
        ``then_s`` (the steps after this one).
        """
        if self.connection is None:
            return
        reserve = then_s + CLOSE_OK_S  # the close may outlast its bound by CLOSE_OK_S
        channel = self.channel
        if channel is not None and not channel.is_closed:
            with broker_failures_suppressed(), contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline.left(reserve)):
                    await channel.basic_qos(prefetch_count=self.prefetch)
                    await asyncio.sleep(LAST_ACKS_LINGER_S)
        with broker_failures_suppressed(), contextlib.suppress(TimeoutError):
            await close_connection(self.connection, deadline.left(reserve))
