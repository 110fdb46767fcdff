"""The recorder's flush workers, what it holds, and its pause during a long database outage.

Batches the collector closes wait in one queue; ``settings.rabbitmq_numbers_of_workers`` workers
each take one at a time and hand it to the :class:`Flusher`. A worker that ends outside shutdown
is logged and replaced after ``WORKER_RESTART_DELAY_S``. A batch released after a long outage
pauses intake: what is held goes back to the broker and intake resumes once a probe write
succeeds. A dead channel's deliveries, buffered or queued, are forgotten (the broker redelivers
them).

:class:`FlushWorkers` is a part of :class:`consumer.app.Recorder`, kept in a module of its own;
the attributes it declares are the Recorder's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

from aiormq.abc import AbstractChannel

from bulk_recorder.infra.backoff import Backoff
from bulk_recorder.infra.broker import broker_failures_suppressed, cancel_requested
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.recorder.collector import BulkCollector
from bulk_recorder.recorder.flusher import Flusher, Pending, release_all
from bulk_recorder.recorder.writer import PgWriter

log = logging.getLogger("consumer.app")  # the name these lines have always been logged under

Batch = tuple[list[Pending], str]

# A flush worker that ended is replaced after this long (no busy loop if one keeps dying).
WORKER_RESTART_DELAY_S = 1.0


class FlushWorkers:
    """The Recorder's batch queue, its flush workers, and the outage pause."""

    metrics: Metrics
    _batches: asyncio.Queue[Batch]
    _collector: BulkCollector[Pending]
    _writer: PgWriter | None
    _flusher: Flusher | None
    _workers: list[asyncio.Task[None]]
    _worker_restarts: int
    _stopping: bool
    _db_ok: bool
    _intake: asyncio.Event
    _pause_task: asyncio.Task[None] | None
    _channel: AbstractChannel | None
    _consumer_tag: str | None
    _start_consuming: Callable[[], Awaitable[None]]
    _stop_consuming: Callable[[], Awaitable[None]]

    def _enqueue(self, batch: list[Pending], reason: str) -> None:
        self._batches.put_nowait((batch, reason))

    def _drop_queued(self, dead: Callable[[Pending], bool]) -> int:
        """Remove the matching deliveries from the queued batches; returns how many."""
        queued: list[Batch] = []
        while not self._batches.empty():
            queued.append(self._batches.get_nowait())
        dropped = 0
        for batch, reason in queued:
            live = [p for p in batch if not dead(p)]
            dropped += len(batch) - len(live)
            if live:
                self._batches.put_nowait((live, reason))
        for _ in queued:  # after the puts: join() never sees an empty queue on the way
            self._batches.task_done()
        return dropped

    def _drop_channel(self, channel: AbstractChannel) -> None:
        """Forget a dead channel's deliveries, buffered or in batches that wait for a worker:
        their tags cannot be acked elsewhere, and the broker redelivers them to the next
        channel. Left queued, each reconnect during a database outage would add a prefetch
        window to the queue (batches a worker already holds are settled by it as dropped)."""

        def dead(p: Pending) -> bool:
            return getattr(p.delivery, "channel", None) is channel

        dropped = len(self._collector.drop(dead)) + self._drop_queued(dead)
        if dropped:
            self.metrics.messages_dropped.inc(dropped)
            self.metrics.buffer_messages.dec(dropped)
            log.info("dropped %d held deliveries of the closed channel", dropped)
        if self._channel is channel:
            self._channel = None
            self._consumer_tag = None

    def _start_worker(self, slot: int) -> asyncio.Task[None]:
        task = asyncio.create_task(self._flush_worker(), name=f"flush-worker-{slot}")
        task.add_done_callback(functools.partial(self._worker_ended, slot))
        return task

    def _worker_ended(self, slot: int, task: asyncio.Task[None]) -> None:
        """A flush worker ended outside shutdown: log why and start another in its slot."""
        if self._stopping:
            return
        cause = "cancelled" if task.cancelled() else repr(task.exception())
        log.error(
            "flush worker %d ended unexpectedly (%s); a new one starts in %.0f s",
            slot,
            cause,
            WORKER_RESTART_DELAY_S,
            exc_info=None if task.cancelled() else task.exception(),
        )
        asyncio.get_running_loop().call_later(
            WORKER_RESTART_DELAY_S, self._restart_worker, slot, task
        )

    def _restart_worker(self, slot: int, ended: asyncio.Task[None]) -> None:
        if self._stopping or self._workers[slot] is not ended:
            return
        self._workers[slot] = self._start_worker(slot)
        self._worker_restarts += 1
        log.warning("flush worker %d restarted", slot)

    async def _flush_worker(self) -> None:
        assert self._flusher is not None
        while True:
            batch, reason = await self._batches.get()
            try:
                await self._flusher.process(batch, reason)
            except asyncio.CancelledError:
                if cancel_requested():
                    raise
                # a future of a connection aiormq gave up: the broker redelivers the batch
                log.warning("flush ended by a lost broker connection; releasing its deliveries")
                await asyncio.shield(self._release(batch))
            except Exception:
                log.exception("flush failed unexpectedly; releasing its deliveries for redelivery")
                await asyncio.shield(self._release(batch))
            finally:
                self._batches.task_done()

    async def _release(self, held: list[Pending]) -> None:
        """Hand deliveries back to the broker (see AmqpDelivery.release) and stop counting
        them as held."""
        released = await release_all([pending.delivery for pending in held])
        self.metrics.messages_released.inc(released)
        self.metrics.messages_dropped.inc(len(held) - released)
        self.metrics.buffer_messages.dec(len(held))

    # -- outages --------------------------------------------------------------------------

    def _on_outage(self, down: bool) -> None:
        self._db_ok = not down

    async def _on_release(self) -> None:
        """A batch was released after a long outage: pause intake until the database is back."""
        if self._stopping:
            return
        if self._pause_task is None or self._pause_task.done():
            self._pause_task = asyncio.create_task(self._pause_until_database_returns())

    async def _pause_until_database_returns(self) -> None:
        self._intake.clear()
        await self._stop_consuming()
        log.warning("intake paused until the database is back")
        held = self._collector.drop(lambda p: True)
        while not self._batches.empty():
            batch, _ = self._batches.get_nowait()
            held.extend(batch)
            self._batches.task_done()
        await self._release(held)
        backoff = Backoff(base_s=0.2, cap_s=5.0)
        attempt = 0
        assert self._writer is not None
        assert self._flusher is not None
        while not self._stopping:
            await asyncio.sleep(backoff.delay(attempt))
            attempt += 1
            try:
                # a real write, rolled back: `SELECT 1` passes on a database that accepts
                # connections but refuses writes (read-only, disk full, a revoked privilege)
                await self._writer.probe()
            except Exception as exc:  # any failed probe means "not back yet", whatever its type
                log.debug("database probe failed: %r", exc)
                continue
            break
        self._flusher.recovered()
        log.info("database is back: intake resumed")
        self._intake.set()
        with broker_failures_suppressed():
            await self._start_consuming()
