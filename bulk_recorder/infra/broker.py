"""What a broker that is away looks like to aio-pika and aiormq, and which node to try next.

One tuple for every loop that connects to RabbitMQ (the recorder, the relay, the DLQ tools), so
that they all treat the same failures as "reconnect later" rather than as a crash; and one
:class:`BrokerNodes` for every command, so that a cluster given as several URLs is used the same
way everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Iterator, Sequence

import aio_pika

from bulk_recorder.exceptions import EXIT_TOPOLOGY, BulkRecorderError
from bulk_recorder.infra.errors import BROKER_ERRORS
from bulk_recorder.masking import endpoint as endpoint  # for the callers that name it here
from bulk_recorder.url_checks import UnreadableUrl

log = logging.getLogger(__name__)


class TopologyMismatch(BulkRecorderError):
    """The broker already has our queue or an exchange declared with other arguments.

    Retrying cannot help (the broker answers PRECONDITION_FAILED every time): ``consume`` and
    ``relay`` stop with exit code 3 and a message that says which settings must match. Not one
    of :data:`BROKER_ERRORS`, on purpose.
    """

    exit_code = EXIT_TOPOLOGY


def cancel_requested() -> bool:
    """True when the running task was asked to stop (``Task.cancel()``: shutdown, a caller).

    Only ``Task.cancel()`` counts a request in ``Task.cancelling()`` (Python 3.11). aiormq fails
    the futures of a connection it gives up with ``CancelledError`` set as their exception (and
    cancels its own RPC tasks, not ours), which leaves the count at 0: a CancelledError seen
    while this is False means "the broker is gone", and the caller must handle it as a broker
    failure instead of ending.
    """
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


@contextlib.contextmanager
def broker_failures_suppressed() -> Iterator[None]:
    """Suppress what a broker that is gone raises, ``CancelledError`` from aiormq included;
    a real cancellation of the running task still propagates."""
    try:
        yield
    except BROKER_ERRORS as exc:
        log.debug("broker call failed: %r", exc)
    except asyncio.CancelledError:
        if cancel_requested():
            raise
        log.debug("broker call failed: the connection was given up")


def split_urls(value: str) -> tuple[str, ...]:
    """The node URLs of a ``RABBITMQ_URL`` that may list several, comma-separated."""
    return tuple(part.strip() for part in value.split(","))


class BrokerNodes:
    """The nodes of a RabbitMQ cluster, tried one at a time.

    ``connect()`` starts at a random node, so that the replicas of a service spread their
    connections over the cluster, and moves to the next node when a connect fails. After a
    connection is lost the caller connects again and gets the node after the one it lost: a
    node that just died is tried last. One URL behaves exactly as a plain ``aio_pika.connect``.
    """

    def __init__(self, urls: Sequence[str], *, rng: random.Random | None = None) -> None:
        if not urls:
            raise ValueError("at least one broker URL is needed")
        self.urls = tuple(urls)
        self._next = (rng or random.Random()).randrange(len(self.urls))
        self.current: str | None = None
        self.tried: str = self.urls[self._next]  # the node of the last connect, for log lines

    @property
    def where(self) -> str:
        """``host:port/vhost`` of the node last tried (no user, no password)."""
        return endpoint(self.tried)

    @classmethod
    def from_setting(cls, value: str) -> BrokerNodes:
        return cls(split_urls(value))

    def order(self) -> list[str]:
        """The URLs in the order the next ``connect()`` tries them."""
        n = len(self.urls)
        return [self.urls[(self._next + i) % n] for i in range(n)]

    async def connect(self, *, wait_s: float = 10) -> aio_pika.abc.AbstractConnection:
        """Connect to the first node that answers; raise the last node's error if none does.

        ``wait_s`` bounds each node's connect (aio-pika's own timeout). A node URL yarl cannot
        parse raises :class:`UnreadableUrl` (yarl's error may quote it)."""
        error: BaseException | None = None
        for url in self.order():
            self._next = (self.urls.index(url) + 1) % len(self.urls)
            self.tried = url
            if len(self.urls) > 1:
                log.info("connecting to RabbitMQ node %s", endpoint(url))
            try:
                connection = await aio_pika.connect(url, timeout=wait_s)
            except BROKER_ERRORS as exc:
                error = exc
                if len(self.urls) > 1:
                    log.warning("RabbitMQ node %s failed: %r", endpoint(url), exc)
                continue
            except ValueError:
                raise UnreadableUrl("RABBITMQ_URL") from None
            self.current = url
            if len(self.urls) > 1:
                log.info("connected to RabbitMQ node %s", endpoint(url))
            return connection
        assert error is not None
        raise error
