"""A network partition between the recorder and RabbitMQ (issue 8, item 1).

With heartbeats on (``?heartbeat=1``), aiormq notices a silent broker after its grace period
(3 x (heartbeat + 1) s), closes the connection with ``CancelledError`` as the reason and fails
every pending confirm and RPC with it. That error is not a request to stop the task that awaits
the future: a flush worker, the broker loop or the pause task that lets it through ends, and the
recorder stalls with ``ready()`` still True. These tests make the partition for real (a
blackholed proxy) at the moment such a future is pending, heal it, and then demand that a new
message is recorded and acked, every flush worker alive, and the recorder ready.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import pytest

from consumer.tools.generator import Generator
from settings import Settings
from tests.conftest import Broker, RunningRecorder, Services, wait_for
from tests.faults.audit import settled_count
from tests.faults.conftest import via_proxy
from tests.faults.proxy import TcpProxy

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


def heartbeat_url(services: Services, proxy: TcpProxy) -> str:
    """The broker URL through ``proxy`` with a 1 s heartbeat (a 6 s grace in aiormq)."""
    parts = urlsplit(via_proxy(services.rabbitmq_url, proxy))
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", "heartbeat=1", ""))


def _body(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode()


def flush_workers() -> list[asyncio.Task[Any]]:
    """The running flush worker tasks (one recorder runs in this process)."""
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("flush-worker-")]


async def _waiting_on_lock(conn: asyncpg.Connection) -> bool:
    waiting = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return bool(waiting)


async def _recorded(conn: asyncpg.Connection, record_id: str) -> bool:
    return bool(await conn.fetchval("SELECT count(*) FROM transactions WHERE id = $1", record_id))


async def _in_queue(broker: Broker, queue: str, n: int) -> bool:
    return await broker.ready_count(queue) >= n


async def _recovers_and_records(
    rec: RunningRecorder, broker: Broker, conn: asyncpg.Connection, gen: Generator, workers: int
) -> None:
    """After the partition healed: ready again, a new valid message recorded and acked."""
    await wait_for(lambda: rec.recorder.ready()[0] or rec.task.done(), timeout=60)
    assert not rec.task.done(), "Recorder.run ended during the partition"
    acked = rec.value("bulk_recorder_messages_acked_total")
    fresh = gen.transaction()
    await broker.publish(_body(fresh), "transaction")
    await wait_for(lambda: _recorded(conn, fresh["id"]), timeout=30)
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") > acked, timeout=30)
    assert len(flush_workers()) == workers
    ready, detail = rec.recorder.ready()
    assert ready, detail


async def test_partition_while_a_refused_row_is_dead_lettered_keeps_the_flush_worker(
    make_settings: Callable[..., Settings],
    start_recorder: Callable[[Settings], Awaitable[RunningRecorder]],
    broker: Broker,
    db: Callable[[], Awaitable[asyncpg.Connection]],
    services: Services,
    mq_proxy: TcpProxy,
) -> None:
    """The flush worker waits for the dead-letter confirm of a row PostgreSQL refused, and for
    nothing else, when the partition starts; its batch-mates' acks go into the partition too."""
    gen = Generator.create(seed=81)
    limit = broker.topology.delivery_limit
    settings = make_settings(
        rabbitmq_url=heartbeat_url(services, mq_proxy),
        rabbitmq_numbers_of_workers=1,
        bulk_recorder_size=20,
        bulk_recorder_flush_timeout_ms=200,
    )
    rec = await start_recorder(settings)
    conn = await db()
    earlier = gen.transaction()
    await broker.publish(_body(earlier), "transaction")
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 1)

    # Valid, but PostgreSQL refuses it: its operation id is taken by `earlier`.
    stolen = gen.transaction()
    stolen["operations"][0]["id"] = earlier["operations"][0]["id"]
    good = [gen.transaction() for _ in range(3)]
    # Hold the flush at its first INSERT until the partition has started.
    locker = await db()
    locker_tx = locker.transaction()
    await locker_tx.start()
    await locker.execute("LOCK TABLE transactions IN ACCESS EXCLUSIVE MODE")
    await broker.publish_many([(_body(t), "transaction") for t in good])
    # As if at the broker's last delivery (x-delivery-count N of x-delivery-limit=N): the
    # recorder dead-letters it on this refusal.
    await broker.publish(_body(stolen), "transaction", headers={"x-delivery-count": limit})
    await wait_for(lambda: _waiting_on_lock(conn))
    mq_proxy.blackhole()
    await locker_tx.rollback()  # the batch commits its good rows, then isolates `stolen`
    # Past aiormq's grace the connection is given up (CancelledError to every pending future).
    await wait_for(lambda: not rec.recorder.ready()[0], timeout=60)
    mq_proxy.restore()

    await _recovers_and_records(rec, broker, conn, gen, workers=1)
    # Nothing lost: the good rows are in, `stolen` reaches the DLQ (again, after redelivery).
    for record in good:
        assert await _recorded(conn, record["id"])
    assert not await _recorded(conn, stolen["id"])
    await wait_for(lambda: _in_queue(broker, broker.topology.dead_letter_queue, 1), timeout=30)
    await rec.shutdown()
    assert await settled_count(broker, broker.topology.queue) == 0


async def test_partition_while_opening_a_channel_keeps_the_recorder_running(
    make_settings: Callable[..., Settings],
    start_recorder: Callable[[Settings], Awaitable[RunningRecorder]],
    broker: Broker,
    db: Callable[[], Awaitable[asyncpg.Connection]],
    services: Services,
    mq_proxy: TcpProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The partition starts right after a reconnect's handshake, while ``connection.channel()``
    waits for Channel.OpenOk: that wait fails with CancelledError past the grace."""
    gen = Generator.create(seed=82)
    settings = make_settings(
        rabbitmq_url=heartbeat_url(services, mq_proxy), rabbitmq_numbers_of_workers=2
    )
    real_connect = aio_pika.connect
    partitions: list[int] = []

    async def connect_then_partition(*args: Any, **kwargs: Any) -> Any:
        connection = await real_connect(*args, **kwargs)
        if not partitions:  # only the first reconnect; the one after it must succeed
            partitions.append(mq_proxy.connections_total)
            mq_proxy.blackhole()
        return connection

    rec = await start_recorder(settings)
    conn = await db()
    # The next connect (after a cut) is followed at once by a partition.
    monkeypatch.setattr(aio_pika, "connect", connect_then_partition)
    mq_proxy.cut()
    await wait_for(lambda: not rec.recorder.ready()[0])
    mq_proxy.restore()
    await wait_for(lambda: bool(partitions) or rec.task.done(), timeout=30)
    # Past the grace the stuck connection is given up; the recorder must try again.
    await wait_for(
        lambda: mq_proxy.connections_total > partitions[0] or rec.task.done(), timeout=60
    )
    assert not rec.task.done(), "Recorder.run ended during the partition"
    mq_proxy.restore()
    await _recovers_and_records(rec, broker, conn, gen, workers=2)
    await rec.shutdown()


async def test_a_dead_flush_worker_makes_the_recorder_unready_until_it_is_replaced(
    make_settings: Callable[..., Settings],
    start_recorder: Callable[[Settings], Awaitable[RunningRecorder]],
    broker: Broker,
    db: Callable[[], Awaitable[asyncpg.Connection]],
) -> None:
    """Whatever ends a flush worker (here a real ``Task.cancel()``, which must propagate),
    readiness shows it, and a new worker takes its place."""
    gen = Generator.create(seed=83)
    rec = await start_recorder(make_settings(rabbitmq_numbers_of_workers=2))
    conn = await db()
    assert len(flush_workers()) == 2
    victim = flush_workers()[0]
    victim.cancel()
    await asyncio.gather(victim, return_exceptions=True)
    assert victim.cancelled()  # a real cancellation is not swallowed
    ready, detail = rec.recorder.ready()
    assert not ready, detail
    assert "flush workers 1/2 alive" in detail

    await wait_for(lambda: rec.recorder.ready()[0])
    assert (
        rec.recorder.ready()[1] == "broker up, database up, flush workers 2/2 alive (1 restarted)"
    )
    assert victim not in flush_workers()
    await _recovers_and_records(rec, broker, conn, gen, workers=2)
