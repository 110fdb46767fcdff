"""A quorum queue whose leader is too slow to count, on the local broker. RabbitMQ 3.10 answers
a passive declare with 0 messages and 0 consumers when the queue's leader does not count within
250 ms (rabbit_quorum_queue:stat/2): the answer of an empty queue nobody consumes. Each test
suspends one queue's Raft server (``sys:suspend`` through ``rabbitmqctl eval``: that queue's
process only, the node runs on) and resumes it before it ends.

Before consumer/queue_count.py each reader took that answer for an empty queue: ``dlq inspect``
took 0 for the DLQ's size (here it then failed on the broker's INTERNAL_ERROR, its basic.get
timing out on the suspended leader), the queue watch exported 0 messages ready and told the
recorder that a leftover shard holding records was empty (0: it lets go of it), ``shards
status`` showed such a shard as 0 ready and 0 consumers. ``shards prune``, which deleted it, is
tests/cluster/test_shards.py.
"""

from __future__ import annotations

import asyncio
import io
import math
from collections.abc import Mapping

import aio_pika
import pytest

from bulk_recorder.infra.metrics import Metrics
from consumer.queue_watch import QueueWatch, Shards
from consumer.tools import dlq_pass
from consumer.tools.dlq import inspect_dlq
from consumer.topology import Topology
from tests.conftest import Broker, leader_suspended, run_cli, settings_env, wait_for

pytestmark = [pytest.mark.rabbitmq]

HELD = 3


async def _hold(broker: Broker, queue: str) -> None:
    """``HELD`` messages in ``queue``, straight through the default exchange."""
    for n in range(HELD):
        await broker.channel.default_exchange.publish(
            aio_pika.Message(b"{}", type="transaction", message_id=f"held-{n}"), routing_key=queue
        )
    await wait_for(lambda: _ready_is(broker, queue, HELD), timeout=30)


async def _ready_is(broker: Broker, queue: str, count: int) -> bool:
    return await broker.ready_count(queue) == count


async def test_dlq_inspect_takes_no_count_for_no_count_not_for_an_empty_dlq(
    make_settings,
    broker: Broker,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = make_settings()
    dlq = settings.dead_letter_queue
    await _hold(broker, dlq)
    monkeypatch.setattr(dlq_pass, "DLQ_COUNT_WAIT_S", 1.0)
    out = io.StringIO()
    async with leader_suspended(dlq):
        # 1 s of asking, then exit 1: a read of the suspended DLQ instead would wait for the
        # broker's own timeout (about a minute)
        async with asyncio.timeout(15):
            assert await inspect_dlq(settings, out=out) == 1, out.getvalue()
    err = capsys.readouterr().err
    assert f"no count of {dlq} from its leader" in err, err
    assert "nothing was read" in err, err
    assert await broker.ready_count(dlq) == HELD  # nothing moved
    out = io.StringIO()
    assert await inspect_dlq(settings, out=out) == 0, out.getvalue()  # its count is back
    assert f"dead-letter queue {dlq}: {HELD} messages" in out.getvalue(), out.getvalue()


async def test_the_queue_watch_exports_unknown_not_0_for_no_count(
    broker: Broker, topology: Topology
) -> None:
    await _hold(broker, topology.queue)
    await _hold(broker, topology.dead_letter_queue)
    connection = await aio_pika.connect(broker.url)
    try:
        metrics = Metrics()
        watch = QueueWatch(metrics, topology.queue, lambda: connection)
        async with leader_suspended(topology.queue):
            assert await watch.look()
            for name in ("bulk_recorder_queue_messages", "bulk_recorder_queue_consumers"):
                value = metrics.registry.get_sample_value(name)
                assert math.isnan(value if value is not None else 0.0), (name, value)
            assert metrics.registry.get_sample_value("bulk_recorder_dlq_messages") == HELD
        assert await watch.look()
        assert metrics.registry.get_sample_value("bulk_recorder_queue_messages") == HELD
    finally:
        await connection.close()


async def test_the_queue_watch_tells_no_count_of_a_leftover_not_0(
    broker: Broker, topology: Topology, leftover: str
) -> None:
    """The recorder lets go of a leftover shard the watch reports empty (0 ready); one with no
    count is reported as None, which it leaves as it is (tests/unit/test_consuming_gone.py)."""
    await _hold(broker, leftover)
    told: list[Mapping[int, int | None]] = []

    async def reconcile(
        leftovers: Mapping[int, int | None], gone: frozenset[str], _: object
    ) -> None:
        told.append(dict(leftovers))

    connection = await aio_pika.connect(broker.url)
    try:
        metrics = Metrics()
        shards = Shards(topology, lambda _: True, reconcile)
        watch = QueueWatch(metrics, topology.queue, lambda: connection, shards=shards)
        async with leader_suspended(leftover):
            assert await watch.look()
            # that shard's gauges are unknown, and the sum with them; the other's are counted
            ready = {q: _shard_gauge(metrics, q) for q in (topology.queue, leftover)}
            assert ready[topology.queue] == 0, ready
            assert math.isnan(ready[leftover]), ready
            total = metrics.registry.get_sample_value("bulk_recorder_queue_messages")
            assert math.isnan(total if total is not None else 0.0), total
        assert await watch.look()
        assert _shard_gauge(metrics, leftover) == HELD
    finally:
        await connection.close()
    assert told == [{2: None}, {2: HELD}]


def _shard_gauge(metrics: Metrics, queue: str) -> float:
    value = metrics.registry.get_sample_value("bulk_recorder_shard_messages", {"queue": queue})
    assert value is not None, queue
    return value


async def test_shards_status_shows_no_count_as_a_question_mark_and_says_why(
    make_settings, broker: Broker, leftover: str
) -> None:
    await _hold(broker, leftover)
    env = settings_env(make_settings())
    async with leader_suspended(leftover):
        status = await asyncio.to_thread(run_cli, ["shards", "status"], env)
    assert status.returncode == 0, status.stdout + status.stderr
    row = next(line for line in status.stdout.splitlines() if leftover in line)
    assert row.split()[1:6] == [leftover, "leftover", "?", "-", "?"], status.stdout
    assert f"? no count: the leader of {leftover} answered 0 and 0 after 0.25 s" in status.stdout
    status = await asyncio.to_thread(run_cli, ["shards", "status"], env)
    row = next(line for line in status.stdout.splitlines() if leftover in line)
    assert row.split()[1:6] == [leftover, "leftover", str(HELD), "-", "0"], status.stdout
