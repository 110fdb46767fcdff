"""One way to stay connected to RabbitMQ: :func:`keep_connected`.

Every long-lived connection of the service (the recorder's consumer, its dead-letter publisher,
the relay) is kept by the same loop: connect to the next node of :class:`BrokerNodes`, open the
caller's :class:`Session` on it (channels, declarations), hold it until it is lost, then
classify what ended it, log one line, and back off with :data:`RETRY` before the next node.

What ends a session is classified in one place:

- a failure of the broker (:data:`BROKER_ERRORS`): a warning, and the next connect;
- a ``CancelledError`` while no cancel of the running task was requested: aiormq fails every
  pending future of a connection it gave up (a partition past the heartbeat grace) this way.
  It is a broker failure, not a request to stop (:func:`cancel_requested`);
- a real cancellation of the task (a shutdown): it propagates at once;
- one of the caller's ``fatal`` errors (a topology the broker refuses): it propagates, since no
  retry can help;
- anything else: a surprise from the client library, logged with its traceback, then retried.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aio_pika

from bulk_recorder.infra.backoff import RETRY, Backoff
from bulk_recorder.infra.broker import (
    BrokerNodes,
    broker_failures_suppressed,
    cancel_requested,
)
from bulk_recorder.infra.errors import BROKER_ERRORS
from bulk_recorder.infra.waits import wait_or_stop

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0

Connection = aio_pika.abc.AbstractConnection


@dataclass(frozen=True, slots=True)
class Session:
    """What a caller does with each connection :func:`keep_connected` opens.

    ``setup(connection)`` opens channels and declares; once it returned, the connection counts
    as up and the backoff starts over. ``hold(connection)`` returns when the connection, its
    channel, or the caller is done with it (``stop``), with the backoff attempt to go on with
    (0: reconnect after the shortest wait). ``teardown(stopping)`` runs after every session,
    whether setup succeeded or not, before the connection is closed.
    """

    setup: Callable[[Connection], Awaitable[None]]
    hold: Callable[[Connection], Awaitable[int]]
    teardown: Callable[[bool], Awaitable[None]] | None = None


async def keep_connected(
    nodes: BrokerNodes,
    session: Session,
    stop: asyncio.Event,
    *,
    what: str,
    logger: logging.Logger | None = None,
    fatal: tuple[type[Exception], ...] = (),
    close_on_stop: bool = True,
    backoff: Backoff = RETRY,
) -> None:
    """Connect, run ``session``, and again after any loss, until ``stop`` is set.

    ``what`` names the connection in the log lines (``logger``: the caller's, by default this
    module's). ``close_on_stop=False`` leaves the last connection open when ``stop`` ends it:
    the recorder still acks its final flush on it and closes it itself.
    """
    out = logger or log
    attempt = 0
    outage = OutageLog(out, what)
    while not stop.is_set():
        connection: Connection | None = None
        try:
            connection = await nodes.connect()
            await session.setup(connection)
            outage.up(nodes.where)
            attempt = 0
            attempt = await session.hold(connection)
        except fatal:
            raise
        except BROKER_ERRORS as exc:
            outage.failed(nodes.where, exc)
            out.debug("broker failure", exc_info=True)
        except asyncio.CancelledError:
            if cancel_requested():
                raise
            out.warning(
                "%s: broker connection given up (no frame within the heartbeat grace); "
                "reconnecting",
                what,
            )
            out.debug("broker failure", exc_info=True)
        except Exception:  # a surprise from the client library must not end the service
            out.exception("%s: unexpected error on the broker connection; reconnecting", what)
        finally:
            if session.teardown is not None:
                await session.teardown(stop.is_set())
            if connection is not None and (close_on_stop or not stop.is_set()):
                with broker_failures_suppressed():
                    await asyncio.wait_for(connection.close(), CLOSE_TIMEOUT_S)
        if stop.is_set():
            break
        await wait_or_stop(stop, backoff.delay(attempt))
        attempt += 1


class OutageLog:
    """One line per change of a connection's state: the first failure of an outage is a
    warning, every retry after it a debug line, and the first connect after it an info line.
    A broker down for an hour is two lines, not one a retry (aiormq's own ERROR for each
    refused connect is dropped: :func:`bulk_recorder.infra.logs.quiet_aiormq_connect_errors`)."""

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self._log = logger
        self._what = what
        self._failures = 0

    def failed(self, where: str, exc: BaseException) -> None:
        if self._failures == 0:
            self._log.warning("%s: broker at %s failed (%r); reconnecting", self._what, where, exc)
        else:
            self._log.debug("%s: broker at %s still down (%r)", self._what, where, exc)
        self._failures += 1

    def up(self, where: str) -> None:
        if self._failures:
            self._log.info(
                "%s: broker at %s reachable again after %d failed attempts",
                self._what,
                where,
                self._failures,
            )
        self._failures = 0
