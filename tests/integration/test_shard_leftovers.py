"""Leftover shards at RABBITMQ_QUEUE_SHARDS=1, on the local broker (no plugin needed: one shard
routes straight to the queue): a recorder consumes every shard that exists past N, a record
that reached two shards is recorded once with its balances moved once, a drained leftover is
let go so that ``shards prune`` can delete it, and prune never deletes one that holds messages.

The random exchange of N > 1 is not enabled on the local broker: those tests are on the cluster
rig (tests/cluster/test_shards.py).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aio_pika
import pytest

from bulk_recorder.infra.migrate import migrate
from consumer.tools.generator import Generator
from consumer.topology import Topology
from tests.conftest import Broker, run_cli, settings_env, wait_for
from tests.integration.producer_support import balances, expected_balances

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


async def _to_queue(broker: Broker, queue: str, transactions: list[dict[str, Any]]) -> None:
    """Publish straight to ``queue`` (the default exchange), as the shard exchange would."""
    for tx in transactions:
        await broker.channel.default_exchange.publish(
            aio_pika.Message(
                json.dumps(tx).encode(),
                content_type="application/json",
                type="transaction",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key=queue,
        )


async def _consumers(broker: Broker, queue: str) -> int:
    declared = await broker.channel.declare_queue(queue, passive=True)
    return int(declared.declaration_result.consumer_count or 0)


async def test_a_record_on_two_shards_is_recorded_once_and_moves_its_balances_once(
    make_settings, start_recorder, broker, db, database_url, topology, leftover
) -> None:
    """A message published while both routes exist (a route change) may reach two shards: the
    insert keeps one row, and the balances move by the rows inserted only. The recorder at one
    shard consumes the leftover shard it finds too."""
    await migrate(database_url)
    gen = Generator.create(seed=4101)
    gen.accounts = gen.accounts[:4]  # a few hot accounts: the doubled deltas would show
    both = [gen.transaction() for _ in range(60)]
    only_leftover = [gen.transaction() for _ in range(40)]
    await _to_queue(broker, topology.queue, both)
    await _to_queue(broker, leftover, both + only_leftover)
    rec = await start_recorder(make_settings())
    total = len(both) * 2 + len(only_leftover)
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == total, timeout=60)
    conn = await db()
    ids = {str(r[0]) for r in await conn.fetch("SELECT id FROM transactions")}
    assert ids == {str(tx["id"]) for tx in both + only_leftover}
    assert await balances(conn) == expected_balances(both + only_leftover)
    inserted = rec.value("bulk_recorder_rows_inserted_total", table="transactions")
    ignored = rec.value("bulk_recorder_rows_ignored_total", table="transactions")
    assert (inserted, ignored) == (len(both) + len(only_leftover), len(both))
    assert await broker.ready_count(leftover) == 0


async def test_a_drained_leftover_is_let_go_and_pruned_and_a_full_one_is_kept(
    make_settings, start_recorder, broker, db, database_url, topology, leftover
) -> None:
    await migrate(database_url)
    settings = make_settings()
    gen = Generator.create(seed=4102)
    await _to_queue(broker, leftover, [gen.transaction() for _ in range(30)])
    rec = await start_recorder(settings)
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 30, timeout=60)
    assert rec.recorder.ready()[0]
    # drained: the recorder's next look lets go of it (its shard-1 consumer stays)
    await wait_for(lambda: _no_consumer(broker, leftover), timeout=20)
    assert await _consumers(broker, topology.queue) == 1
    assert rec.recorder.ready()[0]

    # a message showing up on it again is consumed again
    await _to_queue(broker, leftover, [gen.transaction()])
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 31, timeout=30)
    await wait_for(lambda: _no_consumer(broker, leftover), timeout=20)

    env = settings_env(settings)
    status = await asyncio.to_thread(run_cli, ["shards", "status"], env)
    assert status.returncode == 0, status.stderr
    line = next(row for row in status.stdout.splitlines() if f" {leftover} " in row)
    assert line.split()[:3] == ["2", leftover, "leftover"], status.stdout
    assert "RABBITMQ_QUEUE_SHARDS=1" in status.stdout

    # stopped, with a message waiting in the leftover: prune keeps it and names it
    await rec.shutdown()
    await _to_queue(broker, leftover, [gen.transaction()])
    kept = await asyncio.to_thread(run_cli, ["shards", "prune"], env)
    assert kept.returncode == 1, kept.stdout + kept.stderr
    assert f"not drained: {leftover} (1 ready, 0 consumers)" in kept.stderr, kept.stderr
    assert await broker.ready_count(leftover) == 1

    # a recorder drains it, lets go, and prune deletes it
    rec = await start_recorder(settings)
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 1, timeout=30)
    # in a thread: the recorder runs in this event loop, and must look meanwhile
    pruned = await asyncio.to_thread(run_cli, ["shards", "prune", "--wait", "30"], env)
    assert pruned.returncode == 0, pruned.stdout + pruned.stderr
    assert f"deleted {leftover} (drained)" in pruned.stdout
    assert not await _exists(broker, leftover)
    assert rec.recorder.ready()[0]
    # for the fixture's clean-up, which deletes it
    await broker.channel.declare_queue(leftover, durable=True, arguments=_shard2(topology))


async def _no_consumer(broker: Broker, queue: str) -> bool:
    return await _consumers(broker, queue) == 0


async def _exists(broker: Broker, queue: str) -> bool:
    connection = await aio_pika.connect(broker.url)
    try:
        channel = await connection.channel()
        try:
            await channel.declare_queue(queue, passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return False
        return True
    finally:
        await connection.close()


def _shard2(topology: Topology) -> dict[str, Any]:
    return Topology(topology.exchange, topology.queue, topology.delivery_limit, 2).queue_arguments(
        2
    )
