"""The recorder's lifecycle: connect, consume, collect, flush, pause on outages, shut down in order.

One aio-pika connection (re-established by :meth:`Recorder._broker_loop` after any loss) carries
the consumer channel with QoS ``settings.channel_prefetch``; it never publishes, so a broker
alarm never blocks its acks. Dead letters and released deliveries are published on a second
connection (:class:`consumer.publisher.Publisher`). Every delivery is decoded at once: an
invalid one is dead-lettered with its reason and acked; a valid one goes into the single shared
:class:`BulkCollector`. Finished batches are written by ``RABBITMQ_NUMBERS_OF_WORKERS`` flush
workers, each with its own database connection.

When the broker cancels the consumer (Basic.Cancel: its queue was deleted), the recorder is not
ready at once and goes round the broker loop: its channel and deliveries dropped, a new
connection, the topology declared again with the contract's arguments, then consume.

Every long-lived task (the broker loop, the flush workers, the pause task) outlives any failure
of the broker it waits on, including the ``CancelledError`` that aiormq sets on every pending
future of a connection it gives up; only a real cancellation (shutdown) ends them. A flush
worker that ends anyway is logged and replaced, and ``ready()`` is False while one is missing.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aio_pika
import asyncpg
from aiormq.abc import AbstractChannel, DeliveredMessage
from pamqp import commands as spec

from bulk_recorder.infra.aiormq_internals import close_connection, unblock_writers
from bulk_recorder.infra.backoff import RETRY, Backoff
from bulk_recorder.infra.broker import (
    BrokerNodes,
    TopologyMismatch,
    broker_failures_suppressed,
)
from bulk_recorder.infra.db import open_pool_when_ready
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.infra.reconnect import Session, keep_connected
from bulk_recorder.recorder.collector import BulkCollector
from bulk_recorder.recorder.flusher import Flusher, Pending, count_dead_letter
from bulk_recorder.recorder.writer import PgWriter, rows_per_insert
from bulk_recorder.records import RecordError, decode
from consumer.delivery import AmqpDelivery, DeadLetterer, ack_each, dead_letter_class
from consumer.health import HealthServer
from consumer.publisher import Publisher
from consumer.queue_watch import QueueWatch
from consumer.topology import Topology, declare_or_mismatch
from consumer.workers import Batch, FlushWorkers
from settings import Settings

log = logging.getLogger(__name__)


class Recorder(FlushWorkers):
    """The bulk recorder service. ``run(stop)`` returns after an orderly shutdown."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.topology = Topology.from_settings(settings)
        self._nodes = BrokerNodes.from_setting(settings.rabbitmq_url)  # one URL, or one a node
        self._batches: asyncio.Queue[Batch] = asyncio.Queue()
        self._collector: BulkCollector[Pending] = BulkCollector(
            settings.effective_batch_size, settings.flush_timeout_s, self._enqueue
        )
        self._pool: asyncpg.Pool | None = None
        self._writer: PgWriter | None = None
        self._flusher: Flusher | None = None
        self._channel: AbstractChannel | None = None
        self._consumer_tag: str | None = None
        self._publisher = Publisher(
            settings.rabbitmq_url,
            self.topology,
            confirm_timeout_s=settings.bulk_recorder_confirm_timeout_s,
        )
        self._dead_letterer = DeadLetterer(
            self._publisher,
            dead_letter_exchange=self.topology.dead_letter_exchange,
            queue=self.topology.queue,
            hold_s=settings.bulk_recorder_release_after_s,
        )
        # dead letters of invalid messages still being settled (held while the DLQ refuses)
        self._settling: set[asyncio.Future[None]] = set()
        self._broker_ok = False
        self._cancelled_note: str | None = None  # why not consuming, until declared again
        self._db_ok = False
        self._intake = asyncio.Event()
        self._intake.set()
        self._stopping = False
        self._pause_task: asyncio.Task[None] | None = None
        self._consume_lock = asyncio.Lock()
        self._connected_before = False
        self._quick_cancels = 0  # consumers the broker cancelled soon after they started, in a row
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._worker_restarts = 0
        self.health: HealthServer | None = None
        self.queue_watch = QueueWatch(self.metrics, self.topology.queue, lambda: self._connection)

    # -- readiness ------------------------------------------------------------------------

    def ready(self) -> tuple[bool, str]:
        broker = "up" if self._broker_ok else "down"
        if self._cancelled_note is not None:
            broker += f" ({self._cancelled_note})"
        database = "up" if self._db_ok else "down"
        detail = f"broker {broker}, database {database}"
        alive = sum(not task.done() for task in self._workers)
        workers_ok = bool(self._workers) and alive == len(self._workers)
        # Before the database is first reached no worker exists yet: "database down" says why.
        if self._workers and (not workers_ok or self._worker_restarts):
            detail += f", flush workers {alive}/{len(self._workers)} alive"
            if self._worker_restarts:
                detail += f" ({self._worker_restarts} restarted)"
        return self._broker_ok and self._db_ok and workers_ok, detail

    # -- lifecycle ------------------------------------------------------------------------

    def log_configuration(self) -> None:
        s = self.settings
        if s.bulk_mode_active:
            log.info("Bulk mode is ACTIVE")
        else:
            log.info(
                "Bulk mode is INACTIVE (%s): one message, one transaction, one ack",
                s.bulk_mode_reason,
            )
        log.info(
            "Bulk mode configured for consumer: size=%d timeout_ms=%d workers=%d prefetch=%d "
            "channel_prefetch=%d rows_per_insert=%d queue=%s",
            s.effective_batch_size,
            s.bulk_recorder_flush_timeout_ms,
            s.rabbitmq_numbers_of_workers,
            s.rabbitmq_numbers_of_prefetch,
            s.channel_prefetch,
            rows_per_insert(9, s.bulk_recorder_max_rows_per_insert),
            s.rabbitmq_queue,
        )

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        self.log_configuration()
        if s.metrics_port:
            self.health = HealthServer(
                self.metrics.registry, self.ready, s.metrics_host, s.metrics_port
            )
            await self.health.start()
        publisher_stop = asyncio.Event()
        publisher = asyncio.create_task(self._publisher.run(publisher_stop), name="publisher")
        watch_stop = asyncio.Event()
        watch = asyncio.create_task(self.queue_watch.run(watch_stop), name="queue-watch")
        try:
            if not await self._connect_database(stop):
                return
            assert self._pool is not None
            self._writer = PgWriter(
                self._pool, max_rows_per_insert=s.bulk_recorder_max_rows_per_insert
            )
            self._flusher = Flusher(
                self._writer,
                self.metrics,
                delivery_limit=s.rabbitmq_delivery_limit,
                release_after_s=s.bulk_recorder_release_after_s,
                backoff=Backoff(),
                on_outage=self._on_outage,
                on_release=self._on_release,
                ack_many=ack_each,
            )
            self._workers = [self._start_worker(i) for i in range(s.rabbitmq_numbers_of_workers)]
            await self._broker_loop(stop)
        finally:
            watch_stop.set()
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            await self._shutdown(publisher, publisher_stop)

    async def _connect_database(self, stop: asyncio.Event) -> bool:
        """Migrate and open the pool, retrying while the database is not there yet."""
        self._pool = await open_pool_when_ready(
            self.settings.database_url,
            max_size=self.settings.rabbitmq_numbers_of_workers + 1,
            stop=stop,
            command_timeout=self.settings.bulk_recorder_db_command_timeout_s,
        )
        self._db_ok = self._pool is not None
        return self._db_ok

    async def _broker_loop(self, stop: asyncio.Event) -> None:
        """Consume until ``stop``, through every loss of the broker; the connection stays open
        at the end for the final flush's acks (``_shutdown`` closes it)."""
        await keep_connected(
            self._nodes,
            Session(self._open, lambda c: self._consume_until_lost(c, stop), self._lost),
            stop,
            what="consumer connection",
            logger=log,
            fatal=(TopologyMismatch,),  # run() ends with it: exit 3
            close_on_stop=False,
        )

    async def _open(self, connection: aio_pika.abc.AbstractConnection) -> None:
        consume_channel = await connection.channel(publisher_confirms=False)
        await consume_channel.set_qos(prefetch_count=self.settings.channel_prefetch)
        await declare_or_mismatch(consume_channel, self.topology)
        self._connection = connection
        self._channel = await consume_channel.get_underlay_channel()
        if self._connected_before:
            self.metrics.broker_reconnects.inc()
        self._connected_before = True
        self._broker_ok = True
        self._cancelled_note = None
        log.info("consuming from %s", self.topology.queue)

    async def _consume_until_lost(
        self, connection: aio_pika.abc.AbstractConnection, stop: asyncio.Event
    ) -> int:
        """The backoff attempt to reconnect with: a broker that keeps cancelling our consumer
        at once is met with a growing backoff, not a busy loop."""
        assert self._channel is not None
        started = time.monotonic()
        if not await self._wait_and_consume(stop, connection, self._channel):
            return 0
        quick = time.monotonic() - started < RETRY.cap_s
        self._quick_cancels = self._quick_cancels + 1 if quick else 0
        return self._quick_cancels

    async def _lost(self, stopping: bool) -> None:
        """Forget the channel's deliveries and close its connection (unless shutting down)."""
        self._broker_ok = False
        channel, connection = self._channel, self._connection
        if channel is None or stopping:
            return
        self._drop_channel(channel)
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
            self._broker_ok = False
            self._cancelled_note = f"consumer of {self.topology.queue} cancelled by the broker"
            if not cancelled.done():
                cancelled.set_result(None)

        channel.on_consumer_cancel_callbacks.add(on_cancel)
        await self._start_consuming()
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

    async def _start_consuming(self) -> None:
        """basic.consume on the current channel, once, and only while intake is allowed."""
        async with self._consume_lock:
            channel = self._channel
            if (
                not self._intake.is_set()
                or self._stopping
                or channel is None
                or channel.is_closed
                or self._consumer_tag is not None
            ):
                return
            ok = await channel.basic_consume(self.topology.queue, self._on_message, no_ack=False)
            self._consumer_tag = ok.consumer_tag

    async def _stop_consuming(self) -> None:
        async with self._consume_lock:
            channel, tag = self._channel, self._consumer_tag
            self._consumer_tag = None
            if channel is not None and tag is not None and not channel.is_closed:
                with broker_failures_suppressed():
                    await channel.basic_cancel(tag)

    # -- the hot path -----------------------------------------------------------------------

    async def _on_message(self, message: DeliveredMessage) -> None:
        metrics = self.metrics
        metrics.messages_received.inc()
        metrics.buffer_messages.inc()
        delivery = AmqpDelivery(message.channel, message, self._dead_letterer)
        try:
            record = decode(
                message.body,
                message.header.properties.message_type,
                max_bytes=self.settings.bulk_recorder_max_message_bytes,
            )
        except RecordError as exc:
            await self._dead_letter_invalid(delivery, exc.reason)
            return
        self._collector.add(Pending(record, delivery))

    async def _dead_letter_invalid(self, delivery: AmqpDelivery, reason: str) -> None:
        log.info("dead-lettering an invalid message: %s", reason)
        # Shielded with its accounting: aiormq cancels this consumer task when the channel
        # closes, and the outcome must still land in exactly one counter. Tracked, so that a
        # shutdown waits for the ones still held.
        settle = asyncio.ensure_future(self._settle_invalid(delivery, reason))
        self._settling.add(settle)
        settle.add_done_callback(self._settling.discard)
        await asyncio.shield(settle)

    async def _settle_invalid(self, delivery: AmqpDelivery, reason: str) -> None:
        try:
            result = await delivery.dead_letter(reason)
        finally:
            self.metrics.buffer_messages.dec()
        count_dead_letter(self.metrics, result, dead_letter_class(reason))

    # -- shutdown -------------------------------------------------------------------------

    async def _shutdown(self, publisher: asyncio.Task[None], publisher_stop: asyncio.Event) -> None:
        """Stop intake, flush what is buffered (bounded), settle it, then close in order.

        A batch that meets an outage now, and a dead letter still held, are released at once
        (republished, then acked) rather than left to the channel's close, which would spend
        one of their deliveries. The publishing connection closes last.
        """
        self._stopping = True
        workers = self._workers
        started = time.monotonic()
        await self._stop_consuming()
        self._collector.flush("shutdown")
        self._dead_letterer.stop_holding()
        if self._flusher is not None:
            self._flusher.stop_retrying()
        timeout = self.settings.bulk_recorder_shutdown_timeout_s
        if workers:
            try:
                await asyncio.wait_for(self._batches.join(), timeout)
            except TimeoutError:
                log.warning(
                    "final flush did not finish in time; unacked messages will be redelivered"
                )
        held = set(self._settling)
        if self._flusher is not None:
            held.add(asyncio.ensure_future(self._flusher.wait_held()))
        left = max(1.0, timeout - (time.monotonic() - started))
        _, pending = await asyncio.wait(held, timeout=left) if held else (set(), set())
        if pending:
            log.warning("held dead letters not settled in time; the broker redelivers them")
            for fut in pending:
                fut.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if self._pause_task is not None:
            self._pause_task.cancel()
            await asyncio.gather(self._pause_task, return_exceptions=True)
        self._collector.close()
        connection = self._connection
        if connection is not None:
            with broker_failures_suppressed():
                await close_connection(connection, 10)
        publisher_stop.set()
        try:
            await asyncio.wait_for(publisher, 15)
        except Exception:  # the publisher's own end: a surprise there must not stop the rest
            log.exception("the publishing connection did not close cleanly")
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), 10)
            except TimeoutError:
                self._pool.terminate()
        if self.health is not None:
            await self.health.stop()
        log.info("recorder stopped in %.1f s", time.monotonic() - started)
