"""The recorder's own publishing connection: dead letters and released deliveries.

Why a connection of its own: during a memory or disk alarm RabbitMQ blocks every connection that
publishes and stops reading from it (and aiormq stops writing to a blocked connection). Acks
that shared it would stop too, and intake would stall exactly when the queue needs draining.
The consumer's connection never publishes, so an alarm never blocks it.

A publish counts as done only when the broker has routed the message to a queue and confirmed
it, within ``confirm_timeout_s``: it is ``mandatory``, so a message that reaches no queue (the
DLQ was deleted) comes back as a return instead of being confirmed and dropped. A return means
our topology is gone: it is declared again. A refusal (nack: a queue at its max-length with
``reject-publish``), a timeout (a blocked connection), a lost connection: each is a failed
publish that the caller may retry.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable

import aio_pika
import aiormq
from aiormq.abc import AbstractChannel
from pamqp import commands as spec

from bulk_recorder.infra.broker import (
    BrokerNodes,
    broker_failures_suppressed,
    cancel_requested,
)
from bulk_recorder.infra.errors import BROKER_ERRORS
from bulk_recorder.infra.reconnect import Session, keep_connected
from consumer.topology import Topology, declare_topology

log = logging.getLogger(__name__)

# A return makes us declare the topology again, but not more often than this.
REDECLARE_INTERVAL_S = 1.0


class CopyPublisher:
    """Mandatory, confirmed publishes on a connection of their own, reconnected after any loss."""

    def __init__(self, url: str, topology: Topology, *, confirm_timeout_s: float) -> None:
        self._nodes = BrokerNodes.from_setting(url)  # one URL, or one per cluster node
        self._topology = topology
        self.confirm_timeout_s = confirm_timeout_s
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._connected = asyncio.Event()
        # publishes of one message id, one at a time: aiormq matches a return to its publish by
        # message id, and a return matched to another in-flight copy would confirm the wrong one
        self._in_flight: dict[str, asyncio.Future[None]] = {}
        self._redeclare: asyncio.Task[None] | None = None
        self._last_redeclare = 0.0

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def wait_connected(self) -> None:
        await self._connected.wait()

    async def run(self, stop: asyncio.Event) -> None:
        """Keep the connection up until ``stop``; declare the topology on every connect."""
        session = Session(self._open, lambda connection: self._hold(connection, stop), self._lost)
        await keep_connected(self._nodes, session, stop, what="publishing connection", logger=log)

    async def _open(self, connection: aio_pika.abc.AbstractConnection) -> None:
        await self._declare(connection)
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        underlay = await channel.get_underlay_channel()
        self._connection, self._channel = connection, underlay
        self._connected.set()
        log.info("publishing connection up")

    async def _hold(self, connection: aio_pika.abc.AbstractConnection, stop: asyncio.Event) -> int:
        assert self._channel is not None
        await _until_closed(connection, self._channel, stop)
        if not stop.is_set():
            log.warning("publishing connection or channel closed; reconnecting")
        return 0

    async def _lost(self, stopping: bool) -> None:
        self._connected.clear()
        self._channel = None
        if self._redeclare is not None:
            self._redeclare.cancel()

    async def publish(
        self,
        body: bytes,
        properties: spec.Basic.Properties,
        *,
        exchange: str,
        routing_key: str,
        wanted: Callable[[], bool] | None = None,
    ) -> str | None:
        """Publish and wait until routed and confirmed. Returns None, or why it failed.

        ``wanted`` is asked once the connection is there, just before the publish: a copy of a
        delivery whose channel closed meanwhile would only be a second one (the broker
        redelivers the original)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.confirm_timeout_s
        if properties.message_id is None:
            properties.message_id = uuid.uuid4().hex
        message_id = properties.message_id
        while (earlier := self._in_flight.get(message_id)) is not None:
            await asyncio.wait({earlier}, timeout=max(0.0, deadline - loop.time()))
            if loop.time() >= deadline:
                return "no confirm in time (another copy of this message is in flight)"
        done: asyncio.Future[None] = loop.create_future()
        self._in_flight[message_id] = done
        try:
            return await self._publish(body, properties, exchange, routing_key, deadline, wanted)
        finally:
            del self._in_flight[message_id]
            done.set_result(None)

    async def _publish(
        self,
        body: bytes,
        properties: spec.Basic.Properties,
        exchange: str,
        routing_key: str,
        deadline: float,
        wanted: Callable[[], bool] | None,
    ) -> str | None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(deadline):
                await self._connected.wait()
                channel = self._channel
                if channel is None or channel.is_closed:
                    return "the publishing channel is closed"
                # a connection the broker blocked (memory or disk alarm) would queue the frame
                # and send it whenever the alarm clears: wait here instead, within the deadline
                await channel.connection.ready()
                if wanted is not None and not wanted():
                    return "no longer wanted"
                await channel.basic_publish(
                    body,
                    exchange=exchange,
                    routing_key=routing_key,
                    properties=properties,
                    mandatory=True,
                    timeout=max(0.001, deadline - loop.time()),
                )
        except aiormq.exceptions.PublishError as exc:
            self._redeclare_soon()
            return f"returned unroutable ({_reply_text(exc)})"
        except aiormq.exceptions.DeliveryError as exc:
            return f"refused by the broker ({_reply_text(exc)})"
        except TimeoutError:
            return f"no confirm within {self.confirm_timeout_s:g} s"
        except asyncio.CancelledError:
            # aiormq cancels the pending confirms of a connection it gives up
            if cancel_requested():
                raise
            return "the publishing connection was lost"
        except BROKER_ERRORS as exc:
            return f"the publishing channel failed: {exc!r}"
        return None

    def _redeclare_soon(self) -> None:
        """A return says an exchange routes nowhere: our DLQ or queue was deleted."""
        now = asyncio.get_running_loop().time()
        if self._redeclare is not None and not self._redeclare.done():
            return
        if now - self._last_redeclare < REDECLARE_INTERVAL_S or self._connection is None:
            return
        self._last_redeclare = now
        self._redeclare = asyncio.create_task(self._declare(self._connection))

    async def _declare(self, connection: aio_pika.abc.AbstractConnection) -> None:
        """Declare the topology on a channel of its own (best effort: a queue that exists with
        other arguments closes that channel; the consumer side reports the mismatch)."""
        try:
            channel = await connection.channel()
            try:
                await declare_topology(channel, self._topology)
            finally:
                with broker_failures_suppressed():
                    await channel.close()
        except BROKER_ERRORS as exc:
            log.warning("declaring the topology from the publishing connection failed: %r", exc)
        except asyncio.CancelledError:
            if cancel_requested():
                raise
            log.warning("declaring the topology failed: the connection was given up")
        except Exception:  # a surprise from the client library: the next return tries again
            log.exception("unexpected error declaring the topology from the publishing connection")


async def _until_closed(
    connection: aio_pika.abc.AbstractConnection, channel: AbstractChannel, stop: asyncio.Event
) -> None:
    closed = asyncio.ensure_future(connection.closed())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({closed, channel.closing, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for fut in (closed, stopped):
            fut.cancel()


def _reply_text(exc: aiormq.exceptions.DeliveryError) -> str:
    frame = exc.frame
    if isinstance(frame, spec.Basic.Return):
        return f"{frame.reply_code} {frame.reply_text}"
    return type(frame).__name__ if frame is not None else "no frame"
