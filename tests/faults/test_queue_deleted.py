"""The recorder's queue is deleted under it (an operator changing its arguments, a script that
deletes and declares it again): the broker cancels the consumer with a Basic.Cancel.

The recorder must notice: it is not ready while it does not consume, it declares its topology
again with the contract's arguments (as it does on every connect) and consumes, and its queue
gauges never keep the count of a consumer that is gone. Deliveries of the cancelled consumer
die with its channel: none is acked on the channel that comes next.
"""

from __future__ import annotations

import json
import math
import socket

import aio_pika
import aiormq
import asyncpg
import pytest

from bulk_recorder.infra.migrate import migrate
from consumer.tools.generator import Generator
from consumer.topology import Topology, declare_topology
from settings import Settings
from tests.conftest import Broker, wait_for
from tests.faults.amqp_tap import CancelDrop
from tests.faults.audit import table_ids
from tests.faults.conftest import RecorderPool, RecorderProcess, via_proxy
from tests.faults.scrape import http_get, scrape

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

CONSUMERS = "bulk_recorder_queue_consumers"
MESSAGES = "bulk_recorder_queue_messages"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _valid(seed: int, n: int) -> list[tuple[bytes, str | None]]:
    gen = Generator.create(seed=seed)
    return [(json.dumps(gen.credit_annotation()).encode(), "credit_annotation") for _ in range(n)]


def _ids(messages: list[tuple[bytes, str | None]]) -> set[str]:
    return {json.loads(body)["id"] for body, _ in messages}


async def _queue_state(url: str, queue: str) -> tuple[int, int] | None:
    """(ready messages, consumers) of ``queue``, or None when it does not exist (a connection
    of its own: a passive declare of a missing queue closes its channel)."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return None
        result = declared.declaration_result
        return int(result.message_count or 0), int(result.consumer_count or 0)
    finally:
        await connection.close()


async def _declare_with_the_contract_arguments(url: str, topology: Topology) -> None:
    """Declare the topology as ``bulk-recorder publish`` does: a queue that exists with other
    arguments would make this fail (PRECONDITION_FAILED)."""
    connection = await aio_pika.connect(url)
    try:
        await declare_topology(await connection.channel(), topology)
    finally:
        await connection.close()


async def _start(recorders: RecorderPool, settings: Settings) -> RecorderProcess:
    proc = await recorders.start(settings)
    port = settings.metrics_port
    assert port is not None

    async def consuming() -> bool:
        assert proc.running, proc.log_text()[-2000:]
        if (await http_get(port, "/readyz"))[0] != 200:
            return False
        return (await scrape(port)).get(CONSUMERS) == 1

    await wait_for(consuming, timeout=60)
    return proc


async def _declared_again_and_consumed(
    proc: RecorderProcess, url: str, queue: str, port: int, timeout: float = 30
) -> None:
    """Wait until ``queue`` exists again with one consumer attached; else fail with what was
    seen (before either fix: the queue missing for ever, /readyz still 200)."""

    async def declared_and_attached() -> bool:
        assert proc.running, proc.log_text()[-2000:]
        state = await _queue_state(url, queue)
        return state is not None and state[1] == 1

    try:
        await wait_for(declared_and_attached, timeout=timeout)
    except AssertionError:
        state = await _queue_state(url, queue)
        status, body = await http_get(port, "/readyz")
        raise AssertionError(f"queue {state or 'missing'}, /readyz {status} {body}") from None


async def _recorded(conn: asyncpg.Connection, ids: set[str]) -> bool:
    return ids <= (await table_ids(conn))["credit_annotation"]


async def test_a_deleted_queue_makes_the_recorder_unready_until_it_consumes_again(
    make_settings, recorders, broker: Broker, db, database_url, services, mq_proxy
) -> None:
    """The queue is deleted and nobody can declare it for a while (the recorder's reconnects
    are refused): not ready, still trying, no stale consumer count. Declared again with the
    contract's arguments (as ``publish`` does): consumed, recorded, ready."""
    await migrate(database_url)
    topo = broker.topology
    port = _free_port()
    settings = make_settings(
        rabbitmq_url=via_proxy(services.rabbitmq_url, mq_proxy),
        metrics_port=port,
        bulk_recorder_size=5,
    )
    proc = await _start(recorders, settings)

    logged = len(proc.log_text())
    mq_proxy.refuse_new()  # the recorder's open connections stay; it cannot open another
    await broker.channel.queue_delete(topo.queue)

    async def unready() -> bool:
        return (await http_get(port, "/readyz"))[0] == 503

    try:
        await wait_for(unready, timeout=15)
    except AssertionError:
        # before the fix: "/readyz 200 broker up, database up" with no consumer anywhere
        status, body = await http_get(port, "/readyz")
        raise AssertionError(f"/readyz {status} {body.strip()} with its queue deleted") from None
    # it keeps trying (a few refused connects, spaced by its backoff), never ready, alive
    attempts = mq_proxy.connections_total

    async def retried_unready() -> bool:
        assert proc.running, proc.log_text()[-2000:]
        assert (await http_get(port, "/readyz"))[0] == 503
        return bool(mq_proxy.connections_total >= attempts + 3)

    await wait_for(retried_unready, timeout=30)
    # one short line a refused attempt, no traceback: no crash loop, no spam
    held_log = proc.log_text()[logged:]
    assert "Traceback" not in held_log, held_log[-3000:]
    assert held_log.count("\n") <= 3 * (mq_proxy.connections_total - attempts) + 10, held_log
    assert await _queue_state(services.rabbitmq_url, topo.queue) is None  # still gone

    # no consumer is attached: at its next look (every 5 s) the gauge must stop saying the one
    # that was cancelled still is (0: seen gone; NaN: not connected, so unknown)
    async def not_stale() -> bool:
        consumers = (await scrape(port)).get(CONSUMERS)
        assert consumers is not None
        return consumers == 0 or math.isnan(consumers)

    try:
        await wait_for(not_stale, timeout=15)
    except AssertionError:
        # before the fix: the consumers gauge kept the 1 of the cancelled consumer
        metrics = await scrape(port)
        raise AssertionError(f"gauges stale: {CONSUMERS} {metrics.get(CONSUMERS)}") from None
    assert (await http_get(port, "/readyz"))[0] == 503

    await _declare_with_the_contract_arguments(services.rabbitmq_url, topo)
    mq_proxy.restore()
    messages = _valid(91, 5)

    async def attached() -> bool:
        state = await _queue_state(services.rabbitmq_url, topo.queue)
        return state is not None and state[1] == 1

    await wait_for(attached, timeout=30)
    await broker.publish_many(messages)
    conn = await db()
    await wait_for(lambda: _recorded(conn, _ids(messages)), timeout=30)

    async def ready_and_counted() -> bool:
        metrics = await scrape(port)
        return (await http_get(port, "/readyz"))[0] == 200 and metrics.get(CONSUMERS) == 1

    await wait_for(ready_and_counted, timeout=30)
    assert await proc.terminate() == 0


CANCEL_LINE = "the broker cancelled our consumer"  # said only when a Basic.Cancel came
DELETE_ROUNDS = 3  # deletions until one whose cancel reached the recorder


async def test_the_recorder_declares_its_deleted_queue_again_with_the_contract_arguments(
    make_settings, recorders, broker: Broker, db, database_url, services
) -> None:
    """Nobody else declares the queue: the recorder does, as on every connect, with the
    contract's arguments and its binding, and consumes from it.

    RabbitMQ 3.10 now and then loses the cancel of a deleted quorum queue, and the queue watch
    brings the queue back at its next look: that round proves the watch, not the cancel, so the
    queue is deleted again, up to DELETE_ROUNDS times, until a round whose cancel came."""
    await migrate(database_url)
    topo = broker.topology
    port = _free_port()
    proc = await _start(recorders, make_settings(metrics_port=port, bulk_recorder_size=5))

    rounds = 0
    while proc.log_text().count(CANCEL_LINE) == 0:
        assert rounds < DELETE_ROUNDS, f"no cancel came in {rounds} deletions"
        rounds += 1
        await broker.channel.queue_delete(topo.queue)
        await _declared_again_and_consumed(proc, services.rabbitmq_url, topo.queue, port)
    # the same arguments as the contract's (another set would fail this declare)
    await _declare_with_the_contract_arguments(services.rabbitmq_url, topo)
    messages = _valid(92, 5)
    await broker.publish_many(messages)  # through the exchange: the binding is back too
    conn = await db()
    await wait_for(lambda: _recorded(conn, _ids(messages)), timeout=30)
    assert (await http_get(port, "/readyz"))[0] == 200
    await wait_for(lambda: _gauge_is(port, CONSUMERS, 1), timeout=30)
    assert await proc.terminate() == 0
    # one cancel, one line about it: no loop
    log = proc.log_text()
    assert log.count("cancelled by the broker") <= 2, log[-3000:]


async def test_a_deleted_queue_whose_cancel_is_lost_is_declared_again_at_the_next_look(
    make_settings, recorders, broker: Broker, db, database_url, services, cancel_drop: CancelDrop
) -> None:
    """The broker's Basic.Cancel never reaches the recorder (RabbitMQ 3.10 once kept a deleted
    quorum queue's consumer on the channel and sent nothing): the queue watch, which looks
    every 5 s, finds the queue gone while the recorder holds a consumer on it, and the recorder
    declares it again and consumes, as a cancel would have made it."""
    await migrate(database_url)
    topo = broker.topology
    port = _free_port()
    settings = make_settings(
        rabbitmq_url=via_proxy(services.rabbitmq_url, cancel_drop),
        metrics_port=port,
        bulk_recorder_size=5,
    )
    proc = await _start(recorders, settings)

    await broker.channel.queue_delete(topo.queue)
    await wait_for(lambda: cancel_drop.dropped == 1, timeout=15)  # the notice, lost

    await _declared_again_and_consumed(proc, services.rabbitmq_url, topo.queue, port)  # 5 s looks
    messages = _valid(95, 5)
    await broker.publish_many(messages)
    conn = await db()
    await wait_for(lambda: _recorded(conn, _ids(messages)), timeout=30)
    await wait_for(lambda: _gauge_is(port, CONSUMERS, 1), timeout=30)
    assert (await http_get(port, "/readyz"))[0] == 200
    metrics = await scrape(port)
    assert metrics["bulk_recorder_broker_reconnects_total"] == 1  # once, not a loop
    assert await proc.terminate() == 0
    log = proc.log_text()
    assert log.count("gone with no cancel from the broker") == 1, log[-3000:]
    # this path, not the cancel's, and no line says a cancel came
    assert "cancelled by the broker" not in log
    assert CANCEL_LINE not in log, log[-3000:]


async def _gauge_is(port: int, name: str, value: float) -> bool:
    return (await scrape(port)).get(name) == value


async def test_deliveries_held_when_the_queue_is_deleted_are_never_acked_on_the_next_channel(
    make_settings, recorders, broker: Broker, db, database_url, services, pg_proxy
) -> None:
    """A flush is in flight (the database cut, the flush retrying) when the queue is deleted:
    the recorder consumes from the queue declared again, and when the database comes back the
    held batch is written but its acks, whose channel is gone, are never sent on the new one
    (an unknown delivery tag would close it: one more reconnect). It does not crash."""
    await migrate(database_url)
    topo = broker.topology
    port = _free_port()
    settings = make_settings(
        database_url=via_proxy(database_url, pg_proxy),
        metrics_port=port,
        bulk_recorder_size=5,
        bulk_recorder_release_after_s=120.0,  # held through the test, never released
    )
    proc = await _start(recorders, settings)
    held = _valid(93, 10)
    pg_proxy.cut()
    await broker.publish_many(held)

    async def flush_retrying() -> bool:
        metrics = await scrape(port)
        return (
            metrics.get("bulk_recorder_messages_received_total") == len(held)
            and metrics.get("bulk_recorder_db_retries_total", 0) >= 2
        )

    await wait_for(flush_retrying, timeout=30)
    await broker.channel.queue_delete(topo.queue)

    async def consuming_again() -> bool:
        assert proc.running, proc.log_text()[-2000:]
        state = await _queue_state(services.rabbitmq_url, topo.queue)
        return state is not None and state[1] == 1

    await wait_for(consuming_again, timeout=30)
    pg_proxy.restore()
    conn = await db()
    await wait_for(lambda: _recorded(conn, _ids(held)), timeout=30)  # written, not acked
    fresh = _valid(94, 5)
    await broker.publish_many(fresh)
    await wait_for(lambda: _recorded(conn, _ids(fresh)), timeout=30)

    async def settled() -> bool:
        metrics = await scrape(port)
        return metrics.get("bulk_recorder_messages_acked_total") == len(fresh) and (
            metrics.get("bulk_recorder_messages_dropped_total") == len(held)
        )

    await wait_for(settled, timeout=30)
    assert (await http_get(port, "/readyz"))[0] == 200
    metrics = await scrape(port)
    assert metrics["bulk_recorder_broker_reconnects_total"] == 1  # the cancel's, and no other
    assert proc.running
    assert await proc.terminate() == 0
    assert await _queue_state(services.rabbitmq_url, topo.queue) == (0, 0)
