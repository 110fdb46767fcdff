"""AMQP deliveries on the lean path: aiormq's channel directly, one basic.ack per delivery.

aio-pika wraps every delivery in an ``IncomingMessage`` and an extra task, and its ``ack()``
costs far more than aiormq's ``basic_ack`` (DESIGN.md section 7). The recorder keeps aio-pika
for connections and topology and acks through the underlying channel. A delivery remembers
its channel: once that channel is closed its tag means nothing, so every call returns False
and the broker redelivers the message.

A connection that aiormq gives up (no frame within its heartbeat grace) fails every pending
confirm and RPC with ``CancelledError``. That is a broker failure, not a request to stop the
task that waited: :func:`cancel_requested` tells the two apart, and every call here turns the
former into "not settled" (False) while a real cancellation still propagates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractExchange
from aiormq.abc import AbstractChannel, ChannelFrame, DeliveredMessage
from pamqp import commands as spec

from bulk_recorder.flusher import Delivery

log = logging.getLogger(__name__)

ERROR_HEADER = "x-bulk-recorder-error"

_CHANNEL_GONE = (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError)


def cancel_requested() -> bool:
    """True when the running task was asked to stop (``Task.cancel()``: shutdown, a caller).

    Only ``Task.cancel()`` counts a request in ``Task.cancelling()`` (Python 3.11). aiormq fails
    the futures of a connection it gives up with ``CancelledError`` set as their exception (and
    cancels its own RPC tasks, not ours), which leaves the count at 0: a CancelledError seen
    while this is False means "the broker is gone", and the caller must handle it as a broker
    failure instead of ending.
    """
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


class DeadLetterer:
    """Publishes refused messages to the dead-letter exchange with confirms, reason in a header."""

    def __init__(self, exchange: AbstractExchange) -> None:
        self._exchange = exchange

    async def publish(self, message: DeliveredMessage, reason: str) -> bool:
        props = message.header.properties
        headers: dict[str, Any] = dict(props.headers or {})
        headers[ERROR_HEADER] = reason[:500]
        headers["x-bulk-recorder-original-exchange"] = message.exchange or ""
        headers["x-bulk-recorder-original-routing-key"] = message.routing_key or ""
        out = aio_pika.Message(
            body=message.body,
            headers=headers,
            content_type=props.content_type,
            content_encoding=props.content_encoding,
            type=props.message_type,
            message_id=props.message_id,
            correlation_id=props.correlation_id,
            timestamp=props.timestamp,
            app_id=props.app_id,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        try:
            await self._exchange.publish(out, routing_key=message.routing_key or "unknown")
        except asyncio.CancelledError:
            if cancel_requested():
                raise
            log.warning("dead-letter publish failed, the connection was given up")
            return False
        except Exception as exc:  # any failure: not dead-lettered, do not ack
            log.warning("dead-letter publish failed, the message stays queued: %s", exc)
            return False
        return True


class AmqpDelivery:
    """One delivery, bound to the channel that delivered it."""

    __slots__ = ("_channel", "_dead_letterer", "_message", "delivery_count", "tag")

    def __init__(
        self, channel: AbstractChannel, message: DeliveredMessage, dead_letterer: DeadLetterer
    ) -> None:
        self._channel = channel
        self._message = message
        self._dead_letterer = dead_letterer
        self.tag: int = message.delivery_tag or 0
        headers = message.header.properties.headers
        count = headers.get("x-delivery-count", 0) if headers else 0
        self.delivery_count: int = count if isinstance(count, int) else 0

    @property
    def channel(self) -> AbstractChannel:
        return self._channel

    def alive(self) -> bool:
        return not self._channel.is_closed

    async def ack(self) -> bool:
        """Queue one basic.ack for this delivery (never ``multiple``), as :func:`ack_each` does.

        The frame is handed to the connection's writer without waiting for it to be written.
        If the connection dies before that, the broker redelivers the message and the
        idempotent insert absorbs it.
        """
        return await _write_acks(self._channel, [self.tag])

    async def reject(self) -> bool:
        if self._channel.is_closed:
            return False
        try:
            await self._channel.basic_reject(self.tag, requeue=True)
        except _CHANNEL_GONE:
            return False
        except asyncio.CancelledError:  # the frame's drain future of a connection given up
            if cancel_requested():
                raise
            return False
        return True

    async def release(self) -> bool:
        if self._channel.is_closed:
            return False
        try:
            await self._channel.basic_nack(self.tag, requeue=True)
        except _CHANNEL_GONE:
            return False
        except asyncio.CancelledError:  # the frame's drain future of a connection given up
            if cancel_requested():
                raise
            return False
        return True

    async def dead_letter(self, reason: str) -> bool:
        if self._channel.is_closed:
            return False
        if not await self._dead_letterer.publish(self._message, reason):
            return False
        return await self.ack()


async def ack_each(deliveries: Sequence[Delivery]) -> int:
    """One basic.ack per delivery (never ``multiple``), written as one buffer per channel.

    Awaiting ``basic_ack`` per delivery costs a queue put and a frame write each; a batch's
    ack frames marshalled together reach the socket in one write (the broker still sees one
    Basic.Ack per delivery tag). Returns how many were handed to the writer; deliveries of a
    closed channel are skipped: their tags mean nothing elsewhere and the broker redelivers them.
    """
    groups: dict[int, tuple[AbstractChannel, list[int]]] = {}
    for delivery in deliveries:
        assert isinstance(delivery, AmqpDelivery)
        channel = delivery.channel
        group = groups.get(id(channel))
        if group is None:
            group = groups[id(channel)] = (channel, [])
        group[1].append(delivery.tag)
    acked = 0
    for channel, tags in groups.values():
        if await _write_acks(channel, tags):
            acked += len(tags)
    return acked


# -- the lean path's writes into aiormq ------------------------------------------------------
# aiormq's basic_ack refuses a channel that is closed or closing; the lean path writes its ack
# frames into the connection's write queue itself, so it must make the same check, and make it
# when the connection's writer takes the frames, not when they are queued: a put can wait for
# room while the broker's Channel.Close arrives. A Basic.Ack that reaches the broker after the
# channel's Close/Close-Ok makes it close the whole connection (504 CHANNEL_ERROR "expected
# 'channel.open'"), and one on a channel number that a new channel took would ack another
# delivery. tests/faults/test_lean_acks.py makes the first happen.


def _channel_closing(channel: AbstractChannel) -> bool:
    """The channel is closed or closing: no frame of ours may be written on its number now.

    Closing starts when the broker's Channel.Close or Close-Ok arrives (the connection's reader
    then frees the number: ``channels`` no longer maps it to this channel) or when aiormq sends
    a Channel.Close itself after a failed RPC (its private close event, the flag its own
    basic_ack checks).
    """
    return (
        channel.is_closed
        or channel.connection.channels.get(channel.number) is not channel
        or getattr(channel, "_Channel__close_event").is_set()  # noqa: B009 (a private name)
    )


class _AckFrames:
    """Basic.Ack frames for aiormq's connection writer, dropped if their channel began closing
    before the writer takes them. The writer uses ``payload``, ``should_close``,
    ``should_drain`` and ``drain()`` of what it takes from ``write_queue`` (aiormq 7's
    ``ChannelFrame`` interface); the check runs in ``payload``, read just before the write."""

    __slots__ = ("_channel", "_payload")

    should_close = False
    should_drain = False

    def __init__(self, channel: AbstractChannel, tags: Sequence[int]) -> None:
        self._channel = channel
        frames = [spec.Basic.Ack(delivery_tag=t) for t in tags]
        self._payload = ChannelFrame.marshall(channel.number, frames).payload

    @property
    def payload(self) -> bytes:
        if _channel_closing(self._channel):
            log.debug("acks for channel %s dropped: the channel is closing", self._channel.number)
            return b""
        return self._payload

    def drain(self) -> None:
        return None


async def _write_acks(channel: AbstractChannel, tags: Sequence[int]) -> bool:
    """Queue one Basic.Ack per tag on ``channel``; False if the channel is closed or closing."""
    if _channel_closing(channel):
        return False
    try:
        await channel.connection.write_queue.put(_AckFrames(channel, tags))
    except _CHANNEL_GONE:
        return False
    return True
