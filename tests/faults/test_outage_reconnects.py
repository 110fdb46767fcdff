"""Broker reconnects during a database outage do not pile up deliveries (issue 8, suspicion 3).

While PostgreSQL is away the flush workers retry and hold their batches, and the batches the
collector cuts wait in the recorder's queue. A broker reconnect drops the dead channel's
deliveries from the collector, and the broker redelivers them (and more) to the new channel, up
to its prefetch. Batches of the dead channel left waiting in the queue would stay held too: one
more prefetch window per reconnect, for as long as the outage lasts.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from bulk_recorder.infra.migrate import migrate
from consumer.tools.generator import Generator
from settings import Settings
from tests.conftest import Broker, RunningRecorder, Services, wait_for
from tests.faults.audit import row_counts, settled_count
from tests.faults.conftest import via_proxy
from tests.faults.proxy import TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

RECONNECTS = 3


async def test_reconnects_during_a_database_outage_hold_one_prefetch_window(
    make_settings: Callable[..., Settings],
    start_recorder: Callable[[Settings], Awaitable[RunningRecorder]],
    broker: Broker,
    db: Callable[[], Awaitable[asyncpg.Connection]],
    services: Services,
    database_url: str,
    pg_proxy: TcpProxy,
    mq_proxy: TcpProxy,
) -> None:
    settings = make_settings(
        database_url=via_proxy(database_url, pg_proxy),
        rabbitmq_url=via_proxy(services.rabbitmq_url, mq_proxy),
        rabbitmq_numbers_of_workers=1,
        rabbitmq_numbers_of_prefetch=10,
        bulk_recorder_release_after_s=600,  # the outage outlasts the test: nothing is released
    )
    window, batch = settings.channel_prefetch, settings.effective_batch_size
    await migrate(database_url)
    rec = await start_recorder(settings)
    conn = await db()
    pg_proxy.cut()
    gen = Generator.create(seed=84)
    records = [gen.transaction() for _ in range(window * (RECONNECTS + 3))]
    await broker.publish_many([(json.dumps(r).encode(), "transaction") for r in records])

    def received() -> float:
        return rec.value("bulk_recorder_messages_received_total")

    await wait_for(lambda: received() == window)
    await wait_for(lambda: rec.value("bulk_recorder_paused") == 1)
    for n in range(1, RECONNECTS + 1):
        mq_proxy.cut()
        mq_proxy.restore()
        await wait_for(lambda: rec.value("bulk_recorder_broker_reconnects_total") == n)  # noqa: B023
        # the new channel's prefetch window arrives (nothing can be acked meanwhile)
        await wait_for(lambda: received() == window * (n + 1))  # noqa: B023
    held = rec.value("bulk_recorder_buffer_messages")
    # the live channel's window, plus at most the batch the worker holds from a dead channel
    assert held <= window + batch, f"{held} deliveries held after {RECONNECTS} reconnects"
    assert rec.value("bulk_recorder_messages_dropped_total") >= window * RECONNECTS - batch

    pg_proxy.restore()
    await wait_for(lambda: _rows(conn, len(records)), timeout=60)
    await wait_for(lambda: rec.value("bulk_recorder_buffer_messages") == 0)
    await rec.shutdown()
    assert await settled_count(broker, broker.topology.queue) == 0


async def _rows(conn: asyncpg.Connection, n: int) -> bool:
    return await row_counts(conn) >= n
