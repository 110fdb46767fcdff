"""The one module that knows aiormq's internals: everything else calls its narrow interface.

The recorder's lean path writes past aiormq's public API in two places, and only here:

- :func:`write_acks` marshals a batch's Basic.Ack frames (pamqp's codec, aiormq's
  ``ChannelFrame``) and puts them on the connection's ``write_queue`` as one buffer, checking
  when the writer takes them that the channel is not closing (:func:`channel_closing` reads
  the connection's ``channels`` map and the channel's private close event);
- :func:`unblock_writers` empties a dead connection's ``write_queue`` so that callers waiting
  for room in it wake up;
- :func:`close_connection` puts a write mark on the connection's ``write_queue`` at the end of
  an orderly stop and closes the connection once the frames before it are written;
- :func:`write_publishes` (the relay's and the load generator's) marshals a batch of publishes
  into one buffer on the ``write_queue`` and registers their confirmations in the channel's
  ``confirmations`` map under the channel's ``delivery_tag`` sequence, as aiormq's
  basic_publish does one by one.

- :func:`deliver_inline` runs the recorder's consumer callback in the channel's own reader,
  in place of aiormq's ``_on_deliver_frame`` (which reads the header and body frames with the
  channel's private ``__get_content_header`` and ``_read_content``, then starts a task per
  delivery for the callback).

aiormq and pamqp are pinned to exact versions in pyproject.toml for these reasons. The layout
test (tests/unit/test_layout.py) fails if another module names these private attributes.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import aio_pika
import aiormq
from aiormq.abc import AbstractChannel, ChannelFrame, ConfirmationFrameType, DeliveredMessage
from pamqp import commands as spec
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from bulk_recorder.infra.errors import CHANNEL_GONE

log = logging.getLogger(__name__)

__all__ = [
    "AckFrames",
    "InlineHandler",
    "channel_closing",
    "close_connection",
    "deliver_inline",
    "unblock_writers",
    "write_acks",
    "write_publishes",
]


# -- the lean path's deliveries: no task per delivery -----------------------------------------
# aiormq runs a consumer callback as a task of its own per delivery (a Task, its wrapper, a
# FutureStore entry and two done-callbacks), and the recorder's callback never needs one: it
# decodes, buffers and returns, and starts a task itself only for a dead letter, which may wait.

InlineHandler = Callable[[DeliveredMessage], None]


def deliver_inline(
    channel: AbstractChannel, handle: InlineHandler
) -> Callable[[DeliveredMessage], Coroutine[Any, Any, None]]:
    """The callback to pass to ``channel.basic_consume``: its deliveries are handed to
    ``handle`` in the channel's reader, in order and without a task each. ``handle`` must not
    block and should not raise (what it raises is logged, as aiormq logs a failed callback, and
    the delivery stays unacked until its channel closes). Deliveries to other consumers of the
    channel take aiormq's own path. Safe to call again on the same channel (a new consume)."""

    async def callback(message: DeliveredMessage) -> None:  # aiormq's path, if ever taken
        handle(message)

    assert isinstance(channel, aiormq.Channel)
    inline: dict[object, InlineHandler] | None = getattr(channel, _INLINE, None)
    if inline is None:
        inline = {}
        setattr(channel, _INLINE, inline)
        setattr(channel, "_on_deliver_frame", _inline_reader(channel, inline))  # noqa: B010
    inline.clear()  # the callbacks of earlier consumes are gone from the channel's consumers
    inline[callback] = handle
    return callback


_INLINE = "_bulk_recorder_inline"


def _inline_reader(
    channel: aiormq.Channel, inline: dict[object, InlineHandler]
) -> Callable[[spec.Basic.Deliver], Coroutine[Any, Any, None]]:
    on_deliver_frame = channel._on_deliver_frame
    content_header = getattr(channel, "_Channel__get_content_header")  # noqa: B009 (private)
    read_content = channel._read_content
    consumers = channel.consumers

    async def deliver(frame: spec.Basic.Deliver) -> None:
        handle = inline.get(consumers.get(frame.consumer_tag or ""))
        if handle is None:
            await on_deliver_frame(frame)
            return
        message = await read_content(frame, await content_header())
        try:
            handle(message)
        except Exception:
            log.exception("Consumer callback failed")

    return deliver


# -- the lean path's writes into aiormq ------------------------------------------------------
# aiormq's basic_ack refuses a channel that is closed or closing; the lean path writes its ack
# frames into the connection's write queue itself, so it must make the same check, and make it
# when the connection's writer takes the frames, not when they are queued: a put can wait for
# room while the broker's Channel.Close arrives. A Basic.Ack that reaches the broker after the
# channel's Close/Close-Ok makes it close the whole connection (504 CHANNEL_ERROR "expected
# 'channel.open'"), and one on a channel number that a new channel took would ack another
# delivery. tests/faults/test_lean_acks.py makes the first happen.


def channel_closing(channel: AbstractChannel) -> bool:
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


class AckFrames:
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
        if channel_closing(self._channel):
            log.debug("acks for channel %s dropped: the channel is closing", self._channel.number)
            return b""
        return self._payload

    def drain(self) -> None:
        return None


async def write_acks(channel: AbstractChannel, tags: Sequence[int]) -> bool:
    """Queue one Basic.Ack per tag on ``channel``; False if the channel is closed or closing."""
    if channel_closing(channel):
        return False
    try:
        await channel.connection.write_queue.put(AckFrames(channel, tags))
    except CHANNEL_GONE:
        return False
    return True


async def unblock_writers(channel: AbstractChannel) -> None:
    """Wake every call still waiting for room in a closed connection's write queue.

    aiormq's write queue is bounded (10 frames) and not tied to the channel's close: when the
    connection dies while the queue is full, a basic_ack or basic_publish waiting for room is
    never woken and holds its flush worker forever (one worker lost per broker cut, found by
    tests/faults/test_broker_cut.py). Emptying the queue lets each waiting call put its frame,
    which goes nowhere, and return; the broker redelivers the dead channel's unacked messages.
    """
    queue = channel.connection.write_queue
    while not queue.empty():
        while not queue.empty():
            queue.get_nowait()
        await asyncio.sleep(0)  # the woken callers put their frames now


class _WriteMark:
    """An empty frame for aiormq's connection writer: it calls ``drain()`` once every frame
    queued before it has been handed to the socket and the socket drained."""

    __slots__ = ("written",)

    payload = b""
    should_close = False
    should_drain = True

    def __init__(self, written: asyncio.Future[None]) -> None:
        self.written = written

    def drain(self) -> None:
        if not self.written.done():
            self.written.set_result(None)


async def close_connection(connection: aio_pika.abc.AbstractConnection, within_s: float) -> None:
    """Close the consuming connection at the end of an orderly stop, once the writer has
    written every frame queued so far.

    The stop's last acks (a flushed batch, a release) may still sit in the write queue. A close
    marks the channels closing, and the lean path drops frames of a closing channel, as it must
    when the broker closes it: an ack dropped after a release leaves the message in the queue
    twice. So the writer is given the time to write them first; the whole close, writes and
    close handshake, takes at most ``within_s`` (``TimeoutError`` past it).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    transport = getattr(connection, "transport", None)
    if transport is not None and not transport.connection.is_closed:
        written: asyncio.Future[None] = loop.create_future()
        closing = transport.connection.closing  # a connection lost meanwhile writes nothing more
        try:
            async with asyncio.timeout_at(deadline):
                await transport.connection.write_queue.put(_WriteMark(written))
                await asyncio.wait([written, closing], return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            log.warning("frames still unwritten after %.1f s; closing anyway", within_s)
    async with asyncio.timeout_at(deadline):
        await connection.close()


# -- batched publishes (the relay, the load generator) -------------------------------------


async def write_publishes(
    channel: AbstractChannel,
    messages: Sequence[tuple[str, str, spec.Basic.Properties, bytes]],
    *,
    mandatory: bool = False,
) -> list[asyncio.Future[ConfirmationFrameType]]:
    """Publish (exchange, routing key, properties, body) messages in one write; a confirmation
    future each, resolved by aiormq's own confirm handling (a Basic.Ack, or DeliveryError for a
    nack; rejected when the channel closes). With ``mandatory``, a message the broker returns
    resolves as aiormq's basic_publish would: PublishError on a channel opened with
    ``on_return_raises``, else the returned message (the broker matches a return to its publish
    by message id: each message gets a fresh one unless it has one).

    basic_publish writes each message on its own: a socket write, a lock, a timeout scope and
    two futures a message, the larger part of a publisher's CPU. The channel must have
    publisher confirms on. A body is cut into content frames as basic_publish cuts it (of the
    channel's ``max_content_size``, frame_max less 8 bytes): any body basic_publish can send,
    this can.

    It waits for the channel's lock and for room in the connection's write queue: bound it
    (``asyncio.timeout``); cancelled while it waits, it has written nothing and given the
    delivery tags back. The queue is bounded and only the connection's writer empties it: a
    writer that waits for a socket the network holds lets it fill, and a connection that dies
    then never empties it (:func:`unblock_writers`), so an unbounded wait can last for ever.
    """
    if not isinstance(channel, aiormq.Channel):
        raise TypeError(f"write_publishes needs an aiormq.Channel, not {type(channel)}")
    frames: list[spec.Basic.Publish | ContentHeader | ContentBody] = []
    futures: list[asyncio.Future[ConfirmationFrameType]] = []
    # The channel's own lock, as basic_publish takes it: delivery tags are numbered in the
    # order the frames reach the write queue, whoever else publishes on the channel.
    async with channel.lock:
        for exchange, routing_key, properties, body in messages:
            channel.delivery_tag += 1
            future: asyncio.Future[ConfirmationFrameType] = channel.create_future()
            channel.confirmations[channel.delivery_tag] = future
            if mandatory:
                _match_returns(channel, properties, channel.delivery_tag, future)
            futures.append(future)
            frames.append(
                spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory)
            )
            frames.append(ContentHeader(properties=properties, body_size=len(body)))
            frames.extend(_content_frames(body, channel.max_content_size))
        try:
            await channel.connection.write_queue.put(ChannelFrame.marshall(channel.number, frames))
        except BaseException:  # not written (cancelled or timed out while the queue was full):
            # as basic_publish does, give the sequence numbers back so the next publish's match
            for tag in range(channel.delivery_tag - len(futures) + 1, channel.delivery_tag + 1):
                channel.confirmations.pop(tag, None)
            channel.delivery_tag -= len(futures)
            for future in futures:
                future.cancel()
            raise
    return futures


def _content_frames(body: bytes, size: int) -> list[ContentBody]:
    """The body frames of one message: none for an empty body, else slices of ``size`` bytes
    (what aiormq's ``Channel._split_body`` makes; a frame holds frame_max less 8 bytes)."""
    view = memoryview(body)
    return [ContentBody(bytes(view[start : start + size])) for start in range(0, len(body), size)]


def _match_returns(
    channel: aiormq.Channel,
    properties: spec.Basic.Properties,
    tag: int,
    future: asyncio.Future[ConfirmationFrameType],
) -> None:
    """Let aiormq find this publish's confirmation when the broker returns it, as
    basic_publish does: by message id, forgotten once confirmed."""
    if not properties.message_id:
        properties.message_id = uuid.uuid4().hex
    message_id = properties.message_id
    channel.message_id_delivery_tag[message_id] = tag

    def forget(_: asyncio.Future[ConfirmationFrameType]) -> None:
        if channel.message_id_delivery_tag.get(message_id) == tag:
            del channel.message_id_delivery_tag[message_id]

    future.add_done_callback(forget)
