"""keep_connected, the one reconnect loop: what ends a session, how it is logged, how it backs off.

The broker is faked here (the loop's logic is pure: connect, set up, hold, classify, back off);
tests/faults/test_connect_surprises.py, test_partition.py and test_relay_partition.py make the
same failures for real against RabbitMQ through the recorder, its publisher and the relay.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import pytest

from bulk_recorder.infra.backoff import Backoff
from bulk_recorder.infra.broker import BrokerNodes, TopologyMismatch
from bulk_recorder.infra.reconnect import Session, keep_connected
from tests.conftest import wait_for

URLS = ("amqp://u:pw@n1:5672/", "amqp://u:pw@n2:5672/")


class FakeConnection:
    def __init__(self, url: str) -> None:
        self.url = url
        self.closed = False

    async def close(self) -> None:
        self.closed = True


class FakeConnect:
    """Stands in for aio_pika.connect: raises what ``failures`` holds, in turn, then connects."""

    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = failures
        self.made: list[FakeConnection] = []
        self.tried: list[str] = []

    async def __call__(self, url: str, **_: Any) -> FakeConnection:
        self.tried.append(url)
        if self.failures:
            raise self.failures.pop(0)
        self.made.append(FakeConnection(url))
        return self.made[-1]


@pytest.fixture
def connect(monkeypatch: pytest.MonkeyPatch) -> FakeConnect:
    fake = FakeConnect([])
    monkeypatch.setattr(aio_pika, "connect", fake)
    return fake


@dataclass
class Noted(Backoff):
    """No wait at all; notes each attempt the loop backs off with."""

    attempts: list[int] = field(default_factory=list)

    def delay(self, attempt: int) -> float:
        self.attempts.append(attempt)
        return 0.0


@dataclass
class Script:
    """A session whose holds end as ``ends`` says (an int returned, or an exception raised);
    the stop is set once they are spent."""

    stop: asyncio.Event
    ends: list[int | BaseException]
    setups: int = 0
    teardowns: list[bool] = field(default_factory=list)

    async def setup(self, connection: Any) -> None:
        self.setups += 1

    async def hold(self, connection: Any) -> int:
        if not self.ends:
            self.stop.set()
            return 0
        end = self.ends.pop(0)
        if isinstance(end, BaseException):
            raise end
        return end

    async def teardown(self, stopping: bool) -> None:
        self.teardowns.append(stopping)

    def session(self) -> Session:
        return Session(self.setup, self.hold, self.teardown)


def nodes() -> BrokerNodes:
    return BrokerNodes(URLS, rng=random.Random(0))


def backoff_noted() -> Noted:
    return Noted(base_s=0.2, cap_s=5.0)


async def test_a_failed_connect_is_logged_backed_off_and_the_next_node_tried(
    connect: FakeConnect, caplog: pytest.LogCaptureFixture
) -> None:
    stop = asyncio.Event()
    script = Script(stop, [])
    connect.failures = [ConnectionRefusedError(111, "refused")] * 3
    backoff = backoff_noted()
    brokers = nodes()
    first = brokers.order()[0]
    with caplog.at_level(logging.WARNING):
        await keep_connected(brokers, script.session(), stop, what="test link", backoff=backoff)
    # one connect() tries both nodes: the first round fails on both, the second on the first
    assert connect.tried[:3] == [first, brokers.urls[1 - URLS.index(first)], first]
    assert backoff.attempts == [0]  # one failed round, then connected
    assert script.setups == 1
    assert "test link: broker at" in caplog.text
    assert "ConnectionRefusedError" in caplog.text
    assert "pw" not in caplog.text  # the node is named without its password


async def test_failures_in_a_row_back_off_longer_and_a_setup_starts_over(
    connect: FakeConnect,
) -> None:
    stop = asyncio.Event()
    lost = ConnectionResetError("lost")
    script = Script(stop, [lost, 3])
    connect.failures = [ConnectionRefusedError(111, "refused")] * 4  # two rounds of two nodes
    backoff = backoff_noted()
    await keep_connected(nodes(), script.session(), stop, what="x", backoff=backoff)
    # two failed rounds (0, 1); the setup resets; a hold that raised backs off from 0; a hold
    # that returned 3 goes on with 3
    assert backoff.attempts == [0, 1, 0, 3]
    assert script.setups == 3
    assert script.teardowns == [False, False, False, False, True]  # failed connects too
    assert [c.closed for c in connect.made] == [True, True, True]


async def test_a_cancelled_error_nobody_asked_for_is_a_lost_broker(
    connect: FakeConnect, caplog: pytest.LogCaptureFixture
) -> None:
    """aiormq fails the futures of a connection it gave up with CancelledError: the loop must
    reconnect, not end."""
    stop = asyncio.Event()
    script = Script(stop, [asyncio.CancelledError()])
    with caplog.at_level(logging.WARNING):
        await keep_connected(nodes(), script.session(), stop, what="x", backoff=backoff_noted())
    assert script.setups == 2
    assert "broker connection given up" in caplog.text


async def test_a_real_cancel_ends_the_loop_at_once(connect: FakeConnect) -> None:
    stop = asyncio.Event()
    held = asyncio.Event()
    tore_down: list[bool] = []

    async def hold(connection: Any) -> int:
        held.set()
        await asyncio.Event().wait()
        return 0

    async def teardown(stopping: bool) -> None:
        tore_down.append(stopping)

    async def setup(connection: Any) -> None:
        pass

    task = asyncio.create_task(
        keep_connected(nodes(), Session(setup, hold, teardown), stop, what="x")
    )
    await wait_for(held.is_set)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert task.cancelled()
    assert tore_down == [False]
    assert connect.made[0].closed


async def test_a_fatal_error_propagates_after_the_teardown(connect: FakeConnect) -> None:
    stop = asyncio.Event()
    script = Script(stop, [TopologyMismatch("queue arguments differ")])
    with pytest.raises(TopologyMismatch):
        await keep_connected(nodes(), script.session(), stop, what="x", fatal=(TopologyMismatch,))
    assert script.teardowns == [False]
    assert connect.made[0].closed


async def test_a_surprise_is_logged_with_its_traceback_and_retried(
    connect: FakeConnect, caplog: pytest.LogCaptureFixture
) -> None:
    stop = asyncio.Event()
    script = Script(stop, [LookupError("a surprise from the client library")])
    with caplog.at_level(logging.WARNING):
        await keep_connected(nodes(), script.session(), stop, what="x", backoff=backoff_noted())
    assert script.setups == 2
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "unexpected error on the broker connection" in errors[0].getMessage()
    assert errors[0].exc_info is not None


async def test_a_stop_ends_the_session_and_may_leave_the_connection_open(
    connect: FakeConnect,
) -> None:
    """The recorder acks its final flush on the connection a stop left open."""
    for close_on_stop in (False, True):
        stop = asyncio.Event()
        script = Script(stop, [])
        await keep_connected(nodes(), script.session(), stop, what="x", close_on_stop=close_on_stop)
        assert script.teardowns == [True]
        assert connect.made[-1].closed is close_on_stop


async def test_nothing_is_tried_once_stop_is_set(connect: FakeConnect) -> None:
    stop = asyncio.Event()
    stop.set()
    await keep_connected(nodes(), Script(stop, []).session(), stop, what="x")
    assert connect.tried == []
