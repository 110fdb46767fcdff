"""What the recorder sees of its queue, for alerts that tell "nothing is consuming" from
"nothing is arriving".

Every ``interval_s`` a :class:`QueueWatch` passively declares the queue on a channel of its own
(on the recorder's current connection) and exports the messages ready in it and the consumers
attached to it (all recorders'), and moves ``last_delivery_timestamp_seconds`` to now when the
recorder's received counter moved since the last look. That costs the hot path nothing: the
delivery callback only counts, as it already did.

The same look reads the dead-letter queue (``<queue>.dlq``): ``bulk_recorder_dlq_messages`` is
every message waiting there, whoever put it there. The recorder's own dead letters are counted
by ``messages_dead_lettered_total{reason}``; those the broker dead-letters past
``x-delivery-limit`` are told to no consumer, so no counter can count them: a DLQ that grows
by more than the recorder dead-lettered over the same minutes (the dashboard draws the
difference) is the broker's, and ``bulk-recorder dlq inspect`` shows them as
``broker: delivery_limit``. A replay or a discard meanwhile lowers the depth, so that
difference is a lower bound, never a count.

So: messages ready and no consumer attached, or messages ready and no delivery for minutes,
is "nothing is consuming"; an empty queue while the outbox holds rows is "nothing is arriving"
(the relay's side).

A look that finds the queue deleted exports 0 and 0: nothing waits in it and nothing consumes
it (the relay's publishes come back unroutable meanwhile, which its own alerts see). A DLQ that
does not exist reads 0. A look that cannot be made (the recorder not connected, the broker
failing the declare) exports NaN for all three: unknown, never the last count. A kept count of
1 consumer would hide, in the alerts' ``max by (namespace)`` over all recorders, that none is
attached; ``max()`` skips NaN while another recorder knows, and a comparison with NaN is never
true.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aio_pika
import aiormq

from bulk_recorder.infra.broker import cancel_requested
from bulk_recorder.infra.errors import BROKER_ERRORS
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.infra.waits import wait_or_stop

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0
UNKNOWN = float("nan")
_DECLARE_TIMEOUT_S = 10.0

ConnectionGetter = Callable[[], aio_pika.abc.AbstractConnection | None]


class QueueWatch:
    """Looks at ``queue`` every ``interval_s`` through the connection ``connection()`` gives."""

    def __init__(
        self,
        metrics: Metrics,
        queue: str,
        connection: ConnectionGetter,
        *,
        dlq: str | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        self.metrics = metrics
        self.queue = queue
        self.dlq = dlq if dlq is not None else f"{queue}.dlq"
        self._connection = connection
        self.interval_s = interval_s
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._channel_of: aio_pika.abc.AbstractConnection | None = None
        self._received = self._received_total()

    def _received_total(self) -> float:
        value = self.metrics.registry.get_sample_value("bulk_recorder_messages_received_total")
        return value or 0.0

    async def run(self, stop: asyncio.Event) -> None:
        self.metrics.last_delivery.set_to_current_time()  # "never" reads as "since start"
        while not stop.is_set():
            self.note_deliveries()
            try:
                await self.look()
            except BROKER_ERRORS as exc:
                log.debug("queue %s not looked at: %r", self.queue, exc)
                self._channel = None
                self._export(UNKNOWN, UNKNOWN, UNKNOWN)
            except asyncio.CancelledError:
                if cancel_requested():
                    raise
                self._channel = None  # aiormq gave up on the connection under us
                self._export(UNKNOWN, UNKNOWN, UNKNOWN)
            except Exception:  # stale gauges would hide a stuck queue: log, keep going
                log.exception("looking at queue %s failed unexpectedly", self.queue)
                self._channel = None
                self._export(UNKNOWN, UNKNOWN, UNKNOWN)
            await wait_or_stop(stop, self.interval_s)

    def note_deliveries(self) -> None:
        """Move the last-delivery time to now if a delivery arrived since the last call."""
        received = self._received_total()
        if received != self._received:
            self._received = received
            self.metrics.last_delivery.set_to_current_time()

    def _export(self, messages: float, consumers: float, dead_letters: float) -> None:
        self.metrics.queue_messages.set(messages)
        self.metrics.queue_consumers.set(consumers)
        self.metrics.dlq_messages.set(dead_letters)

    async def look(self) -> bool:
        """Passive declares of the queue and its DLQ; False (and every gauge unknown) when there
        is no connection to look through. A queue that does not exist reads 0 messages, 0
        consumers; a DLQ that does not exist, 0 messages."""
        connection = self._connection()
        if connection is None or connection.is_closed:
            self._export(UNKNOWN, UNKNOWN, UNKNOWN)
            return False
        messages, consumers = await self._count(connection, self.queue)
        dead_letters, _ = await self._count(connection, self.dlq)
        self._export(messages, consumers, dead_letters)
        return True

    async def _count(
        self, connection: aio_pika.abc.AbstractConnection, name: str
    ) -> tuple[int, int]:
        """Messages ready in queue ``name`` and consumers attached to it; 0 and 0 if it is gone."""
        channel = self._channel
        if channel is None or channel.is_closed or self._channel_of is not connection:
            channel = await asyncio.wait_for(connection.channel(), _DECLARE_TIMEOUT_S)
            self._channel, self._channel_of = channel, connection
        try:
            queue = await asyncio.wait_for(
                channel.declare_queue(name, passive=True), _DECLARE_TIMEOUT_S
            )
        except aiormq.exceptions.ChannelNotFoundEntity:
            self._channel = None  # the broker closed it with its answer: the queue is gone
            return 0, 0
        declared = queue.declaration_result
        return declared.message_count or 0, declared.consumer_count or 0
