"""Transactional outbox: write helpers for producers, and the :class:`Relay` that empties it.

Producers (the ingest API) call :func:`enqueue` or :func:`copy_to_outbox` inside the database
transaction that stores their work, then :func:`notify`: the rows exist exactly when the work
does, and the notification is delivered at commit.

The relay, in each of its lanes, repeats one database transaction:

1. claim up to ``batch_size`` unsent rows in id order with ``FOR UPDATE SKIP LOCKED`` (several
   lanes and several relay processes take disjoint batches),
2. publish them all at once on a confirm channel (the whole batch in flight, never one confirm
   awaited after another) with the message properties of DESIGN.md section 4 and
   ``mandatory`` set, so that an unroutable message counts as refused, not as sent,
3. delete the rows the broker confirmed and add them to their jobs' ``published`` count; a
   refused row (returned as unroutable, or its lone publish closed the channel) gets a later
   ``available_at`` and is parked after ``max_attempts`` refusals; a row that was nacked, or
   that was in flight when the connection died or its confirm timed out, is left untouched (an
   outage is not bad data),
4. commit.

A nack or a lost confirm on a channel that is still open is an outage of the broker (a quorum
queue without a leader or a majority, a queue full with ``reject-publish``): the lane asks the
broker loop to replace the connection and channel (the next connect tries the next node of a
cluster) and backs off, doubling with every batch that fails so in a row.

A row can also make the broker close the channel (``406 PRECONDITION_FAILED``, e.g. a body over
its ``max_message_size``): that fails every publish in flight on the channel, so the culprit is
unknown. Every row of such a batch becomes a suspect, and suspects (with every row refused
before) are published alone, each on a channel of its own and awaiting its confirm: the row the
broker closes that channel for is refused (and parked in the end) like a returned one, and the
others go through.

A crash anywhere before the commit rolls back the deletes: the rows are published again and the
recorder's ``ON CONFLICT (id) DO NOTHING`` absorbs the duplicate. While the broker is down the
rows wait. Lanes wake on ``LISTEN bulk_recorder_outbox`` and also poll every
``poll_interval_s`` (a missed notification or a lost listener connection only costs latency).

Every long-lived task (the lanes, the broker loop, the listener and the stats loop) treats any
failure of what it waits on as an outage, including the ``CancelledError`` that aiormq hands to
every pending confirm when it gives up on a silent connection (a partition that outlives the
heartbeat): only a cancellation of the task itself (a shutdown) ends it. A task that ends anyway
(a bug) is logged, makes :meth:`Relay.ready` false and is started again after a short backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import aio_pika
import aiormq
import asyncpg
from aiormq.abc import AbstractChannel
from asyncpg.pool import PoolConnectionProxy

from bulk_recorder import pg_hosts
from bulk_recorder.broker import (
    BROKER_ERRORS,
    BrokerNodes,
    broker_failures_suppressed,
    cancel_requested,
)
from bulk_recorder.db import DB_ERRORS, open_pool_when_ready, wait_or_stop
from bulk_recorder.errors import renew_if_server_gone
from bulk_recorder.flusher import Backoff
from bulk_recorder.metrics import Metrics
from settings import Settings

log = logging.getLogger(__name__)

Connection = asyncpg.Connection | PoolConnectionProxy

OUTBOX_CHANNEL = "bulk_recorder_outbox"
OUTBOX_COLUMNS = ("record_type", "record_id", "job_id", "body")
APP_ID = "bulk-recorder-relay"

_CLAIM = """
SELECT id, record_type, job_id, body, attempts
FROM outbox
WHERE parked_at IS NULL AND available_at <= now()
ORDER BY id
LIMIT $1
FOR UPDATE SKIP LOCKED
"""
_DELETE_SENT = "DELETE FROM outbox WHERE id = ANY($1::bigint[])"
_COUNT_PUBLISHED = """
UPDATE credit_annotation_jobs AS j SET published = j.published + u.n
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
_STATS = """
SELECT count(*) AS backlog,
       coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8 AS oldest
FROM outbox WHERE parked_at IS NULL
"""


# -- write helpers (producers) ----------------------------------------------------------------


async def enqueue(
    conn: Connection,
    record_type: str,
    record_id: str,
    body: bytes,
    *,
    job_id: str | None = None,
) -> int:
    """Insert one outbox row in the caller's transaction; returns its id."""
    row_id = await conn.fetchval(
        "INSERT INTO outbox (record_type, record_id, job_id, body) VALUES ($1, $2, $3, $4)"
        " RETURNING id",
        record_type,
        record_id,
        job_id,
        body,
    )
    return int(row_id)


async def copy_to_outbox(
    conn: Connection, rows: Iterable[tuple[str, str, str | None, bytes]]
) -> None:
    """COPY many ``(record_type, record_id, job_id, body)`` rows in the caller's transaction."""
    await conn.copy_records_to_table("outbox", records=rows, columns=OUTBOX_COLUMNS)


async def notify(conn: Connection) -> None:
    """Wake the relays; inside a transaction PostgreSQL delivers it at commit (or never)."""
    await conn.execute(f"NOTIFY {OUTBOX_CHANNEL}")


@dataclass(frozen=True, slots=True)
class OutboxStats:
    backlog: int
    oldest_age_s: float


async def outbox_stats(conn: Connection) -> OutboxStats:
    """Rows waiting to be published (parked ones excluded) and the age of the oldest."""
    row = await conn.fetchrow(_STATS)
    assert row is not None
    return OutboxStats(int(row["backlog"]), max(0.0, float(row["oldest"])))


def record_stats(metrics: Metrics, stats: OutboxStats) -> None:
    metrics.outbox_backlog.set(stats.backlog)
    metrics.outbox_oldest_age.set(stats.oldest_age_s)


# -- the relay ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RelayConfig:
    batch_size: int = 500  # rows claimed, published and deleted per database transaction
    lanes: int = 2  # concurrent batches in one relay (one DB connection each)
    poll_interval_s: float = 1.0  # fallback when no notification arrives
    publish_timeout_s: float = 30.0  # a confirm slower than this counts as an outage
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
    refused: int  # returned, or its lone publish made the broker close the channel
    lost: int  # no confirm (the connection or channel went away, or it timed out), or nacked


Declare = Callable[[aio_pika.abc.AbstractChannel], Awaitable[None]]


class Relay:
    """Publishes outbox rows; ``run(stop)`` returns after an orderly shutdown.

    ``declare`` is called with a fresh channel after every (re)connect, before the first
    publish: the service passes its topology declaration so that messages are routable even
    before a recorder ever ran. Publishes are ``mandatory``: without a bound queue the broker
    returns them and the rows stay (refused, retried later), they are never dropped.
    """

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics | None = None,
        config: RelayConfig | None = None,
        *,
        declare: Declare | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.config = config or RelayConfig()
        self.exchange = settings.rabbitmq_exchange
        self._declare = declare
        self._nodes = BrokerNodes.from_setting(settings.rabbitmq_url)  # one URL, or one a node
        self._pool: asyncpg.Pool | None = None
        self._channel: AbstractChannel | None = None
        self._broker_up = asyncio.Event()
        self._replace = asyncio.Event()  # a lane saw a nack or a lost confirm on the channel
        self._db_ok = False
        self._wakes = [asyncio.Event() for _ in range(self.config.lanes)]
        self._halt = asyncio.Event()  # stops the background loops once the lanes are done
        self._tasks: dict[str, asyncio.Task[None]] = {}  # the supervised tasks, by name
        # Rows in flight on a channel the broker closed: published alone until settled.
        self._suspects: set[int] = set()
        self._failed_rounds = 0  # batches in a row with a nack or a lost confirm

    # -- readiness --------------------------------------------------------------------------

    def ready(self) -> tuple[bool, str]:
        broker = "up" if self._broker_up.is_set() else "down"
        database = "up" if self._db_ok else "down"
        detail = f"broker {broker}, database {database}"
        dead = [name for name, task in self._tasks.items() if task.done()]
        if dead:
            detail += ", " + ", ".join(f"{name} down" for name in dead)
        return self._broker_up.is_set() and self._db_ok and not dead, detail

    def wake(self) -> None:
        """Make every lane look for rows now."""
        for event in self._wakes:
            event.set()

    # -- lifecycle --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        s, c = self.settings, self.config
        log.info(
            "relay starting: batch_size=%d lanes=%d poll_interval_s=%.2f exchange=%s",
            c.batch_size,
            c.lanes,
            c.poll_interval_s,
            s.rabbitmq_exchange,
        )
        halt = self._halt
        try:
            if not await self._connect_database(stop):
                return
            await self._supervise(
                {
                    "relay-broker": partial(self._broker_loop, halt),
                    "relay-listen": partial(self._listen_loop, halt),
                    "relay-stats": partial(self._stats_loop, halt),
                    **{f"relay-lane-{i}": partial(self._lane, i, stop) for i in range(c.lanes)},
                },
                stop,
            )
            log.info("relay stopping: finishing the batches in flight")
            # A lane finishes its batch (confirmed and deleted, or rolled back); bounded.
            lanes = self._lane_tasks()
            if lanes:
                _, pending = await asyncio.wait(lanes, timeout=c.publish_timeout_s + 5)
                for task in pending:
                    task.cancel()
        finally:
            halt.set()
            lanes = self._lane_tasks()
            for task in lanes:
                task.cancel()
            await asyncio.gather(*lanes, return_exceptions=True)
            # The broker loop closes its connection on halt; give it a moment, then cancel.
            tasks = [t for name, t in self._tasks.items() if not name.startswith("relay-lane-")]
            _, pending = await asyncio.wait(tasks, timeout=15) if tasks else (set(), set())
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._pool is not None:
                try:
                    await asyncio.wait_for(self._pool.close(), 10)
                except TimeoutError:
                    self._pool.terminate()
            log.info("relay stopped")

    def _lane_tasks(self) -> list[asyncio.Task[None]]:
        return [t for name, t in self._tasks.items() if name.startswith("relay-lane-")]

    async def _supervise(self, starters: dict[str, _Starter], stop: asyncio.Event) -> None:
        """Run every task until ``stop``; one that ends before is logged and started again.

        None of them should ever end on its own: each handles the failures of what it waits on.
        So an end here is a bug (or an exception nobody foresaw). It is logged with its cause,
        the task counts as down in :meth:`ready` meanwhile, and it is restarted after a backoff
        that doubles with each death of the same task (0.5 s up to 30 s), so that a task which
        dies at once every time cannot spin.
        """
        loop = asyncio.get_running_loop()
        deaths: Counter[str] = Counter()
        due: dict[str, float] = {}  # dead task -> when it starts again
        for name, start in starters.items():
            self._tasks[name] = asyncio.create_task(start(), name=name)
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                timeout = max(0.0, min(due.values()) - loop.time()) if due else None
                live = {t for name, t in self._tasks.items() if name not in due}
                await asyncio.wait(
                    {stopped, *live}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if stop.is_set():
                    break
                for name, task in self._tasks.items():
                    if task.done() and name not in due:
                        delay = min(_RESTART_CAP_S, _RESTART_BASE_S * 2 ** min(deaths[name], 10))
                        deaths[name] += 1
                        due[name] = loop.time() + delay
                        _log_death(task, delay)
                for name, when in list(due.items()):
                    if when <= loop.time():
                        del due[name]
                        log.warning("restarting %s", name)
                        self._tasks[name] = asyncio.create_task(starters[name](), name=name)
        finally:
            stopped.cancel()

    async def _connect_database(self, stop: asyncio.Event) -> bool:
        self._pool = await open_pool_when_ready(
            self.settings.database_url, max_size=self.config.lanes + 1, stop=stop
        )
        self._db_ok = self._pool is not None
        return self._db_ok

    async def _broker_loop(self, stop: asyncio.Event) -> None:
        backoff = Backoff(base_s=0.2, cap_s=5.0)
        attempt = 0
        while not stop.is_set():
            connection: aio_pika.abc.AbstractConnection | None = None
            try:
                connection = await self._nodes.connect()
                channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
                if self._declare is not None:
                    await self._declare(channel)
                underlay = await channel.get_underlay_channel()
                self._replace.clear()
                self._channel = underlay
                self._broker_up.set()
                log.info("relay connected to the broker; publishing to %s", self.exchange)
                self.wake()
                closed = asyncio.ensure_future(connection.closed())
                stopped = asyncio.ensure_future(stop.wait())
                replace = asyncio.ensure_future(self._replace.wait())
                try:
                    await asyncio.wait(
                        {closed, stopped, replace, underlay.closing},
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    closed.cancel()
                    stopped.cancel()
                    replace.cancel()
                if stop.is_set():
                    pass
                elif self._replace.is_set() and not underlay.is_closed:
                    log.warning(
                        "replacing the broker connection and channel after a nack or a lost "
                        "confirm; rows wait in the outbox"
                    )
                    attempt = self._failed_rounds
                else:
                    attempt = 0
                    log.warning("relay lost the broker connection; rows wait in the outbox")
            except BROKER_ERRORS as exc:
                log.warning("broker not reachable (%r); rows wait in the outbox", exc)
                log.debug("broker failure", exc_info=True)
            except asyncio.CancelledError:
                if cancel_requested():
                    raise
                # aiormq fails what waits on a connection it gave up on (heartbeat) this way
                log.warning("broker connection cancelled under us; rows wait in the outbox")
                log.debug("broker failure", exc_info=True)
            except Exception:  # a surprise from the client library must not end the relay
                log.exception("unexpected error on the broker connection; rows wait in the outbox")
            finally:
                self._broker_up.clear()
                self._channel = None
                if connection is not None:
                    await _close_quietly(connection)
            if stop.is_set():
                break
            await wait_or_stop(stop, backoff.delay(attempt))
            attempt += 1

    async def _listen_loop(self, stop: asyncio.Event) -> None:
        """LISTEN on its own connection; reconnect when it drops (the poll covers the gap)."""
        backoff = Backoff(base_s=0.2, cap_s=5.0)
        attempt = 0
        while not stop.is_set():
            conn: asyncpg.Connection | None = None
            lost = asyncio.Event()
            try:
                conn = await pg_hosts.connect(self.settings.database_url)
                conn.add_termination_listener(_setter(lost))
                await conn.add_listener(OUTBOX_CHANNEL, lambda *_args: self.wake())
                attempt = 0
                self.wake()  # rows may have arrived while we were not listening
                stopped = asyncio.ensure_future(stop.wait())
                gone = asyncio.ensure_future(lost.wait())
                try:
                    await asyncio.wait({stopped, gone}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopped.cancel()
                    gone.cancel()
            except DB_ERRORS as exc:
                log.warning("outbox listener connection failed (%r); polling meanwhile", exc)
            except asyncio.CancelledError:
                if cancel_requested():
                    raise
                log.warning("outbox listener cancelled under us; polling meanwhile")
            except Exception:  # the listener is an optimisation: never let it die silently
                log.exception("outbox listener failed unexpectedly; polling meanwhile")
            finally:
                if conn is not None and not conn.is_closed():
                    with contextlib.suppress(*DB_ERRORS):
                        await asyncio.wait_for(conn.close(), 5)
                    if not conn.is_closed():
                        conn.terminate()
            if stop.is_set():
                break
            await wait_or_stop(stop, backoff.delay(attempt))
            attempt += 1

    async def _stats_loop(self, stop: asyncio.Event) -> None:
        assert self._pool is not None
        while not stop.is_set():
            try:
                async with self._pool.acquire(timeout=5) as conn:
                    record_stats(self.metrics, await outbox_stats(conn))
            except DB_ERRORS as exc:
                log.debug("outbox stats failed: %r", exc)
            except asyncio.CancelledError:
                if cancel_requested():
                    raise
                log.warning("outbox stats cancelled under us; retrying")
            except Exception:  # stale gauges would hide a growing backlog: log, keep going
                log.exception("outbox stats failed unexpectedly")
            await wait_or_stop(stop, self.config.stats_interval_s)

    async def _lane(self, index: int, stop: asyncio.Event) -> None:
        wake = self._wakes[index]
        backoff = Backoff(base_s=0.2, cap_s=5.0)
        db_failures = 0
        while not stop.is_set():
            if not self._broker_up.is_set():
                await _wait_any(stop, self._broker_up)
                continue
            wake.clear()
            channel = self._channel
            try:
                result = await self.relay_batch()
            except DB_ERRORS as exc:
                self._db_ok = False
                log.warning("outbox batch failed on the database (%s); retrying", exc)
                await renew_if_server_gone(self._pool, exc)
                await wait_or_stop(stop, backoff.delay(db_failures))
                db_failures += 1
                continue
            except asyncio.CancelledError:
                if cancel_requested():
                    raise  # a shutdown: the batch rolled back
                # Not ours: a broker connection aiormq gave up on. The batch rolled back.
                log.warning("outbox batch cancelled under us (broker lost); its rows stay")
                await wait_or_stop(stop, backoff.delay(db_failures))
                db_failures += 1
                continue
            except Exception:  # a bug must not silently stop a lane: the batch rolled back
                log.exception("outbox batch failed unexpectedly; its rows stay and are retried")
                await wait_or_stop(stop, backoff.delay(db_failures))
                db_failures += 1
                continue
            self._db_ok = True
            db_failures = 0
            if result.lost:
                # A nack, a confirm that timed out, or a channel that went away mid-batch: an
                # outage of the broker. The channel is replaced (if the broker loop has not
                # noticed already) and this lane backs off, longer with each such batch in a row.
                self._failed_rounds += 1
                if self._channel is channel:
                    self._channel = None
                    self._replace.set()
                await wait_or_stop(stop, backoff.delay(self._failed_rounds))
                continue
            if result.published:
                self._failed_rounds = 0
            if result.claimed == self.config.batch_size and not result.refused:
                continue  # probably more rows: go on without waiting
            if result.published:
                continue  # a partial batch: check once more, then sleep
            await _wait_any(stop, wake, seconds=self.config.poll_interval_s)

    async def relay_batch(self) -> BatchResult:
        """Claim, publish and settle one batch in one database transaction."""
        assert self._pool is not None
        channel = self._channel
        if channel is None or channel.is_closed:
            return BatchResult(0, 0, 0, 0)
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(_CLAIM, self.config.batch_size)
            if not rows:
                return BatchResult(0, 0, 0, 0)
            # Rows refused before, or in flight when the broker closed a channel: one by one.
            alone = [r for r in rows if r["attempts"] > 0 or r["id"] in self._suspects]
            alone_ids = {r["id"] for r in alone}
            together = [r for r in rows if r["id"] not in alone_ids]
            outcomes: dict[int, BaseException | None] = {}
            if alone:
                outcomes.update(await self._publish_alone(channel.connection, alone))
            results = await asyncio.gather(
                *(self._publish(channel, row["record_type"], row["body"]) for row in together),
                return_exceptions=True,
            )
            for row, outcome in zip(together, results, strict=True):
                outcomes[row["id"]] = outcome
            self._suspect([r["id"] for r in together if _closed_by_broker(outcomes[r["id"]])])
            result = await self._settle(conn, rows, [outcomes[r["id"]] for r in rows])
            self._suspects.difference_update(r["id"] for r in rows if _settled(outcomes[r["id"]]))
            return result

    async def _publish_alone(
        self, connection: aiormq.abc.AbstractConnection, rows: Sequence[asyncpg.Record]
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
                        channel = await _open_channel(connection)
                    await self._publish(channel, row["record_type"], row["body"])
                except aiormq.exceptions.PublishError as exc:  # returned: unroutable
                    outcomes[row["id"]] = exc
                except aiormq.exceptions.DeliveryError as exc:  # nacked: the broker's outage
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
                await _close_quietly(channel)
        for row in rows:
            outcomes.setdefault(row["id"], failure)
        return outcomes

    def _suspect(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        limit = 16 * self.config.batch_size * self.config.lanes
        if len(self._suspects) + len(ids) > limit:
            # Rows another relay published stay here; forgetting costs one more channel close.
            self._suspects.clear()
        self._suspects.update(ids)
        log.warning(
            "the broker closed the channel with %d publishes in flight; they go one by one",
            len(ids),
        )

    async def _publish(self, channel: AbstractChannel, record_type: str, body: bytes) -> None:
        # A new Properties object each time: aiormq writes a random message_id into it, which
        # it uses to match a basic.return with its publish.
        properties = aiormq.spec.Basic.Properties(
            content_type="application/json",
            delivery_mode=2,
            message_type=record_type,
            app_id=APP_ID,
        )
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
        published_per_job: Counter[str] = Counter()
        lost_error = ""
        for row, outcome in zip(rows, outcomes, strict=True):
            if outcome is None:
                sent.append(row["id"])
                if row["job_id"] is not None:
                    published_per_job[str(row["job_id"])] += 1
            elif isinstance(outcome, aiormq.exceptions.PublishError | ChannelRefusal):
                refused.append(row["id"])
                reasons.append(_refusal_reason(outcome)[:500])
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
            if published_per_job:
                jobs = sorted(published_per_job)  # one lock order for every lane and relay
                await conn.execute(_COUNT_PUBLISHED, jobs, [published_per_job[j] for j in jobs])
        parked = 0
        if refused:
            updated = await conn.fetch(_REFUSED, refused, reasons, self.config.max_attempts)
            parked_per_job: Counter[str] = Counter(
                str(r["job_id"]) for r in updated if r["parked"] and r["job_id"] is not None
            )
            parked = sum(1 for r in updated if r["parked"])
            if parked_per_job:
                jobs = sorted(parked_per_job)
                await conn.execute(_COUNT_PARKED, jobs, [parked_per_job[j] for j in jobs])
        # Counted here, before the commit: a failed commit re-publishes these rows (a duplicate
        # the recorder absorbs), so the counter may run ahead of the table, never behind.
        self.metrics.outbox_published.inc(len(sent))
        if refused:
            self.metrics.outbox_publish_failures.labels(reason="refused").inc(len(refused))
            log.warning("broker refused %d outbox rows: %s", len(refused), reasons[0])
        if parked:
            self.metrics.outbox_parked.inc(parked)
            log.error("parked %d outbox rows after %d refusals", parked, self.config.max_attempts)
        if lost:
            self.metrics.outbox_publish_failures.labels(reason="lost").inc(lost)
            log.warning("%d publishes lost their confirm (%s); rows stay", lost, lost_error)
        if nacked:
            self.metrics.outbox_publish_failures.labels(reason="nacked").inc(nacked)
            log.warning("broker nacked %d publishes; rows stay", nacked)
        return BatchResult(len(rows), len(sent), len(refused), lost + nacked)


_Starter = Callable[[], Coroutine[Any, Any, None]]

_RESTART_BASE_S = 0.5
_RESTART_CAP_S = 30.0


def _log_death(task: asyncio.Task[None], delay: float) -> None:
    name = task.get_name()
    if task.cancelled():
        log.error("%s was cancelled; restarting it in %.1f s", name, delay)
    elif (exc := task.exception()) is not None:
        log.error("%s died (%r); restarting it in %.1f s", name, exc, delay, exc_info=exc)
    else:
        log.error("%s ended on its own; restarting it in %.1f s", name, delay)


async def _close_quietly(closable: aio_pika.abc.AbstractConnection | AbstractChannel) -> None:
    """Close a connection or channel; a broker that is away cannot make that fail."""
    with broker_failures_suppressed():
        await asyncio.wait_for(closable.close(), 10)


class ChannelRefusal(Exception):
    """The broker closed a channel for a message published alone on it: the message's fault."""

    def __init__(self, cause: aiormq.exceptions.ChannelClosed) -> None:
        super().__init__(_close_text(cause))


def _close_text(exc: aiormq.exceptions.ChannelClosed) -> str:
    # aiormq's channel errors carry the broker's reply text, e.g. 'PRECONDITION_FAILED - message
    # size 1232 is larger than configured max size 1024'
    return " ".join(str(a) for a in exc.args if a is not None) or type(exc).__name__


class _ChannelOpenFailed(Exception):
    """Opening a channel failed: not the fault of the row about to be published on it."""


async def _open_channel(connection: aiormq.abc.AbstractConnection) -> AbstractChannel:
    try:
        return await connection.channel(publisher_confirms=True)
    except Exception as exc:
        raise _ChannelOpenFailed(repr(exc)) from exc


def _closed_by_broker(outcome: BaseException | None) -> bool:
    """The broker closed the channel (a Channel.Close with a reply code), not the connection."""
    return isinstance(outcome, aiormq.exceptions.ChannelClosed) and outcome.args[:1] != (None,)


def _settled(outcome: BaseException | None) -> bool:
    return outcome is None or isinstance(outcome, aiormq.exceptions.PublishError | ChannelRefusal)


def _refusal_reason(exc: aiormq.exceptions.PublishError | ChannelRefusal) -> str:
    if isinstance(exc, ChannelRefusal):
        return f"closed the channel: {exc}"
    frame: Any = exc.frame
    return f"returned: {getattr(frame, 'reply_code', '?')} {getattr(frame, 'reply_text', '')}"


def _setter(event: asyncio.Event) -> Callable[[object], None]:
    def set_event(_: object) -> None:
        event.set()

    return set_event


async def _wait_any(*events: asyncio.Event, seconds: float | None = None) -> None:
    """Until one of ``events`` is set, or ``seconds`` passed."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
