"""The recorder's lifecycle: connect, consume, collect, flush, pause on outages, shut down in order.

One aio-pika connection (:class:`consumer.consuming.Consuming`, re-established after any loss)
carries the consumer channel; it never publishes, so a broker alarm never blocks its acks.
Dead letters and released deliveries are published on a second
connection (:class:`consumer.copy_publisher.CopyPublisher`). Every delivery is decoded at once: an
invalid one is dead-lettered with its reason and acked; a valid one goes into the single shared
:class:`BulkCollector`. Finished batches are written by the ``RABBITMQ_NUMBERS_OF_WORKERS``
flush workers of the :class:`FlushPool`, each with its own database connection; a long database
outage pauses intake (:class:`IntakePause`).

Every long-lived task (the broker loop, the publisher, the queue watch, the flush workers of
the :class:`FlushPool`, the :class:`IntakePause`) outlives any failure of the broker it waits
on, including the ``CancelledError`` that aiormq sets on every pending future of a connection
it gives up; only a real cancellation (shutdown) ends them. Each runs under one
:class:`Supervisor`: a task that ends anyway is logged and started again with a growing
backoff, and ``ready()`` is False, naming it, while it is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from functools import partial

import asyncpg
from aiormq.abc import AbstractChannel, DeliveredMessage

from bulk_recorder.infra.backoff import Backoff
from bulk_recorder.infra.broker import (
    BrokerNodes,
)
from bulk_recorder.infra.db import open_pool_when_ready
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.infra.stop_budget import CLOSE_OK_S, Deadline, stop_budget
from bulk_recorder.infra.supervisor import Supervisor
from bulk_recorder.recorder.collector import BulkCollector
from bulk_recorder.recorder.flusher import Flusher, Pending, count_dead_letter
from bulk_recorder.recorder.writer import PgWriter, rows_per_insert
from bulk_recorder.records import RecordError, check_content_encoding, decode
from consumer.consuming import Consuming
from consumer.copy_publisher import CopyPublisher
from consumer.delivery import AmqpDelivery, DeadLetterer, ack_each, dead_letter_class
from consumer.flush_pool import WORKER, FlushPool
from consumer.health import HealthServer
from consumer.intake import TASK as PAUSE
from consumer.intake import IntakePause
from consumer.queue_watch import QueueWatch, Shards
from consumer.topology import Topology
from settings import Settings

log = logging.getLogger(__name__)


class Recorder:
    """The bulk recorder service. ``run(stop)`` returns after an orderly shutdown."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics(role="recorder")
        self.topology = Topology.from_settings(settings)
        # the two numbers `bulk-recorder tune` weighs the measured holds and attempts against
        self.metrics.delivery_limit.set(settings.rabbitmq_delivery_limit)
        self.metrics.release_after.set(settings.bulk_recorder_release_after_s)
        self._tasks = Supervisor()
        self._flush_pool = FlushPool(
            self.metrics, self._tasks, settings.rabbitmq_numbers_of_workers
        )
        self._intake = IntakePause(self, self._tasks)
        self._collector: BulkCollector[Pending] = BulkCollector(
            settings.effective_batch_size, settings.flush_timeout_s, self._flush_pool.enqueue
        )
        self._pool: asyncpg.Pool | None = None
        self._writer: PgWriter | None = None
        self._flusher: Flusher | None = None
        self._publisher = CopyPublisher(
            settings.rabbitmq_url,
            self.topology,
            confirm_timeout_s=settings.bulk_recorder_confirm_timeout_s,
        )
        self._dead_letterer = DeadLetterer(
            self._publisher,
            dead_letter_exchange=self.topology.dead_letter_exchange,
            queue=self.topology.queue,
            hold_s=settings.bulk_recorder_release_after_s,
            queue_of=lambda channel: self._consuming.queue_of(channel),  # a release: its shard
        )
        # dead letters of invalid messages still being settled (held while the DLQ refuses)
        self._settling: set[asyncio.Future[None]] = set()
        self._consuming = Consuming(
            BrokerNodes.from_setting(settings.rabbitmq_url),  # one URL, or one per node
            self.topology,
            self.metrics,
            prefetch=settings.channel_prefetch,
            on_message=self._on_message,
            paused=lambda: self._intake.paused,
            drop_channel=self._drop_channel,
            shards_consumed=settings.shards_consumed,
        )
        self._db_ok = False
        self._stopping = False
        self.stop_budget = stop_budget("consume", settings)
        self.health: HealthServer | None = None
        self.queue_watch = QueueWatch(
            self.metrics,
            self.topology.queue,
            lambda: self._consuming.connection,
            dlq=self.topology.dead_letter_queue,
            shards=Shards(self.topology, self._consuming.wanted, self._consuming.reconcile),
        )

    # -- readiness ------------------------------------------------------------------------

    def ready(self) -> tuple[bool, str]:
        database = "up" if self._db_ok else "down"
        detail = f"broker {self._consuming.status()}, database {database}"
        pool = self._flush_pool
        alive, restarts = pool.alive(), pool.restarts()
        workers_ok = pool.started and alive == pool.size
        # Before the database is first reached no worker exists yet: "database down" says why.
        if pool.started and (not workers_ok or restarts):
            detail += f", flush workers {alive}/{pool.size} alive"
            if restarts:
                detail += f" ({restarts} restarted)"
        down = [name for name in self._tasks.down() if not name.startswith(WORKER)]
        if down:
            detail += ", " + ", ".join(f"{name} down" for name in down)
        return self._consuming.ready() and self._db_ok and workers_ok and not down, detail

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
        if s.rabbitmq_queue_shards > 1 or s.shards_consumed:
            log.info(
                "queue shards: %d (%s), consuming %s and any leftover shard past them",
                s.rabbitmq_queue_shards,
                ", ".join(self.topology.shard_queues()),
                ", ".join(self._consuming.routed_queues()) or "none of them",
            )
        log.info("%s", self.stop_budget.describe())

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        self.log_configuration()
        if s.metrics_port:
            self.health = HealthServer(
                self.metrics.registry, self.ready, s.metrics_host, s.metrics_port
            )
            await self.health.start()
        tasks = self._tasks
        tasks.stop_on(stop)
        publisher_stop = asyncio.Event()
        tasks.start("publisher", partial(self._publisher.run, publisher_stop))
        watch_stop = asyncio.Event()
        tasks.start("queue-watch", partial(self.queue_watch.run, watch_stop))
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
                queue=s.rabbitmq_queue,
            )
            self._flush_pool.start(self._flusher)
            tasks.start("broker-loop", partial(self._consuming.run, stop))
            await stop.wait()
        finally:
            deadline = self.stop_budget.deadline()  # from the signal (or the failure) on
            deadline.start()
            tasks.close()
            watch_stop.set()
            await tasks.cancel("queue-watch", within_s=deadline.left_for("flush"))
            await self._shutdown(deadline)
            await self._close(publisher_stop, deadline)
        if self._consuming.mismatch is not None:
            raise self._consuming.mismatch

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

    def _drop_channel(self, channel: AbstractChannel) -> None:
        """Forget a dead channel's deliveries, buffered or in batches that wait for a worker:
        their tags cannot be acked elsewhere, and the broker redelivers them to the next
        channel. Left queued, each reconnect during a database outage would add a prefetch
        window to the queue (batches a worker already holds are settled by it as dropped)."""

        def dead(p: Pending) -> bool:
            return getattr(p.delivery, "channel", None) is channel

        dropped = len(self._collector.drop(dead)) + self._flush_pool.drop(dead)
        self.metrics.held.forget_dead()
        if dropped:
            self.metrics.messages_dropped.inc(dropped)
            self.metrics.buffer_messages.dec(dropped)
            log.info("dropped %d held deliveries of the closed channel", dropped)

    # -- outages (the flusher's callbacks, and the Intake the pause works through) ----------

    def _on_outage(self, down: bool) -> None:
        self._db_ok = not down

    async def _on_release(self) -> None:
        """A batch was released after a long outage: pause intake until the database is back."""
        if not self._stopping:
            self._intake.pause()

    async def stop_consuming(self) -> None:
        await self._consuming.stop()

    async def start_consuming(self) -> None:
        await self._consuming.start()

    def take_held(self) -> list[Pending]:
        return self._collector.drop(lambda p: True) + self._flush_pool.take_all()

    async def release(self, held: list[Pending]) -> None:
        await self._flush_pool.release(held)

    async def probe(self) -> None:
        assert self._writer is not None
        await self._writer.probe()

    def recovered(self) -> None:
        assert self._flusher is not None
        self._flusher.recovered()

    # -- the hot path -----------------------------------------------------------------------

    def _on_message(self, message: DeliveredMessage) -> None:
        """One delivery, in the channel's reader (no task of its own: consuming.OnMessage)."""
        metrics = self.metrics
        metrics.messages_received.inc()
        metrics.buffer_messages.inc()
        delivery = AmqpDelivery(message.channel, message, self._dead_letterer)
        metrics.held.add(delivery)
        properties = message.header.properties
        try:
            if properties.content_encoding:  # a body we would have to decode first: refused
                check_content_encoding(properties.content_encoding)
            record = decode(
                message.body,
                properties.message_type,
                max_bytes=self.settings.bulk_recorder_max_message_bytes,
            )
        except RecordError as exc:
            self._dead_letter_invalid(delivery, exc.reason)
            return
        self._collector.add(Pending(record, delivery))

    def _dead_letter_invalid(self, delivery: AmqpDelivery, reason: str) -> None:
        log.info("dead-lettering an invalid message: %s", reason)
        # A task of its own, with its accounting: it may be held while the DLQ refuses, and the
        # reader must go on delivering. Not one of the channel's tasks, so its close does not
        # cancel it, and the outcome lands in exactly one counter. Tracked, so that a shutdown
        # waits for the ones still held.
        settle = asyncio.ensure_future(self._settle_invalid(delivery, reason))
        self._settling.add(settle)
        settle.add_done_callback(self._settling.discard)

    async def _settle_invalid(self, delivery: AmqpDelivery, reason: str) -> None:
        try:
            result = await delivery.dead_letter(reason)
        finally:
            self.metrics.buffer_messages.dec()
        count_dead_letter(self.metrics, result, dead_letter_class(reason), delivery)

    # -- shutdown -------------------------------------------------------------------------

    async def _shutdown(self, deadline: Deadline) -> None:
        """Stop intake, flush what is buffered (bounded), settle it.

        A batch that meets an outage now, and a dead letter still held, are released at once
        (republished, then acked) rather than left to the channel's close, which would spend
        one of their deliveries. Past the flush's share of the budget no new copy starts, and
        the copies under way are confirmed and their originals acked before the consuming
        channel closes (see :meth:`_finish_copies`), within the copies' share.
        """
        self._stopping = True
        self._intake.close()
        with contextlib.suppress(TimeoutError):  # a held broker may never answer the cancel
            async with asyncio.timeout(deadline.left_for("flush")):
                await self._consuming.stop(for_good=True)
        self._collector.flush("shutdown")
        self._dead_letterer.stop_holding()
        if self._flusher is not None:
            self._flusher.stop_retrying()
        await self._flush_pool.drain(deadline.left_for("flush"))
        held = set(self._settling)
        if self._flusher is not None:
            held.add(asyncio.ensure_future(self._flusher.wait_held()))
        left = deadline.left_for("flush")
        _, pending = await asyncio.wait(held, timeout=left) if held else (set(), set())
        await self._finish_copies(deadline)
        if pending:
            log.warning("held dead letters not settled in time; the broker redelivers them")
            for fut in pending:
                fut.cancel()
            await asyncio.wait(pending, timeout=deadline.left())

    async def _close(self, publisher_stop: asyncio.Event, deadline: Deadline) -> None:
        """Close in order, each step within what is left of the stop budget: the flush
        workers, the consuming connection, the publishing connection last, then the pool."""
        await self._flush_pool.stop(within_s=deadline.left_for("copies"))
        await self._tasks.cancel(PAUSE, within_s=deadline.left_for("copies"))
        self._collector.close()
        await self._consuming.close(deadline, then_s=CLOSE_OK_S)  # the publisher's close after
        publisher_stop.set()
        publishers = self._tasks.tasks("publisher")
        left = deadline.left(CLOSE_OK_S)  # its close, once cancelled, may take that much more
        done, _ = await asyncio.wait(publishers, timeout=left) if publishers else ((), ())
        for publisher in done:
            if not publisher.cancelled() and publisher.exception() is not None:
                # the publisher's own end: a surprise there must not stop the rest
                log.error(
                    "the publishing connection did not close cleanly: %r", publisher.exception()
                )
        # the broker loop ended on stop; nothing else is left (a publisher still closing ends)
        await self._tasks.cancel(within_s=deadline.left())
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), deadline.left())
            except TimeoutError:
                self._pool.terminate()
        if self.health is not None:
            await self.health.stop()
        log.info("recorder stopped in %.1f s", deadline.elapsed())

    async def _finish_copies(self, deadline: Deadline) -> None:
        """No new copy (release or dead letter) from now on: a delivery not yet copied stays
        unacked and the channel's close returns it, judged by nothing. A copy already published
        is a second one in the queue until its original is acked: wait for those (bounded)."""
        dead_letterer = self._dead_letterer
        dead_letterer.stop_copying()
        wait_s = min(self.stop_budget.step("copies"), deadline.left_for("copies"))
        if dead_letterer.copies_under_way:
            log.info(
                "waiting for %d published copies under way (confirm, then the original's ack)",
                dead_letterer.copies_under_way,
            )
        under_way = await dead_letterer.copies_settled(wait_s)
        if under_way:
            log.warning(
                "%d published copies not confirmed within %.0f s: their messages may be in "
                "the queue twice (the idempotent insert absorbs it)",
                under_way,
                wait_s,
            )
