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

With queue shards (:class:`Shards`) the look reads every shard the recorder consumes, 1 to N and
the leftovers past N that still exist (probed N+1, N+2, ... up to the first missing one; past
those it knows, every :data:`PROBE_NEW_EVERY` looks, since a missing queue costs an error line
in the broker's log): ``bulk_recorder_queue_messages`` is their ready messages summed,
``bulk_recorder_queue_consumers`` the fewest consumers on a routed shard (0 when one routed
shard has none), and ``bulk_recorder_shard_messages{queue}`` and
``bulk_recorder_shard_consumers{queue}`` each shard's own. The leftovers found, with their
ready messages, go to :meth:`consumer.consuming.Consuming.reconcile`, which consumes new ones
and lets go of empty ones. With one shard and no leftover, the figures are the one queue's.

The routed shards a look finds gone go there too, with the connection it looked through: a
queue deleted under the recorder is normally told by the broker (Basic.Cancel), but RabbitMQ
3.10 once lost that notice on the cluster rig (its channel still held the consumer of a quorum
queue that was gone), and the recorder would have waited for deliveries that could not come.
The look is the second path: a routed shard this recorder holds a consumer on, gone, makes it
declare the topology again, as a cancel would, within one period.

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
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import aio_pika
import aiormq

from bulk_recorder.infra.broker import cancel_requested
from bulk_recorder.infra.errors import BROKER_ERRORS
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.infra.waits import wait_or_stop
from consumer.queue_count import QueueCount, timed_count
from consumer.topology import Topology

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0
UNKNOWN = float("nan")
_DECLARE_TIMEOUT_S = 10.0

ConnectionGetter = Callable[[], aio_pika.abc.AbstractConnection | None]
# Past the leftover shards it knows, the watch probes for a new one every this many looks (30 s):
# the probe of a queue that does not exist is an error line in the broker's log.
PROBE_NEW_EVERY = 6


@dataclass(frozen=True, slots=True)
class Shards:
    """The recorder's shards: the topology, which numbers it consumes, and where the leftover
    shards found (number -> messages ready) are reported."""

    topology: Topology
    wanted: Callable[[int], bool]
    # (leftovers found: number -> messages ready, None when its leader gave no count;
    # routed shards found gone; the connection the look went through)
    reconcile: Callable[
        [Mapping[int, int | None], frozenset[str], aio_pika.abc.AbstractConnection],
        Awaitable[None],
    ]


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
        shards: Shards | None = None,
    ) -> None:
        self.metrics = metrics
        self.queue = queue
        self.dlq = dlq if dlq is not None else f"{queue}.dlq"
        self._connection = connection
        self.interval_s = interval_s
        self.shards = shards
        self._shard_labels: set[str] = set()  # the queues of the per-shard gauges
        self._leftovers_known: set[int] = set()  # leftover shards that existed at the last look
        self._looks = 0
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
                self._unknown()
            except asyncio.CancelledError:
                if cancel_requested():
                    raise
                self._channel = None  # aiormq gave up on the connection under us
                self._unknown()
            except Exception:  # stale gauges would hide a stuck queue: log, keep going
                log.exception("looking at queue %s failed unexpectedly", self.queue)
                self._channel = None
                self._unknown()
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

    def _unknown(self) -> None:
        """No look made: every gauge unknown, every shard's too. (A look that got no count of
        one shard leaves the others' counts: only that one's, and the sum, are unknown.)"""
        self._export(UNKNOWN, UNKNOWN, UNKNOWN)
        for queue in self._shard_labels:
            self.metrics.shard_messages.labels(queue=queue).set(UNKNOWN)
            self.metrics.shard_consumers.labels(queue=queue).set(UNKNOWN)

    def _export_shards(self, counts: Mapping[str, tuple[float, float]]) -> None:
        for queue in self._shard_labels - counts.keys():  # pruned since the last look
            self.metrics.shard_messages.remove(queue)
            self.metrics.shard_consumers.remove(queue)
        for queue, (messages, consumers) in counts.items():
            self.metrics.shard_messages.labels(queue=queue).set(messages)
            self.metrics.shard_consumers.labels(queue=queue).set(consumers)
        self._shard_labels = set(counts)

    async def look(self) -> bool:
        """Passive declares of the queue and its DLQ; False (and every gauge unknown) when there
        is no connection to look through. A queue that does not exist reads 0 messages, 0
        consumers; a DLQ that does not exist, 0 messages."""
        connection = self._connection()
        if connection is None or connection.is_closed:
            self._unknown()
            return False
        if self.shards is None:
            messages, consumers = await self._count(connection, self.queue)
        else:
            messages, consumers = await self._look_at_shards(connection, self.shards)
        dead_letters, _ = await self._count(connection, self.dlq)
        self._export(messages, consumers, dead_letters)
        return True

    async def _look_at_shards(
        self, connection: aio_pika.abc.AbstractConnection, shards: Shards
    ) -> tuple[float, float]:
        """Every shard consumed, routed ones first, then the leftovers that exist; the sum of
        their ready messages and the fewest consumers on a routed one."""
        topology = shards.topology
        counts: dict[str, tuple[float, float]] = {}
        routed = [k for k in range(1, topology.shards + 1) if shards.wanted(k)]
        gone: set[str] = set()
        for number in routed:
            found = await self._probe(connection, topology.shard_queue(number))
            counts[topology.shard_queue(number)] = _gauges(found)
            if found is None:
                gone.add(topology.shard_queue(number))
        leftovers: dict[int, int | None] = {}
        present: set[int] = set()
        probe_new = self._looks % PROBE_NEW_EVERY == 0
        self._looks += 1
        for number in topology.leftover_numbers():
            if number not in self._leftovers_known and not probe_new:
                break
            found = await self._probe(connection, topology.shard_queue(number))
            if found is None:
                break
            present.add(number)
            if shards.wanted(number):
                leftovers[number] = found.reading()
                counts[topology.shard_queue(number)] = _gauges(found)
        self._leftovers_known = present
        await shards.reconcile(leftovers, frozenset(gone), connection)
        self._export_shards(counts if topology.shards > 1 or leftovers else {})
        messages = sum(ready for ready, _ in counts.values())
        on_routed = [counts[topology.shard_queue(k)][1] for k in routed]
        if any(c != c for c in on_routed):  # min() over a NaN depends on the order
            return messages, UNKNOWN
        return messages, min(on_routed, default=0)

    async def _count(
        self, connection: aio_pika.abc.AbstractConnection, name: str
    ) -> tuple[float, float]:
        """Messages ready in queue ``name`` and consumers attached to it; 0 and 0 if it is gone,
        unknown if its leader gave no count."""
        return _gauges(await self._probe(connection, name))

    async def _probe(
        self, connection: aio_pika.abc.AbstractConnection, name: str
    ) -> QueueCount | None:
        """Messages ready in queue ``name`` and consumers attached to it; None if it is gone."""
        channel = self._channel
        if channel is None or channel.is_closed or self._channel_of is not connection:
            channel = await asyncio.wait_for(connection.channel(), _DECLARE_TIMEOUT_S)
            self._channel, self._channel_of = channel, connection
        looking = channel

        async def declare() -> aiormq.spec.Queue.DeclareOk:
            queue = await looking.declare_queue(name, passive=True)
            return queue.declaration_result

        try:
            return await asyncio.wait_for(timed_count(declare), _DECLARE_TIMEOUT_S)
        except aiormq.exceptions.ChannelNotFoundEntity:
            self._channel = None  # the broker closed it with its answer: the queue is gone
            return None


def _gauges(found: QueueCount | None) -> tuple[float, float]:
    """A queue's two gauges: 0 and 0 when it is gone, unknown when its leader gave no count."""
    if found is None:
        return 0, 0
    if not found.counted:
        return UNKNOWN, UNKNOWN
    return found.ready, found.consumers
