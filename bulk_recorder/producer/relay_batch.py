"""Publishing one outbox batch: every row at once on a confirm channel, suspects and refused
rows alone on channels of their own, then the settlement (deletes, refusals, parking, job
counts) in the lane's transaction. :mod:`bulk_recorder.producer.relay` runs the lanes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import aio_pika
import aiormq
import asyncpg
from aiormq.abc import AbstractChannel

from bulk_recorder.exceptions import BulkRecorderError
from bulk_recorder.infra import tracing
from bulk_recorder.infra.aiormq_internals import write_publishes
from bulk_recorder.infra.broker import (
    broker_failures_suppressed,
    cancel_requested,
)
from bulk_recorder.infra.db import Connection
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.producer.outbox import stamp_published
from bulk_recorder.producer.relay_claim import CLAIM_WINDOW, ClaimCursor, claim
from bulk_recorder.producer.relay_tracing import NO_SPANS, Headers, PublishSpans, Spans
from bulk_recorder.relay_settings import DEFAULT_BATCH_SIZE, DEFAULT_LANES, DEFAULT_POLL_INTERVAL_S

log = logging.getLogger(__name__)


APP_ID = "bulk-recorder-relay"
_DELETE_SENT = "DELETE FROM outbox WHERE id = ANY($1::bigint[])"
_COUNT_PUBLISHED = """
UPDATE credit_annotation_jobs AS j
SET published = j.published + u.n, last_published_at = clock_timestamp()
FROM unnest($1::uuid[], $2::int[]) AS u(id, n)
WHERE j.id = u.id
"""
_REFUSED = """
UPDATE outbox AS o
SET attempts = o.attempts + 1,
    last_error = u.error,
    available_at = now() + make_interval(secs => least(300, 2 ^ least(o.attempts, 16))),
    parked_at = CASE WHEN o.attempts + 1 >= $3 THEN now() END
FROM unnest($1::bigint[], $2::text[]) AS u(id, error)
WHERE o.id = u.id
RETURNING o.job_id, o.parked_at IS NOT NULL AS parked
"""
_COUNT_PARKED = """
UPDATE credit_annotation_jobs AS j SET dead_lettered = j.dead_lettered + u.n
FROM unnest($1::uuid[], $2::int[]) AS u(id, n)
WHERE j.id = u.id
"""


def _properties(record_type: str, headers: Headers) -> aiormq.spec.Basic.Properties:
    """A new object for every publish: aiormq and write_publishes write a fresh message_id into
    it, by which a basic.return is matched with its publish. ``headers``: the trace context."""
    return aiormq.spec.Basic.Properties(
        content_type="application/json",
        delivery_mode=2,
        message_type=record_type,
        app_id=APP_ID,
        headers=headers,
    )


@dataclass(frozen=True, slots=True)
class RelayConfig:
    batch_size: int = (
        DEFAULT_BATCH_SIZE  # rows claimed, published and deleted per database transaction
    )
    lanes: int = DEFAULT_LANES  # concurrent batches in one relay (one DB connection each)
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S  # fallback when no notification arrives
    publish_timeout_s: float = 30.0  # room to write, or a confirm, slower: an outage
    max_attempts: int = 10  # broker refusals before a row is parked
    stats_interval_s: float = 2.0  # how often backlog and oldest age are refreshed

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.lanes < 1 or self.max_attempts < 1:
            raise ValueError("batch_size, lanes and max_attempts must be >= 1")
        if self.poll_interval_s <= 0 or self.publish_timeout_s <= 0 or self.stats_interval_s <= 0:
            raise ValueError("intervals and timeouts must be > 0")


@dataclass(frozen=True, slots=True)
class BatchResult:
    claimed: int
    published: int
    refused: int  # its lone publish made the broker close the channel
    lost: int  # no confirm (connection or channel gone, or timed out), nacked, or returned


class BatchSender:
    """One lane's batch: publish the claimed rows, then settle them in the same transaction.

    ``suspects`` (shared by every lane of a relay) are the rows in flight on a channel the
    broker closed: they are published alone until settled.
    """

    def __init__(self, config: RelayConfig, metrics: Metrics, exchange: str) -> None:
        self.config = config
        self.metrics = metrics
        self.exchange = exchange
        self.suspects: set[int] = set()
        self.cursor = ClaimCursor()  # where the next claim starts (relay_claim.py)

    async def relay(self, conn: Connection, channel: AbstractChannel) -> BatchResult:
        """Claim, publish and settle one batch inside ``conn``'s open transaction."""
        window = CLAIM_WINDOW * self.config.batch_size * self.config.lanes
        rows = await claim(conn, self.cursor, self.config.batch_size, window)
        if not rows:
            return BatchResult(0, 0, 0, 0)
        # Rows refused before, or in flight when the broker closed a channel: one by one.
        alone = [r for r in rows if r["attempts"] > 0 or r["id"] in self.suspects]
        alone_ids = {r["id"] for r in alone}
        together = [r for r in rows if r["id"] not in alone_ids]
        outcomes: dict[int, BaseException | None] = {}
        spans = PublishSpans(self.exchange, rows) if tracing.active() else NO_SPANS
        try:
            if alone:
                outcomes.update(await self._publish_alone(channel.connection, alone, spans))
            results = await self._publish_together(channel, together, spans)
            for row, outcome in zip(together, results, strict=True):
                outcomes[row["id"]] = outcome
        finally:
            spans.end(outcomes)
        self._suspect([r["id"] for r in together if _closed_by_broker(outcomes[r["id"]])])
        result = await self._settle(conn, rows, [outcomes[r["id"]] for r in rows])
        self.suspects.difference_update(r["id"] for r in rows if _settled(outcomes[r["id"]]))
        return result

    async def _publish_alone(
        self,
        connection: aiormq.abc.AbstractConnection,
        rows: Sequence[asyncpg.Record],
        spans: Spans,
    ) -> dict[int, BaseException | None]:
        """Publish each row on its own, awaiting its confirm, on a channel of its own.

        So a row that makes the broker close the channel is known: it is refused, a new channel
        is opened, and the next row goes on. When the connection fails (or anything else), the
        rows not yet settled are lost, as in a batch.
        """
        outcomes: dict[int, BaseException | None] = {}
        failure: BaseException | None = None  # what stopped the run: the rest are lost by it
        channel: AbstractChannel | None = None
        try:
            for row in rows:
                try:
                    if channel is None or channel.is_closed:
                        channel = await _open_channel(connection, self.config.publish_timeout_s)
                    headers = spans.headers(row["id"])
                    await self._publish(channel, row["record_type"], row["body"], headers)
                except aiormq.exceptions.DeliveryError as exc:  # nacked or returned: an outage
                    failure = exc
                    break
                except aiormq.exceptions.ChannelPreconditionFailed as exc:
                    # The broker closed the channel for this message alone.
                    outcomes[row["id"]] = ChannelRefusal(exc)
                except asyncio.CancelledError as exc:
                    if cancel_requested():
                        raise
                    failure = exc  # aiormq gave up on the connection
                    break
                except Exception as exc:
                    failure = exc
                    break
                else:
                    outcomes[row["id"]] = None
        finally:
            if channel is not None and not channel.is_closed:
                await close_quietly(channel)
        for row in rows:
            outcomes.setdefault(row["id"], failure)
        return outcomes

    def _suspect(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        limit = 16 * self.config.batch_size * self.config.lanes
        if len(self.suspects) + len(ids) > limit:
            # Rows another relay published stay here; forgetting costs one more channel close.
            self.suspects.clear()
        self.suspects.update(ids)
        log.warning(
            "the broker closed the channel with %d publishes in flight; they go one by one",
            len(ids),
        )

    async def _publish_together(
        self, channel: AbstractChannel, rows: Sequence[asyncpg.Record], spans: Spans
    ) -> list[BaseException | None]:
        """Publish the rows in one write and wait for every confirm (publish_timeout_s at
        most); each row's outcome as ``_publish`` would raise it, None when confirmed."""
        if not rows:
            return []
        # each message carries its producer span's context (tracing on)
        props = [_properties(r["record_type"], spans.headers(r["id"])) for r in rows]
        messages = [
            (self.exchange, r["record_type"], p, r["body"])
            for r, p in zip(rows, props, strict=True)
        ]
        try:
            # Bounded: a connection that dies while its write queue is full never makes room.
            async with asyncio.timeout(self.config.publish_timeout_s):
                futures = await write_publishes(channel, messages, mandatory=True)
        except asyncio.CancelledError:
            raise
        except TimeoutError:  # nothing written: the rows stay, the connection is replaced
            return [TimeoutError("no room in the connection's write queue in time")] * len(rows)
        except Exception as exc:  # the channel or connection went away before the write
            return [exc] * len(rows)
        done, _ = await asyncio.wait(futures, timeout=self.config.publish_timeout_s)
        outcomes: list[BaseException | None] = []
        for future in futures:
            if future not in done:
                future.cancel()
                outcomes.append(TimeoutError("no confirm within publish_timeout_s"))
            elif future.cancelled():
                outcomes.append(asyncio.CancelledError())  # aiormq gave up on the connection
            elif (error := future.exception()) is not None:
                outcomes.append(error)  # a nack, a return, the channel closed
            elif not isinstance(future.result(), aiormq.spec.Basic.Ack):
                outcomes.append(aiormq.exceptions.DeliveryError(None, future.result()))
            else:
                outcomes.append(None)
        return outcomes

    async def _publish(
        self, channel: AbstractChannel, record_type: str, body: bytes, headers: Headers
    ) -> None:
        # A new Properties object each time: aiormq writes a random message_id into it, which
        # it uses to match a basic.return with its publish.
        properties = _properties(record_type, headers)
        confirmation = await channel.basic_publish(
            body,
            exchange=self.exchange,
            routing_key=record_type,
            properties=properties,
            mandatory=True,
            timeout=self.config.publish_timeout_s,
        )
        if not isinstance(confirmation, aiormq.spec.Basic.Ack):
            raise aiormq.exceptions.DeliveryError(None, confirmation)  # type: ignore[arg-type]

    async def _settle(
        self,
        conn: Connection,
        rows: Sequence[asyncpg.Record],
        outcomes: Sequence[BaseException | None],
    ) -> BatchResult:
        sent: list[int] = []
        refused: list[int] = []
        reasons: list[str] = []  # each refused row's own reason, kept in its last_error
        lost = 0
        nacked = 0
        unroutable = 0
        published_per_job: Counter[str] = Counter()
        lost_error = ""
        for row, outcome in zip(rows, outcomes, strict=True):
            if outcome is None:
                sent.append(row["id"])
                if row["job_id"] is not None:
                    published_per_job[str(row["job_id"])] += 1
            elif isinstance(outcome, ChannelRefusal):
                refused.append(row["id"])
                reasons.append(f"closed the channel: {outcome}"[:500])
            elif isinstance(outcome, aiormq.exceptions.PublishError):
                unroutable += 1  # our queue or its binding is gone: not the row's fault
            elif isinstance(outcome, aiormq.exceptions.DeliveryError):
                nacked += 1  # the broker could not take it now: not the row's fault
            elif isinstance(outcome, asyncio.CancelledError) and cancel_requested():
                raise outcome  # a shutdown while we settle
            else:
                # No confirm: the channel or connection went away. aiormq fails a pending
                # confirm with CancelledError when it gives up on a silent connection (the
                # gather above would have raised if this lane itself had been cancelled).
                lost += 1
                lost_error = lost_error or f"{type(outcome).__name__}: {outcome}"
        if sent:
            await conn.execute(_DELETE_SENT, sent)
            await stamp_published(conn)  # any row: a job's status tells a busy relay by it
            if published_per_job:
                jobs = sorted(published_per_job)  # one lock order for every lane and relay
                await conn.execute(_COUNT_PUBLISHED, jobs, [published_per_job[j] for j in jobs])
        parked = await self._refuse(conn, refused, reasons) if refused else 0
        # Counted here, before the commit: a failed commit re-publishes these rows (a duplicate
        # the recorder absorbs), so the counter may run ahead of the table, never behind.
        self.metrics.outbox_published.inc(len(sent))
        if sent:
            self.metrics.outbox_last_publish.set_to_current_time()
        if refused:
            self.metrics.outbox_publish_failures.labels(reason="refused").inc(len(refused))
            log.warning("broker refused %d outbox rows: %s", len(refused), reasons[0])
        if parked:
            self.metrics.outbox_parked.inc(parked)
            log.error("parked %d outbox rows after %d refusals", parked, self.config.max_attempts)
        self._count_kept(lost, lost_error, nacked, unroutable)
        return BatchResult(len(rows), len(sent), len(refused), lost + nacked + unroutable)

    def _count_kept(self, lost: int, lost_error: str, nacked: int, unroutable: int) -> None:
        """Count and log the rows that stay in the outbox, none of them by their own fault."""
        if lost:
            self.metrics.outbox_publish_failures.labels(reason="lost").inc(lost)
            log.warning("%d publishes lost their confirm (%s); rows stay", lost, lost_error)
        if nacked:
            self.metrics.outbox_publish_failures.labels(reason="nacked").inc(nacked)
            log.warning("broker nacked %d publishes; rows stay", nacked)
        _count_unroutable(self.metrics, unroutable)

    async def _refuse(self, conn: Connection, refused: list[int], reasons: list[str]) -> int:
        """Retry the refused rows later, parking those out of attempts; how many were parked."""
        updated = await conn.fetch(_REFUSED, refused, reasons, self.config.max_attempts)
        parked_per_job: Counter[str] = Counter(
            str(r["job_id"]) for r in updated if r["parked"] and r["job_id"] is not None
        )
        if parked_per_job:
            jobs = sorted(parked_per_job)
            await conn.execute(_COUNT_PARKED, jobs, [parked_per_job[j] for j in jobs])
        return sum(1 for r in updated if r["parked"])


async def close_quietly(closable: aio_pika.abc.AbstractConnection | AbstractChannel) -> None:
    """Close a connection or channel; a broker that is away cannot make that fail."""
    with broker_failures_suppressed():
        await asyncio.wait_for(closable.close(), 10)


class ChannelRefusal(BulkRecorderError):
    """The broker closed a channel for a message published alone on it: the message's fault."""

    def __init__(self, cause: aiormq.exceptions.ChannelClosed) -> None:
        super().__init__(_close_text(cause))


def _close_text(exc: aiormq.exceptions.ChannelClosed) -> str:
    # aiormq's channel errors carry the broker's reply text, e.g. 'PRECONDITION_FAILED - message
    # size 1232 is larger than configured max size 1024'
    return " ".join(str(a) for a in exc.args if a is not None) or type(exc).__name__


class _ChannelOpenFailed(BulkRecorderError):
    """Opening a channel failed: not the fault of the row about to be published on it."""


async def _open_channel(
    connection: aiormq.abc.AbstractConnection, within_s: float
) -> AbstractChannel:
    # Bounded: the Channel.Open waits for room in the connection's write queue, which a
    # connection that died with it full never makes (see write_publishes).
    try:
        return await connection.channel(publisher_confirms=True, timeout=within_s)
    except Exception as exc:
        raise _ChannelOpenFailed(repr(exc)) from exc


def _closed_by_broker(outcome: BaseException | None) -> bool:
    """The broker closed the channel (a Channel.Close with a reply code), not the connection."""
    return isinstance(outcome, aiormq.exceptions.ChannelClosed) and outcome.args[:1] != (None,)


def _settled(outcome: BaseException | None) -> bool:
    return outcome is None or isinstance(outcome, ChannelRefusal)


def _count_unroutable(metrics: Metrics, n: int) -> None:
    """Publishes the broker returned (312 NO_ROUTE). The exchange routes every key to our queue
    while the topology exists, so a return means the queue or its binding is gone: an outage
    (the relay replaces its connection, which declares the topology again), never a refusal."""
    if not n:
        return
    metrics.outbox_publish_failures.labels(reason="unroutable").inc(n)
    log.warning(
        "broker returned %d publishes as unroutable: the queue or its binding is missing; "
        "declaring the topology again, rows stay",
        n,
    )
