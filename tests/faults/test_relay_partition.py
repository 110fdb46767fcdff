"""The outbox relay through a network partition (issue 8, item 1, relay side).

With ``?heartbeat=1`` on the broker URL and the broker connection blackholed for longer than
aiormq's heartbeat grace while a batch waits for its confirms, aiormq closes the connection and
fails every pending confirm with ``CancelledError``. That is a broker failure like any other:
the batch rolls back, its rows stay in the outbox, and once the network heals the relay
publishes them. The same error met while the relay opens its channel and declares the topology
must not end the broker loop. A lane that ends anyway (a bug) makes the relay unready until it
is restarted.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer.outbox import enqueue, notify
from bulk_recorder.producer.relay import Relay, RelayConfig
from consumer.tools.generator import Generator
from tests.conftest import Broker, wait_for
from tests.faults.conftest import claims_open, via_proxy
from tests.integration.producer_support import declare_for, running_relay

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]
# The partition tests only: a lane that dies has no heartbeat and no proxy, and waits on
# conditions alone, so it runs side by side.
HEARTBEAT_COUNTED = pytest.mark.exclusive(
    reason="counts failures under a 1 s heartbeat, which a busy machine misses"
)

ROWS = 40


async def _fill_outbox(conn, seed: int, n: int = ROWS) -> set[str]:
    gen = Generator.create(seed)
    ids: set[str] = set()
    async with conn.transaction():
        for _ in range(n):
            record = gen.credit_annotation()
            await enqueue(conn, "credit_annotation", record["id"], json.dumps(record).encode())
            ids.add(record["id"])
        await notify(conn)
    return ids


async def _outbox_rows(conn) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM outbox"))


async def _queued_ids(broker: Broker) -> set[str]:
    messages = await broker.drain(broker.topology.queue)
    return {json.loads(m.body)["id"] for m in messages}


@HEARTBEAT_COUNTED
async def test_relay_batches_everything_after_a_partition_that_outlived_the_heartbeat(
    make_settings, database_url, db, broker, services, mq_proxy, caplog
) -> None:
    settings = make_settings(
        rabbitmq_url=via_proxy(services.rabbitmq_url + "?heartbeat=1", mq_proxy)
    )
    await migrate(database_url)
    conn = await db()
    # Two lanes of 20 rows: both lanes have a batch in flight when the partition starts.
    config = RelayConfig(batch_size=ROWS // 2, lanes=2, poll_interval_s=0.2)
    caplog.set_level(logging.WARNING, logger="bulk_recorder")
    async with running_relay(settings, config) as relay:
        await wait_for(lambda: relay.relay.ready()[0], timeout=30)
        mq_proxy.blackhole()
        ids = await _fill_outbox(conn, seed=81)
        # Both batches are published into the partition and wait for their confirms ...
        await wait_for(lambda: _claims(conn, 2), timeout=30)
        # ... until aiormq gives up on the silent connection (grace: 6 s at heartbeat=1) and
        # fails them; the lanes' transactions end.
        await wait_for(lambda: not relay.relay.ready()[0], timeout=30)
        await wait_for(lambda: _claims(conn, 0), timeout=30)
        mq_proxy.restore()

        await wait_for(lambda: _outbox_empty(conn), timeout=60)
        await wait_for(lambda: relay.relay.ready()[0], timeout=30)
        assert relay.relay.ready() == (True, "broker up, database up")
        assert relay.value("bulk_recorder_outbox_publish_failures_total", reason="lost") == ROWS
        assert relay.published >= ROWS
        assert not relay.task.done()
    # The lanes lived through it: none died and had to be restarted.
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("bulk_recorder.") and r.levelno >= logging.ERROR
    ]
    assert errors == []
    # Every row reached the queue (a publish that went through just before the close may be
    # there twice: the recorder absorbs it).
    assert await _queued_ids(broker) == ids


async def test_a_lane_that_dies_makes_the_relay_unready_and_is_restarted(
    make_settings, database_url, db, broker, monkeypatch, caplog
) -> None:
    """A lane ended by something it cannot handle (here a BaseException, as a stray
    cancellation was before) must not leave a relay that looks ready and publishes nothing."""
    settings = make_settings()
    await migrate(database_url)
    conn = await db()
    healed = asyncio.Event()
    real_relay_batch = Relay.relay_batch

    class LaneKiller(BaseException):
        pass

    async def dying_relay_batch(self):
        if not healed.is_set():
            raise LaneKiller
        return await real_relay_batch(self)

    config = RelayConfig(batch_size=100, lanes=1, poll_interval_s=0.2)
    async with running_relay(settings, config) as relay:
        await wait_for(lambda: relay.relay.ready()[0], timeout=30)
        monkeypatch.setattr(Relay, "relay_batch", dying_relay_batch)
        caplog.set_level(logging.ERROR, logger="bulk_recorder")
        ids = await _fill_outbox(conn, seed=82)

        await wait_for(lambda: not relay.relay.ready()[0], timeout=30)
        assert "relay-lane-0 down" in relay.relay.ready()[1]
        assert any("relay-lane-0" in r.getMessage() for r in caplog.records)
        healed.set()

        await wait_for(lambda: _outbox_empty(conn), timeout=60)
        await wait_for(lambda: relay.relay.ready()[0], timeout=30)
        assert relay.relay.ready() == (True, "broker up, database up")
    assert await _queued_ids(broker) == ids


async def _outbox_empty(conn) -> bool:
    return await _outbox_rows(conn) == 0


async def _claims(conn, n: int) -> bool:
    return await claims_open(conn) == n


@HEARTBEAT_COUNTED
async def test_relay_reconnects_after_a_partition_while_it_declares_its_topology(
    make_settings, database_url, db, broker, services, mq_proxy, caplog
) -> None:
    """The partition starts right after the connection opened, while the relay declares the
    topology: what aiormq raises then must not end the broker loop."""
    settings = make_settings(
        rabbitmq_url=via_proxy(services.rabbitmq_url + "?heartbeat=1", mq_proxy)
    )
    await migrate(database_url)
    conn = await db()
    declare = declare_for(settings)
    failures: list[BaseException] = []

    async def partitioned_declare(channel) -> None:
        if not failures:
            mq_proxy.blackhole()
        try:
            await declare(channel)
        except BaseException as exc:
            failures.append(exc)
            raise

    caplog.set_level(logging.WARNING, logger="bulk_recorder")
    config = RelayConfig(batch_size=ROWS, lanes=1, poll_interval_s=0.2)
    async with running_relay(settings, config, declare=partitioned_declare) as relay:
        await wait_for(lambda: bool(failures), timeout=30)
        mq_proxy.restore()
        ids = await _fill_outbox(conn, seed=84)
        await wait_for(lambda: _outbox_empty(conn), timeout=60)
        assert relay.relay.ready() == (True, "broker up, database up")
    assert isinstance(failures[0], asyncio.CancelledError)  # what aiormq 7.2 raises there
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("bulk_recorder.") and r.levelno >= logging.ERROR
    ]
    assert errors == []
    assert await _queued_ids(broker) == ids
