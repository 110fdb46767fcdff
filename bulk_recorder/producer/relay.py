"""The :class:`Relay` that empties the transactional outbox (:mod:`bulk_recorder.producer.outbox`).

The relay, in each of its lanes, repeats one database transaction:

1. claim up to ``batch_size`` unsent rows in id order with ``FOR UPDATE SKIP LOCKED`` (several
   lanes and several relay processes take disjoint batches), looking from where the relay's
   last claim started and now and then from the start (:mod:`~bulk_recorder.producer.relay_claim`),
2. publish them all at once on a confirm channel (the whole batch in flight, never one confirm
   awaited after another) with the message properties of docs/messages.md and
   ``mandatory`` set, so that an unroutable message is never counted as sent,
3. delete the rows the broker confirmed and add them to their jobs' ``published`` count; a
   refused row (its lone publish closed the channel) gets a later ``available_at`` and is
   parked after ``max_attempts`` refusals; a row that was nacked, returned as unroutable, or
   in flight when the connection died or its confirm timed out, is left untouched (an outage
   is not bad data),
4. commit.

A nack or a lost confirm on a channel that is still open is an outage of the broker (a quorum
queue without a leader or a majority, a queue full with ``reject-publish``), and so is a return:
the exchange routes every key to our queue, so a return says the queue or its binding is gone.
The lane asks the broker loop to replace the connection and channel (the next connect tries the
next node of a cluster, and declares the topology again) and backs off, doubling with every
batch that fails so in a row.

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
(a bug) is logged, makes :meth:`Relay.ready` false and is started again after a growing backoff
(:mod:`bulk_recorder.infra.supervisor`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial

import aio_pika
import asyncpg
from aiormq.abc import AbstractChannel

from bulk_recorder.infra.backoff import RETRY
from bulk_recorder.infra.broker import (
    BrokerNodes,
    TopologyMismatch,
    cancel_requested,
)
from bulk_recorder.infra.db import open_pool_when_ready
from bulk_recorder.infra.errors import DB_ERRORS, renew_if_server_gone
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.infra.reconnect import Session, keep_connected
from bulk_recorder.infra.stop_budget import CLOSE_OK_S, Deadline, stop_budget
from bulk_recorder.infra.supervisor import Supervisor
from bulk_recorder.infra.waits import wait_any, wait_or_stop
from bulk_recorder.producer.outbox import listen, outbox_stats, record_stats
from bulk_recorder.producer.relay_batch import (
    BatchResult,
    BatchSender,
    RelayConfig,
)
from settings import Settings

__all__ = ["BatchResult", "Relay", "RelayConfig"]

log = logging.getLogger(__name__)

Declare = Callable[[aio_pika.abc.AbstractChannel], Awaitable[None]]


class Relay:
    """Publishes outbox rows; ``run(stop)`` returns after an orderly shutdown.

    ``declare`` is called with a fresh channel after every (re)connect, before the first
    publish: the service passes its topology declaration so that messages are routable even
    before a recorder ever ran, and again after a return (the queue was deleted). Publishes are
    ``mandatory``: without a bound queue the broker returns them and the rows stay untouched
    (an outage, retried after a backoff), they are never dropped nor parked for it. A
    ``declare`` that raises :class:`TopologyMismatch` (our queue exists with other arguments)
    stops the relay: retrying cannot help, and ``run`` raises it after an orderly stop.
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
        self.metrics = metrics or Metrics(role="relay")
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
        self._tasks = Supervisor()  # the long-lived tasks (run() makes one that knows stop)
        self._batches = BatchSender(self.config, self.metrics, self.exchange)
        self._failed_rounds = 0  # batches in a row with a nack or a lost confirm
        self._stopping: asyncio.Event | None = None  # run's stop, set on a topology mismatch
        self._mismatch: TopologyMismatch | None = None
        self.stop_budget = stop_budget("relay", settings)

    # -- readiness --------------------------------------------------------------------------

    def ready(self) -> tuple[bool, str]:
        broker = "up" if self._broker_up.is_set() else "down"
        database = "up" if self._db_ok else "down"
        detail = f"broker {broker}, database {database}"
        dead = self._tasks.down()
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
        log.info("%s", self.stop_budget.describe())
        deadline = self.stop_budget.deadline()
        self._stopping = stop
        self.metrics.outbox_last_publish.set_to_current_time()  # "never" reads as "since start"
        try:
            if not await self._connect_database(stop):
                return
            run = self._tasks = Supervisor(stop)
            run.start("relay-broker", partial(self._broker_loop, self._halt))
            run.start("relay-listen", partial(listen, s.database_url, self.wake, self._halt))
            run.start("relay-stats", partial(self._stats_loop, self._halt))
            for i in range(c.lanes):
                run.start(f"relay-lane-{i}", partial(self._lane, i, stop))
            await stop.wait()
            deadline.start()
            log.info("relay stopping: finishing the batches in flight")
            # A lane finishes its batch (confirmed and deleted, or rolled back); bounded.
            lanes = self._tasks.tasks("relay-lane-")
            if lanes:
                _, pending = await asyncio.wait(lanes, timeout=deadline.left_for("batches"))
                for task in pending:
                    task.cancel()
        finally:
            await self._close(deadline)
        if self._mismatch is not None:
            raise self._mismatch

    async def _close(self, deadline: Deadline) -> None:
        """End the lanes, then the broker loop (it closes its connection on halt) and the
        other loops, then the pool: each within what is left of the stop budget."""
        self._halt.set()
        self._tasks.close()
        await self._tasks.cancel("relay-lane-", within_s=deadline.left(CLOSE_OK_S))
        rest = [t for t in self._tasks.tasks() if not t.get_name().startswith("relay-lane-")]
        # the connection's close, once cancelled, may take CLOSE_OK_S more
        _, pending = (
            await asyncio.wait(rest, timeout=deadline.left(CLOSE_OK_S)) if rest else ((), ())
        )
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=deadline.left())
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), deadline.left())
            except TimeoutError:
                self._pool.terminate()
        log.info("relay stopped in %.1f s", deadline.elapsed())

    async def _connect_database(self, stop: asyncio.Event) -> bool:
        self._pool = await open_pool_when_ready(
            self.settings.database_url,
            max_size=self.config.lanes + 1,
            stop=stop,
            custom_plans=True,  # the outbox swings from empty to a whole job in one commit
        )
        self._db_ok = self._pool is not None
        return self._db_ok

    async def _broker_loop(self, stop: asyncio.Event) -> None:
        try:
            await keep_connected(
                self._nodes,
                Session(self._open, lambda connection: self._hold(connection, stop), self._lost),
                stop,
                what="relay",
                logger=log,
                fatal=(TopologyMismatch,),  # the broker refuses our topology: retrying cannot help
            )
        except TopologyMismatch as exc:
            self._give_up(exc)

    async def _open(self, connection: aio_pika.abc.AbstractConnection) -> None:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        if self._declare is not None:
            await self._declare(channel)
        underlay = await channel.get_underlay_channel()
        self._replace.clear()
        self._channel = underlay
        self._broker_up.set()
        log.info("relay connected to the broker; publishing to %s", self.exchange)
        self.wake()

    async def _lost(self, stopping: bool) -> None:
        self._broker_up.clear()
        self._channel = None

    def _give_up(self, mismatch: TopologyMismatch) -> None:
        """The broker refuses our topology: stop the relay; ``run`` raises ``mismatch``."""
        self._mismatch = mismatch
        if self._stopping is not None:
            self._stopping.set()

    async def _hold(self, connection: aio_pika.abc.AbstractConnection, stop: asyncio.Event) -> int:
        """Wait until the connection or channel is lost, a lane asks for them to be replaced,
        or ``stop``; the backoff attempt to go on with (0 after a loss: reconnect at once)."""
        underlay = self._channel
        assert underlay is not None
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
            return 0
        if self._replace.is_set() and not underlay.is_closed:
            log.warning(
                "replacing the broker connection and channel after a nack, a return or a "
                "lost confirm; rows wait in the outbox"
            )
            return self._failed_rounds
        log.warning("relay lost the broker connection; rows wait in the outbox")
        return 0

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
        db_failures = 0
        while not stop.is_set():
            if not self._broker_up.is_set():
                await wait_any(stop, self._broker_up)
                continue
            wake.clear()
            channel = self._channel
            try:
                result = await self.relay_batch()
            except DB_ERRORS as exc:
                self._db_ok = False
                log.warning("outbox batch failed on the database (%s); retrying", exc)
                await renew_if_server_gone(self._pool, exc)
                await wait_or_stop(stop, RETRY.delay(db_failures))
                db_failures += 1
                continue
            except asyncio.CancelledError:
                if cancel_requested():
                    raise  # a shutdown: the batch rolled back
                # Not ours: a broker connection aiormq gave up on. The batch rolled back.
                log.warning("outbox batch cancelled under us (broker lost); its rows stay")
                await wait_or_stop(stop, RETRY.delay(db_failures))
                db_failures += 1
                continue
            except Exception:  # a bug must not silently stop a lane: the batch rolled back
                log.exception("outbox batch failed unexpectedly; its rows stay and are retried")
                await wait_or_stop(stop, RETRY.delay(db_failures))
                db_failures += 1
                continue
            self._db_ok = True
            db_failures = 0
            if result.lost:
                # A nack, a return, a confirm that timed out, or a channel that went away
                # mid-batch: an outage of the broker. The channel is replaced (if the broker
                # loop has not noticed already; the reconnect declares the topology again) and
                # this lane backs off, longer with each such batch in a row.
                self._failed_rounds += 1
                if self._channel is channel:
                    self._channel = None
                    self._replace.set()
                await wait_or_stop(stop, RETRY.delay(self._failed_rounds))
                continue
            if result.published:
                self._failed_rounds = 0
            if result.claimed == self.config.batch_size and not result.refused:
                continue  # probably more rows: go on without waiting
            if result.published:
                continue  # a partial batch: check once more, then sleep
            await wait_any(stop, wake, seconds=self.config.poll_interval_s)

    async def relay_batch(self) -> BatchResult:
        """Claim, publish and settle one batch in one database transaction."""
        assert self._pool is not None
        channel = self._channel
        if channel is None or channel.is_closed:
            return BatchResult(0, 0, 0, 0)
        async with self._pool.acquire() as conn, conn.transaction():
            return await self._batches.relay(conn, channel)
