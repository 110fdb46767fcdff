"""When the relay publishes a row (docs/producer.md): it wakes on ``LISTEN/NOTIFY``, with a 1 s
poll as a fallback. Every other relay test polls every 0.2 s, so a relay that never heard a
notification, or polled ten times slower, passed them all. One lane here, and each row is
written just after the previous one was published: the lane checks once more, then sleeps a
full poll, so the row waits for that poll or a notification. The lane's check and the row's
commit may race (the row is then taken at once): three rows in a row, the longest wait."""

from __future__ import annotations

import json
import time

import asyncpg
import pytest

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer.outbox import enqueue, notify
from bulk_recorder.producer.relay import RelayConfig
from consumer.tools.generator import Generator
from settings import Settings
from tests.conftest import Broker, wait_for
from tests.integration.producer_support import RunningRelay, running_relay

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.rabbitmq,
    pytest.mark.exclusive(reason="times wake-ups against 3 s and 5 s"),
]


async def listening(conn: asyncpg.Connection) -> bool:
    n = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND query LIKE 'LISTEN %bulk_recorder_outbox%'"
    )
    return int(n) == 1


async def publish_one(
    conn: asyncpg.Connection,
    relay: RunningRelay,
    gen: Generator,
    *,
    notified: bool,
    within: float,
) -> float:
    """Seconds from one row's commit (with or without a NOTIFY) to its publish; the test fails
    at ``within`` s (a relay polling every 10 or 60 s is not waited for)."""
    before = relay.published
    record = gen.transaction()
    async with conn.transaction():
        await enqueue(conn, "transaction", record["id"], json.dumps(record).encode())
        if notified:
            await notify(conn)
    committed = time.monotonic()
    await wait_for(lambda: relay.published == before + 1, timeout=within, interval=0.01)
    return time.monotonic() - committed


async def waits(
    settings: Settings,
    conn: asyncpg.Connection,
    config: RelayConfig,
    *,
    notified: bool,
    bound: float,
) -> list[float]:
    """Three rows, each written just after the previous one was published: how long each
    waited for the relay (one lane, listening), each failing the test past ``bound`` s (the
    first, unmeasured one past twice that)."""
    gen = Generator.create(2701)
    async with running_relay(settings, config) as relay:
        await wait_for(lambda: listening(conn), timeout=30)
        await publish_one(conn, relay, gen, notified=notified, within=2 * bound)
        return [
            await publish_one(conn, relay, gen, notified=notified, within=bound) for _ in range(3)
        ]


async def test_a_notification_wakes_the_relay_long_before_its_poll(
    make_settings, database_url: str, broker: Broker, db
) -> None:
    config = RelayConfig(batch_size=10, lanes=1, poll_interval_s=60)
    await migrate(database_url)
    waited = await waits(make_settings(), await db(), config, notified=True, bound=5.0)
    assert max(waited) < 5.0, waited  # a notification, not the 60 s poll


async def test_without_a_notification_the_relay_polls_every_second(
    make_settings, database_url: str, broker: Broker, db
) -> None:
    config = RelayConfig(batch_size=10, lanes=1)  # the default poll
    await migrate(database_url)
    waited = await waits(make_settings(), await db(), config, notified=False, bound=3.0)
    assert max(waited) < 3.0, waited  # one poll of 1 s, and the publish
