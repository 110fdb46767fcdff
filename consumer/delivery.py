"""AMQP deliveries on the lean path: aiormq's channel directly, one basic.ack per delivery.

aio-pika wraps every delivery in an ``IncomingMessage`` and an extra task, and its ``ack()``
costs far more than aiormq's ``basic_ack`` (docs/performance.md, "The yardstick"). The
recorder keeps aio-pika for connections and topology and acks through the underlying channel.
A delivery remembers its channel: once that channel is closed its tag means nothing, so every
call returns False and the broker redelivers the message.

Two ways to settle a delivery other than "ack after commit" publish a copy first, on the
recorder's own publishing connection (:class:`consumer.copy_publisher.CopyPublisher`), and ack
only once the broker has routed and confirmed the copy:

- **dead_letter**: the copy goes to the dead-letter exchange with the reason. While the DLQ
  cannot take it (deleted, at its max-length with ``reject-publish``, the publishing
  connection blocked by an alarm) the delivery is held and the publish retried with backoff;
  after ``hold_s`` it is released. No hot loop: a message goes round at most once a hold.
- **release**: the copy goes back to the queue itself (default exchange, routing key = the
  queue, so no other binding sees it) with a retry count in a header. On quorum queues every
  nack or return counts toward ``x-delivery-limit`` (RabbitMQ 3.10), and past it the broker
  dead-letters the message itself, which drops it if the DLQ refuses (at-most-once
  dead-lettering). A republished copy starts with no deliveries spent. Only when the broker
  refuses the copy too is the delivery nacked (requeue), which spends one delivery.

Between "copy confirmed" and "original acked" a message is in the queue twice: the channel must
not close there. At shutdown, past its bounded wait, :meth:`DeadLetterer.stop_copying` lets no
new copy start (a delivery not yet released stays unacked, and the channel's close returns it
without judging it) and :meth:`DeadLetterer.copies_settled` waits for the copies under way to
be confirmed and their originals acked, before the consuming channel closes.

A connection that aiormq gives up (no frame within its heartbeat grace) fails every pending
confirm and RPC with ``CancelledError``. That is a broker failure, not a request to stop the
task that waited: :func:`bulk_recorder.infra.broker.cancel_requested` tells the two apart, and every
call here turns the former into "not settled" (False) while a real cancellation still
propagates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime
from time import monotonic
from typing import TYPE_CHECKING, Any

from aiormq.abc import AbstractChannel, DeliveredMessage

from bulk_recorder.infra import tracing
from bulk_recorder.infra.aiormq_internals import write_acks
from bulk_recorder.infra.backoff import RETRY, Backoff
from bulk_recorder.infra.broker import cancel_requested
from bulk_recorder.infra.errors import CHANNEL_GONE
from bulk_recorder.recorder.flusher import DeadLetterResult, Delivery
from consumer.copy_properties import copy_properties
from consumer.copy_publisher import CopyPublisher

if TYPE_CHECKING:  # imported where a span is made: tracing on (bulk_recorder.infra.tracing)
    from opentelemetry import trace

log = logging.getLogger(__name__)

ERROR_HEADER = "x-bulk-recorder-error"
ORIGINAL_EXCHANGE_HEADER = "x-bulk-recorder-original-exchange"
ORIGINAL_ROUTING_KEY_HEADER = "x-bulk-recorder-original-routing-key"
RETRIES_HEADER = "x-bulk-recorder-retries"
# when the recorder dead-lettered the message (UTC, ISO 8601 with milliseconds): `dlq inspect`
# groups by it (first and last seen)
DEAD_LETTERED_AT_HEADER = "x-bulk-recorder-dead-lettered-at"
# set by the broker on each redelivery; a republished copy starts afresh
DELIVERY_COUNT_HEADER = "x-delivery-count"


def dead_letter_class(reason: str) -> str:
    """A low-cardinality label for ``messages_dead_lettered_total{reason}``."""
    if reason.startswith(("body", "invalid JSON", "nesting")):
        return "decode"
    if reason.startswith(("missing type", "unknown type")):
        return "type"
    return "validation"


class DeadLetterer:
    """Publishes copies of deliveries: to the DLQ with a reason, or back to their queue."""

    def __init__(
        self,
        publisher: CopyPublisher,
        *,
        dead_letter_exchange: str,
        queue: str,
        hold_s: float,
        backoff: Backoff | None = None,
        queue_of: Callable[[AbstractChannel], str] | None = None,
    ) -> None:
        self._publisher = publisher
        self._dead_letter_exchange = dead_letter_exchange
        self._queue = queue
        self._queue_of = queue_of  # the shard queue a channel consumes
        self.hold_s = hold_s
        self.backoff = backoff or RETRY
        self._stopping = asyncio.Event()
        self._copying = True
        self._copies = 0  # copies between their publish and their original's settle
        self._no_copies = asyncio.Event()
        self._no_copies.set()

    @property
    def copying(self) -> bool:
        """False once a shutdown stopped new copies (:meth:`stop_copying`)."""
        return self._copying

    def stop_copying(self) -> None:
        """Shutting down, past the bounded wait: publish no new copy (dead letter or release).
        A delivery not yet copied stays unacked; the channel's close returns it."""
        self._copying = False

    @property
    def copies_under_way(self) -> int:
        """Copies between their publish and their original's ack (or nack)."""
        return self._copies

    @contextlib.contextmanager
    def copy_under_way(self) -> Iterator[None]:
        """Around one copy's publish, confirm and its original's ack (or nack)."""
        self._copies += 1
        self._no_copies.clear()
        try:
            yield
        finally:
            self._copies -= 1
            if not self._copies:
                self._no_copies.set()

    async def copies_settled(self, within_s: float) -> int:
        """Wait (at most ``within_s``) until no copy is under way; returns how many still are.
        Each ends within its publish's confirm timeout."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._no_copies.wait(), within_s)
        return self._copies

    def stop_holding(self) -> None:
        """Shutting down: end every hold now (held deliveries are released at once)."""
        self._stopping.set()

    async def pause(self, seconds: float) -> bool:
        """Wait between two attempts; False when the recorder is stopping."""
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            return True
        return False

    async def dead_letter(
        self, message: DeliveredMessage, reason: str, wanted: Callable[[], bool]
    ) -> str | None:
        """Publish the DLQ copy; None once routed and confirmed, else why not."""
        headers = _origin(message)
        headers[ERROR_HEADER] = reason[:500]
        headers[DEAD_LETTERED_AT_HEADER] = _now()
        routing_key = _text(headers[ORIGINAL_ROUTING_KEY_HEADER]) or "unknown"
        with dead_letter_span(self._dead_letter_exchange, message, reason) as span:
            failure = await self._publisher.publish(
                message.body,
                copy_properties(message.header.properties, headers),
                exchange=self._dead_letter_exchange,
                routing_key=routing_key,
                wanted=wanted,
            )
            if span is not None and failure is not None:
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR, failure[:200]))
        return failure

    def queue_for(self, channel: AbstractChannel) -> str:
        """The queue a delivery of ``channel`` came from (its shard): where its copy goes."""
        return self._queue if self._queue_of is None else self._queue_of(channel)

    async def requeue(self, message: DeliveredMessage, wanted: Callable[[], bool]) -> str | None:
        """Publish a copy back to the queue it came from (its shard, through the default
        exchange); None once routed and confirmed, else why not."""
        headers = _origin(message)
        headers.pop(DELIVERY_COUNT_HEADER, None)
        retries = headers.get(RETRIES_HEADER, 0)
        headers[RETRIES_HEADER] = (retries if isinstance(retries, int) else 0) + 1
        return await self._publisher.publish(
            message.body,
            copy_properties(message.header.properties, headers),
            exchange="",
            routing_key=self.queue_for(message.channel),
            wanted=wanted,
        )


@contextlib.contextmanager
def dead_letter_span(
    exchange: str, message: DeliveredMessage, reason: str
) -> Iterator[trace.Span | None]:
    """The PRODUCER span of one dead-letter publish (tracing on), with the reason: a child of
    the flush span when the database refused the row, else of the message's own trace context
    (an invalid message, dead-lettered on arrival), or a new root without one."""
    if not tracing.active():
        yield None
        return
    import opentelemetry.trace as trace

    parent = None
    if not trace.get_current_span().is_recording():
        headers = message.header.properties.headers
        span_context = tracing.span_context_of(headers)
        if span_context is not None:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(span_context))
    with tracing.tracer().start_as_current_span(
        f"publish {exchange}",
        context=parent,
        kind=trace.SpanKind.PRODUCER,
        attributes={
            "messaging.system": "rabbitmq",
            "messaging.operation.type": "send",
            "messaging.operation.name": "dead-letter",
            "messaging.destination.name": exchange,
            "bulk_recorder.dead_letter.reason": reason[:500],
        },
    ) as span:
        yield span


def _origin(message: DeliveredMessage) -> dict[str, Any]:
    """The message's headers, with where it was first published (a copy we republished to the
    queue arrives through the default exchange but keeps its first origin)."""
    headers: dict[str, Any] = dict(message.header.properties.headers or {})
    headers.setdefault(ORIGINAL_EXCHANGE_HEADER, message.exchange or "")
    headers.setdefault(ORIGINAL_ROUTING_KEY_HEADER, message.routing_key or "")
    return headers


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else ""


class AmqpDelivery:
    """One delivery, bound to the channel that delivered it."""

    __slots__ = ("_channel", "_dead_letterer", "_message", "delivery_count", "received", "tag")

    def __init__(
        self, channel: AbstractChannel, message: DeliveredMessage, dead_letterer: DeadLetterer
    ) -> None:
        self._channel = channel
        self._message = message
        self._dead_letterer = dead_letterer
        self.received = monotonic()  # its hold, receipt to settle, is measured from here
        self.tag: int = message.delivery_tag or 0
        headers = message.header.properties.headers
        count = headers.get(DELIVERY_COUNT_HEADER, 0) if headers else 0
        self.delivery_count: int = count if isinstance(count, int) else 0

    @property
    def channel(self) -> AbstractChannel:
        return self._channel

    @property
    def trace_headers(self) -> dict[str, Any] | None:
        """The message's headers, where a flush span finds its trace context (never checked
        here: any type may be there)."""
        return self._message.header.properties.headers

    def alive(self) -> bool:
        return not self._channel.is_closed

    def _copy_wanted(self) -> bool:
        """A copy still makes sense: its original can be acked after it, and no shutdown
        stopped new copies (asked again just before the publish)."""
        return not self._channel.is_closed and self._dead_letterer.copying

    async def ack(self) -> bool:
        """Queue one basic.ack for this delivery (never ``multiple``), as :func:`ack_each` does.

        The frame is handed to the connection's writer without waiting for it to be written.
        If the connection dies before that, the broker redelivers the message and the
        idempotent insert absorbs it.
        """
        return await self._ack()

    async def _ack(self) -> bool:
        """The ack after a published copy (a dead letter, a release): not a committed row."""
        return await write_acks(self._channel, [self.tag])

    async def reject(self) -> bool:
        if self._channel.is_closed:
            return False
        return await _sent(self._channel.basic_reject(self.tag, requeue=True))

    async def release(self) -> bool:
        """A copy back to the queue, confirmed, then an ack: no delivery spent. If the broker
        refuses the copy, a nack with requeue, which spends one."""
        dead_letterer = self._dead_letterer
        if not self._copy_wanted():
            return False  # the broker returns it with its channel
        with dead_letterer.copy_under_way():
            failure = await dead_letterer.requeue(self._message, self._copy_wanted)
            if failure is None:
                # if this ack is lost with the channel, the original comes back as well as the
                # copy: the idempotent insert (or the at-least-once DLQ) absorbs the second one
                return await self._ack()
            if not self._copy_wanted():
                return False  # the broker returns it with its channel anyway
            log.warning("republishing a released delivery failed (%s): nacking it instead", failure)
            return await _sent(self._channel.basic_nack(self.tag, requeue=True))

    async def dead_letter(self, reason: str) -> DeadLetterResult:
        dead_letterer = self._dead_letterer
        loop = asyncio.get_running_loop()
        deadline = loop.time() + dead_letterer.hold_s
        attempt = 0
        while self._copy_wanted():
            with dead_letterer.copy_under_way():
                failure = await dead_letterer.dead_letter(self._message, reason, self._copy_wanted)
                if failure is None:
                    if await self._ack():
                        return DeadLetterResult.DEAD_LETTERED
                    return DeadLetterResult.DROPPED
            if not self._copy_wanted():
                break
            left = deadline - loop.time()
            if attempt == 0:
                log.warning("dead-letter publish failed (%s): holding the message", failure)
            else:
                log.debug("dead-letter publish failed again (%s)", failure)
            if left <= 0 or not await dead_letterer.pause(
                min(left, dead_letterer.backoff.delay(attempt))
            ):
                break
            attempt += 1
        if not self._copy_wanted():
            return DeadLetterResult.DROPPED  # the broker returns it with its channel
        log.warning("the DLQ still refuses a message: releasing it for a later retry")
        if await self.release():
            return DeadLetterResult.RELEASED
        return DeadLetterResult.DROPPED


async def _sent(frame: Awaitable[object]) -> bool:
    """Await one reject or nack frame: False if its channel or connection went away."""
    try:
        await frame
    except CHANNEL_GONE:
        return False
    except asyncio.CancelledError:  # the frame's drain future of a connection given up
        if cancel_requested():
            raise
        return False
    return True


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
        if await write_acks(channel, tags):
            acked += len(tags)
    return acked
