"""Surprising failures while connecting to RabbitMQ: the recorder and the relay keep retrying.

Found by the chaos test in CI: while the RabbitMQ proxy was cut (it accepts a connection and
closes it at once, as a load balancer with no healthy backend does), aiormq raised
StopAsyncIteration out of ``connect()``. The recorder did not count that as a broker failure and
its process died. These tests pin the two halves of the fix: every error such a peer produces is
a broker error, and any other surprise while connecting is logged and retried, never fatal.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
import pytest
import uvloop

import bulk_recorder.infra.db as db_module
import bulk_recorder.producer.relay as relay_module
from bulk_recorder.infra.errors import BROKER_ERRORS
from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer.outbox import outbox_stats
from bulk_recorder.producer.relay import RelayConfig
from consumer.tools.generator import Generator
from consumer.tools.loadgen import LoadSpec, publish_load
from tests.conftest import wait_for
from tests.faults.audit import wait_for_rows
from tests.integration.producer_support import api_client, ndjson, running_relay

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

# Accepts every connection and closes it at once (FIN, not RST), in another process so that the
# close races the client's first read the way a remote peer's does.
_CLOSING_PEER = """
import asyncio

async def main():
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

asyncio.run(main())
"""


async def connect_many(port: int, attempts: int) -> Counter[str]:
    """Connect ``attempts`` times; any error outside BROKER_ERRORS propagates."""
    seen: Counter[str] = Counter()
    for _ in range(attempts):
        try:
            connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/", timeout=5)
        except BROKER_ERRORS as exc:
            seen[type(exc).__name__] += 1
        else:
            await connection.close()
            seen["connected"] += 1
    return seen


async def test_a_peer_that_closes_at_once_only_raises_broker_errors() -> None:
    peer = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CLOSING_PEER, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert peer.stdout is not None
        port = int(await peer.stdout.readline())
        # on the service's own loop: the EOF race that raised StopAsyncIteration shows on uvloop
        seen = await asyncio.to_thread(uvloop.run, connect_many(port, 300))
        assert seen["connected"] == 0
        assert sum(seen.values()) == 300
        print(f"  (connect errors from a peer that closes at once: {dict(seen)})")
    finally:
        peer.kill()
        await peer.wait()


class Flaky:
    """A coroutine function that raises the given errors on its first calls, then does its job."""

    def __init__(self, real: Callable[..., Awaitable[Any]], errors: list[BaseException]) -> None:
        self.real = real
        self.errors = errors
        self.calls = 0

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return await self.real(*args, **kwargs)


def surprises() -> list[BaseException]:
    # what aiormq raised in CI, then an error type no broker list would ever name
    return [StopAsyncIteration(), LookupError("a surprise from the client library")]


async def test_recorder_retries_through_surprising_connect_errors(
    make_settings, start_recorder, db, database_url, monkeypatch, caplog
) -> None:
    settings = make_settings(bulk_recorder_size=50)
    await migrate(database_url)
    flaky = Flaky(aio_pika.connect, surprises())
    monkeypatch.setattr(aio_pika, "connect", flaky)
    with caplog.at_level(logging.WARNING, logger="consumer"):
        rec = await start_recorder(settings)
        # two loops connect (consuming, and publishing dead letters): each surprise hit one of
        # them, and whichever it hit retried; a call succeeds only once the surprises are spent
        await wait_for(lambda: rec.recorder._publisher.connected)
    assert not rec.task.done()
    assert flaky.errors == []
    assert flaky.calls == 2 + len(surprises())
    assert "StopAsyncIteration" in caplog.text
    assert "LookupError" in caplog.text
    report = await publish_load(
        settings.rabbitmq_url, settings.rabbitmq_exchange, LoadSpec("mixed", 500, seed=7)
    )
    await wait_for_rows(await db(), report.valid, timeout=60)


async def test_relay_retries_through_surprising_connect_errors(
    make_settings, db, monkeypatch, caplog
) -> None:
    settings = make_settings()
    gen = Generator.create(11)
    lines = [gen.credit_annotation() for _ in range(300)]
    async with api_client(settings) as (client, _):
        response = await client.post(
            "/v1/credit-annotation-jobs",
            content=ndjson(lines),
            headers={"content-type": "application/x-ndjson"},
        )
        assert response.status_code == 202, response.text
    flaky = Flaky(aio_pika.connect, surprises())
    monkeypatch.setattr(aio_pika, "connect", flaky)
    with caplog.at_level(logging.WARNING, logger="bulk_recorder"):
        async with running_relay(settings) as relay:
            await wait_for(lambda: relay.published == len(lines), timeout=60)
            assert not relay.task.done()
    assert flaky.errors == []
    assert flaky.calls == 3
    assert "StopAsyncIteration" in caplog.text
    assert "unexpected error on the broker connection" in caplog.text
    conn = await db()
    assert await conn.fetchval("SELECT count(*) FROM outbox") == 0


async def test_a_failing_relay_still_stops_at_once_when_asked(make_settings, monkeypatch) -> None:
    """The catch-all must not swallow a stop: a relay asked to stop while failing ends quickly."""
    settings = make_settings()
    flaky = Flaky(aio_pika.connect, [LookupError("again")] * 1000)
    monkeypatch.setattr(aio_pika, "connect", flaky)
    async with running_relay(settings) as relay:
        await wait_for(lambda: flaky.calls >= 3, timeout=30)
        relay.stop.set()
        await asyncio.wait_for(relay.task, 10)


async def test_database_connect_retries_through_a_surprise(
    database_url, monkeypatch, caplog
) -> None:
    flaky = Flaky(migrate, [LookupError("a surprise from the driver")])
    monkeypatch.setattr(db_module, "migrate", flaky)
    with caplog.at_level(logging.WARNING, logger="bulk_recorder.infra.db"):
        pool = await db_module.open_pool_when_ready(database_url, max_size=2, stop=asyncio.Event())
    assert pool is not None
    try:
        assert flaky.calls == 2
        assert "unexpected error while connecting to the database" in caplog.text
        assert await pool.fetchval("SELECT count(*) FROM transactions") == 0
    finally:
        await pool.close()


async def test_relay_stats_loop_survives_a_surprise(make_settings, db, monkeypatch, caplog) -> None:
    flaky = Flaky(outbox_stats, [LookupError("a surprise reading the backlog")])
    monkeypatch.setattr(relay_module, "outbox_stats", flaky)
    config = RelayConfig(batch_size=200, poll_interval_s=0.2, stats_interval_s=0.05)
    with caplog.at_level(logging.WARNING, logger="bulk_recorder"):
        async with running_relay(make_settings(), config) as relay:
            await wait_for(lambda: flaky.calls >= 3, timeout=30)
            assert not relay.task.done()
    assert "outbox stats failed unexpectedly" in caplog.text
