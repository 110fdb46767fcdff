"""The recorder's flush pool: the queue of closed batches and the workers that write them.

Batches the collector closes wait in one queue; ``settings.rabbitmq_numbers_of_workers``
workers each take one at a time and hand it to the :class:`Flusher`. The workers run under the
recorder's :class:`Supervisor` (a worker that ends outside shutdown is logged and started again
with the supervisor's growing backoff; readiness counts it missing meanwhile). At shutdown the
pool drains: the batches still queued are written within a bounded wait, then the workers end.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from bulk_recorder.infra.broker import cancel_requested
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.infra.supervisor import Supervisor
from bulk_recorder.recorder.flusher import Flusher, Pending, release_all

log = logging.getLogger(__name__)

Batch = tuple[list[Pending], str]
WORKER = "flush-worker-"  # the workers' task names: flush-worker-0, flush-worker-1, ...


class FlushPool:
    """Owns the batch queue and ``size`` flush workers (started by :meth:`start`)."""

    def __init__(self, metrics: Metrics, supervisor: Supervisor, size: int) -> None:
        self.metrics = metrics
        self.size = size
        self._supervisor = supervisor
        self._batches: asyncio.Queue[Batch] = asyncio.Queue()
        self._flusher: Flusher | None = None

    def enqueue(self, batch: list[Pending], reason: str) -> None:
        """The collector's sink: a closed batch waits for a worker."""
        self._batches.put_nowait((batch, reason))

    def start(self, flusher: Flusher) -> None:
        self._flusher = flusher
        for slot in range(self.size):
            self._supervisor.start(f"{WORKER}{slot}", self._work)

    @property
    def started(self) -> bool:
        return self._flusher is not None

    def alive(self) -> int:
        return sum(not task.done() for task in self._supervisor.tasks(WORKER))

    def restarts(self) -> int:
        return self._supervisor.restarts(WORKER)

    def drop(self, dead: Callable[[Pending], bool]) -> int:
        """Remove the matching deliveries from the queued batches; returns how many."""
        queued = self._take()
        dropped = 0
        for batch, reason in queued:
            live = [p for p in batch if not dead(p)]
            dropped += len(batch) - len(live)
            if live:
                self._batches.put_nowait((live, reason))
        for _ in queued:  # after the puts: join() never sees an empty queue on the way
            self._batches.task_done()
        return dropped

    def take_all(self) -> list[Pending]:
        """Empty the queue: every delivery of the batches no worker has taken yet."""
        held: list[Pending] = []
        for batch, _ in self._take():
            held.extend(batch)
            self._batches.task_done()
        return held

    def _take(self) -> list[Batch]:
        queued: list[Batch] = []
        while not self._batches.empty():
            queued.append(self._batches.get_nowait())
        return queued

    async def release(self, held: list[Pending]) -> None:
        """Hand deliveries back to the broker (see AmqpDelivery.release) and stop counting
        them as held."""
        released = await release_all([pending.delivery for pending in held], self.metrics)
        self.metrics.messages_released.inc(released)
        self.metrics.messages_dropped.inc(len(held) - released)
        self.metrics.buffer_messages.dec(len(held))

    async def drain(self, wait_s: float) -> None:
        """Wait (at most ``wait_s`` s) until every queued batch is written and settled."""
        if not self.started:
            return
        try:
            await asyncio.wait_for(self._batches.join(), wait_s)
        except TimeoutError:
            log.warning("final flush did not finish in time; unacked messages will be redelivered")

    async def stop(self, within_s: float | None = None) -> None:
        """End the workers (after :meth:`drain`), waiting at most ``within_s`` for a settle
        under way (shielded): what it has not acked, the channel's close returns."""
        await self._supervisor.cancel(WORKER, within_s=within_s)

    async def _work(self) -> None:
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
                await asyncio.shield(self.release(batch))
            except Exception:
                log.exception("flush failed unexpectedly; releasing its deliveries for redelivery")
                await asyncio.shield(self.release(batch))
            finally:
                self._batches.task_done()
