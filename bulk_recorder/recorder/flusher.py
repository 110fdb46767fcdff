"""Flusher: turns a batch of buffered deliveries into committed rows, then settles each delivery.

- Commit first, then ack each delivery on its own; the settle step is shielded from
  cancellation so that "committed but not acked" can only come from a crash or a dead channel
  (and is absorbed by redelivery and the idempotent insert).
- A batch that PostgreSQL refuses for its data is bisected: every good half is committed and
  acked, only the offending rows are rejected (requeued, so their delivery count grows); on
  their last allowed delivery they are dead-lettered with the database's reason.
- A transient failure (outage) is retried with capped exponential backoff and jitter; nothing
  is rejected or dead-lettered. Past ``release_after_s`` the batch is released so the broker's
  consumer timeout never fires, and the owner is told to pause intake. A release must not spend
  the message's delivery budget (quorum queues count every return toward their delivery limit):
  see :meth:`Delivery.release`.
- A dead letter that the DLQ cannot take yet is held in a task of its own, so that the flush
  worker goes on with the next batch meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bulk_recorder.exceptions import BulkRecorderError
from bulk_recorder.infra import tracing
from bulk_recorder.infra.backoff import Backoff
from bulk_recorder.infra.errors import DataRejected, TransientDbError
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.recorder.flush_tracing import flush_span
from bulk_recorder.recorder.writer import Writer, WriteResult
from bulk_recorder.records import Record

log = logging.getLogger(__name__)


class DeadLetterResult(enum.Enum):
    """How :meth:`Delivery.dead_letter` settled a delivery."""

    DEAD_LETTERED = "dead-lettered"  # routed to the DLQ and confirmed, then acked
    RELEASED = "released"  # the DLQ refused it for too long: released for a later retry
    DROPPED = "dropped"  # the delivery's channel is gone: the broker redelivers the message


class Delivery(Protocol):
    """One broker delivery as the flusher sees it. Each call returns False (or DROPPED) when the
    delivery's channel is gone (its tag is then meaningless: the broker redelivers it)."""

    @property
    def delivery_count(self) -> int:
        """How many times the broker delivered this message before (x-delivery-count)."""
        ...

    @property
    def received(self) -> float:
        """When it arrived (``time.monotonic()``, taken once at receipt)."""
        ...

    def alive(self) -> bool: ...

    async def ack(self) -> bool: ...

    async def reject(self) -> bool:
        """Reject with requeue: the message comes back and its delivery count grows."""
        ...

    async def release(self) -> bool:
        """Hand the message back without judging it and, where the broker lets us, without
        spending one of its deliveries (a copy back to the queue, confirmed, then an ack)."""
        ...

    async def dead_letter(self, reason: str) -> DeadLetterResult:
        """Publish to the dead-letter exchange with the reason, then ack. While the DLQ cannot
        take it, hold the delivery and retry; release it after a bounded wait."""
        ...


async def release_all(
    deliveries: Sequence[Delivery], metrics: Metrics | None = None, window: int = 200
) -> int:
    """Release every delivery, ``window`` at a time (each release waits for a broker confirm:
    one after another they would take ~1 ms each). Returns how many were released; the rest
    belonged to a closed channel. With ``metrics``, the hold of each one released is observed."""
    released = 0
    with tracing.child_span("release", **{"messaging.batch.message_count": len(deliveries)}):
        for start in range(0, len(deliveries), window):
            chunk = deliveries[start : start + window]
            done = await asyncio.gather(*(d.release() for d in chunk))
            released += sum(done)
            if metrics is not None:
                observe_settled(
                    metrics, [d for d, ok in zip(chunk, done, strict=True) if ok], "released"
                )
                if not all(done):
                    observe_settled(
                        metrics,
                        [d for d, ok in zip(chunk, done, strict=True) if not ok],
                        "dropped",
                    )
    return released


def observe_settled(
    metrics: Metrics, deliveries: Sequence[Delivery], outcome: str, attempt: str | None = None
) -> None:
    """Deliveries just settled: their hold, receipt to now, under ``outcome``; with ``attempt``,
    also the attempt (x-delivery-count + 1) at which they were settled so."""
    now = time.monotonic()
    metrics.delivery_hold.observe_many([now - d.received for d in deliveries], outcome)
    metrics.held.settled(deliveries)
    if attempt is not None:
        metrics.delivery_attempt.observe_many([d.delivery_count + 1 for d in deliveries], attempt)


def count_dead_letter(
    metrics: Metrics, result: DeadLetterResult, reason_class: str, delivery: Delivery
) -> None:
    """One delivery settled by :meth:`Delivery.dead_letter`: exactly one counter moves."""
    if result is DeadLetterResult.DEAD_LETTERED:
        metrics.messages_dead_lettered.labels(reason=reason_class).inc()
        observe_settled(metrics, (delivery,), "dead_lettered", "dead_lettered")
    elif result is DeadLetterResult.RELEASED:
        metrics.messages_released.inc()
        observe_settled(metrics, (delivery,), "released")
    else:
        metrics.messages_dropped.inc()
        observe_settled(metrics, (delivery,), "dropped")


@dataclass(slots=True)
class Pending:
    """A decoded record and the delivery that brought it."""

    record: Record
    delivery: Delivery


AckMany = Callable[[Sequence[Delivery]], Awaitable[int]]
"""Acks many deliveries at once (still one ack each, never ``multiple``); returns how many
were acked (the rest belonged to a closed channel)."""


class Released(BulkRecorderError):
    """A transient failure outlasted ``release_after_s``: the batch goes back to the broker."""


@dataclass(slots=True)
class _Outcome:
    committed: list[Pending] = field(default_factory=list)
    poison: list[tuple[Pending, str]] = field(default_factory=list)
    released: list[Pending] = field(default_factory=list)
    inserted: int = 0  # rows, every table
    ignored: int = 0  # rows already recorded
    attempts: int = 0  # writes tried (a bisection and outage retries add to it)


class Flusher:
    def __init__(
        self,
        writer: Writer,
        metrics: Metrics,
        *,
        delivery_limit: int,
        release_after_s: float,
        backoff: Backoff | None = None,
        on_outage: Callable[[bool], None] | None = None,
        on_release: Callable[[], Awaitable[None]] | None = None,
        ack_many: AckMany | None = None,
        queue: str = "",
    ) -> None:
        self._writer = writer
        self._metrics = metrics
        self._delivery_limit = delivery_limit
        self._release_after_s = release_after_s
        self._backoff = backoff or Backoff()
        self._on_outage = on_outage
        self._on_release = on_release
        self._ack_many = ack_many
        self._queue = queue  # the flush span's messaging.destination.name
        self._outage_since: float | None = None
        self._stop_retrying = asyncio.Event()
        self._held: set[asyncio.Task[None]] = set()

    @property
    def in_outage(self) -> bool:
        return self._outage_since is not None

    def stop_retrying(self) -> None:
        """Shutting down: a batch that meets an outage is released at once instead of retried
        (a delivery still held when the channel closes would spend one of its deliveries)."""
        self._stop_retrying.set()

    async def wait_held(self) -> None:
        """Wait for the dead letters still held (each ends within its bounded wait)."""
        while self._held:
            await asyncio.gather(*self._held, return_exceptions=True)

    async def process(self, batch: list[Pending], reason: str) -> None:
        """Write one batch and settle every delivery in it. Never raises for data or outages.
        Traced: in a flush span linked to the deliveries' contexts (flush_tracing)."""
        if not tracing.active():
            await self._process(batch, reason)
            return
        carriers = (getattr(p.delivery, "trace_headers", None) for p in batch)
        with flush_span(self._queue, reason, len(batch), carriers) as counts:
            outcome = await self._process(batch, reason)
            counts.committed, counts.refused = len(outcome.committed), len(outcome.poison)
            counts.released, counts.attempts = len(outcome.released), outcome.attempts
            counts.inserted, counts.ignored = outcome.inserted, outcome.ignored

    async def _process(self, batch: list[Pending], reason: str) -> _Outcome:
        metrics = self._metrics
        metrics.flushes.labels(reason=reason).inc()
        metrics.flush_size.observe(len(batch))
        live = [p for p in batch if p.delivery.alive()]
        if len(live) != len(batch):
            self._dropped(len(batch) - len(live))
            metrics.buffer_messages.dec(len(batch) - len(live))
        outcome = _Outcome()
        started = time.perf_counter()
        try:
            if live:
                await self._isolate(live, outcome)
        except Released:
            settled = {id(p) for p in outcome.committed} | {id(p) for p, _ in outcome.poison}
            outcome.released = [p for p in live if id(p) not in settled]
        with tracing.child_span("settle", **{"messaging.batch.message_count": len(live)}):
            await asyncio.shield(self._settle(outcome, outcome.released))
        metrics.flush_duration.observe(time.perf_counter() - started)
        if outcome.released and self._on_release is not None:
            await self._on_release()
        return outcome

    async def _isolate(self, items: list[Pending], outcome: _Outcome) -> None:
        try:
            result = await self._write_with_retry([p.record for p in items], outcome)
        except DataRejected as exc:
            if len(items) == 1:
                log.warning("row %s refused by PostgreSQL: %s", items[0].record.id, exc.reason)
                outcome.poison.append((items[0], exc.reason))
                return
            self._metrics.fallback.inc()
            mid = len(items) // 2
            with tracing.child_span("bisect", **{"messaging.batch.message_count": len(items)}):
                await self._isolate(items[:mid], outcome)
                await self._isolate(items[mid:], outcome)
            return
        self._count_rows(result, outcome)
        outcome.committed.extend(items)

    async def _write_with_retry(self, records: Sequence[Record], outcome: _Outcome) -> WriteResult:
        attempt = 0
        while True:
            outcome.attempts += 1
            try:
                result = await self._writer.write(records)
            except TransientDbError as exc:
                now = time.monotonic()
                if self._outage_since is None:
                    self._outage_since = now
                    self._metrics.paused.set(1)
                    log.warning("database unavailable, retrying with backoff: %s", exc)
                    if self._on_outage is not None:
                        self._on_outage(True)
                if now - self._outage_since >= self._release_after_s:
                    log.warning(
                        "database still unavailable after %.0f s: releasing %d deliveries",
                        now - self._outage_since,
                        len(records),
                    )
                    raise Released from exc
                if self._stop_retrying.is_set():
                    log.warning("stopping during an outage: releasing %d deliveries", len(records))
                    raise Released from exc
                self._metrics.db_retries.inc()
                await self._pause(self._backoff.delay(attempt))
                attempt += 1
                continue
            if self._outage_since is not None:
                log.info("database available again")
                self.recovered()
            return result

    async def _pause(self, seconds: float) -> None:
        """Sleep between retries; a shutdown ends the sleep at once."""
        if seconds <= 0 or self._stop_retrying.is_set():
            await asyncio.sleep(0)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop_retrying.wait(), seconds)

    def recovered(self) -> None:
        """Leave outage mode (a write or a probe succeeded)."""
        if self._outage_since is None:
            return
        self._outage_since = None
        self._metrics.paused.set(0)
        if self._on_outage is not None:
            self._on_outage(False)

    async def _settle(self, outcome: _Outcome, released: list[Pending]) -> None:
        metrics = self._metrics
        acked = dropped = 0
        committed = [p.delivery for p in outcome.committed]
        if self._ack_many is not None:
            acked = await self._ack_many(committed)
            dropped = len(committed) - acked
        else:
            for delivery in committed:
                if await delivery.ack():
                    acked += 1
                else:
                    dropped += 1
        metrics.messages_acked.inc(acked)
        # a delivery whose ack was lost comes back, and is counted when it is acked then
        acked_ones = [d for d in committed if d.alive()] if dropped else committed
        observe_settled(metrics, acked_ones, "acked", "recorded")
        if dropped:  # its channel is gone: e.g. closed by the broker's consumer timeout
            observe_settled(metrics, [d for d in committed if not d.alive()], "dropped")
        held = 0
        for p, reason in outcome.poison:
            delivery = p.delivery
            # the broker's last delivery: x-delivery-count N of x-delivery-limit=N (it delivers
            # N + 1 times, tests/integration/test_delivery_limit.py); its return would drop the
            # reason, so it is dead-lettered here with it
            if delivery.delivery_count >= self._delivery_limit:
                self._hold(delivery, f"database refused the row: {reason}")
                held += 1
            elif await delivery.reject():
                metrics.messages_rejected.inc()
                observe_settled(metrics, (delivery,), "rejected")
            else:
                dropped += 1
                observe_settled(metrics, (delivery,), "dropped")
        if released:
            count = await release_all([p.delivery for p in released], metrics)
            metrics.messages_released.inc(count)
            dropped += len(released) - count
        if dropped:
            self._dropped(dropped)
        settled = len(outcome.committed) + len(outcome.poison) - held + len(released)
        metrics.buffer_messages.dec(settled)

    def _hold(self, delivery: Delivery, reason: str) -> None:
        """Dead-letter in a task of its own: a DLQ that refuses must not hold the flush worker."""
        task = asyncio.create_task(self._dead_letter(delivery, reason))
        self._held.add(task)
        task.add_done_callback(self._held.discard)

    async def _dead_letter(self, delivery: Delivery, reason: str) -> None:
        try:
            result = await delivery.dead_letter(reason)
        except Exception:  # a bug below must not leave the gauge or the counters wrong
            log.exception("dead-lettering a refused row failed unexpectedly")
            result = DeadLetterResult.DROPPED
        finally:
            self._metrics.buffer_messages.dec()
        count_dead_letter(self._metrics, result, "database", delivery)

    def _dropped(self, count: int) -> None:
        self._metrics.messages_dropped.inc(count)
        log.info(
            "%d deliveries left to the broker (their channel closed, or a stop let no new copy "
            "start); it redelivers them",
            count,
        )

    def _count_rows(self, result: WriteResult, outcome: _Outcome) -> None:
        metrics = self._metrics
        for table, counts in result.tables.items():
            outcome.inserted += counts.inserted
            outcome.ignored += counts.ignored
            metrics.rows_attempted.labels(table=table).inc(counts.attempted)
            metrics.rows_inserted.labels(table=table).inc(counts.inserted)
            metrics.rows_ignored.labels(table=table).inc(counts.ignored)
