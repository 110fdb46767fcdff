"""RABBITMQ_QUEUE_SHARD_REPLICAS on the three-node cluster rig (``shard_cluster``): shards 2..N
are declared with that many members (``x-quorum-initial-group-size``), shard 1 keeps a member on
every node whatever it says, one shard ignores it, and a process that asks another group size
than the shards have stops with a line naming the variable. And what it costs: the loss of the
node of a one-replica shard stops that shard until the node is back (docs/high-availability.md,
"Queue shards with fewer replicas").
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator

import aio_pika
import aiormq
import pytest

from bulk_recorder.infra.broker import TopologyMismatch
from consumer.topology import Topology, declare_or_mismatch, delete_topology, exchange_exists
from tests.conftest import wait_for
from tests.rigs.rabbitmq_cluster import RabbitCluster
from tests.rigs.topology import declare_through

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]


@pytest.fixture
async def names(shard_cluster: RabbitCluster) -> AsyncIterator[list[Topology]]:
    """A list the test appends its topologies to (unique names); each deleted afterwards."""
    made: list[Topology] = []
    yield made
    node = shard_cluster.running_nodes()[0]
    connection = await aio_pika.connect(node.url, timeout=30)
    try:
        left = [what for topo in made for what in await delete_topology(connection, topo)]
    finally:
        await connection.close()
    assert not [what for what in left if "NOT_FOUND" not in what], left


def fresh(shards: int, replicas: int) -> Topology:
    suffix = uuid.uuid4().hex[:10]
    return Topology(
        exchange=f"brrep.{suffix}",
        queue=f"brrep.{suffix}.records",
        delivery_limit=5,
        shards=shards,
        shard_replicas=replicas,
    )


async def members(cluster: RabbitCluster, topology: Topology) -> list[int]:
    """How many members each shard 1..N has, as the cluster reports them."""
    for queue in topology.shard_queues():
        await asyncio.to_thread(cluster.wait_for_leader, queue)
    statuses = await asyncio.to_thread(cluster.queue_statuses)
    return [len(statuses[queue].members) for queue in topology.shard_queues()]


@pytest.mark.parametrize("replicas", [1, 2])
async def test_shards_2_to_n_are_declared_with_the_replicas_set(
    shard_cluster: RabbitCluster, names: list[Topology], replicas: int
) -> None:
    topology = fresh(3, replicas)
    names.append(topology)
    await declare_through(shard_cluster.nodes[0].url, topology)
    assert await members(shard_cluster, topology) == [3, replicas, replicas]


async def test_without_shard_replicas_every_shard_has_a_member_on_every_node(
    shard_cluster: RabbitCluster, names: list[Topology]
) -> None:
    topology = fresh(3, 0)
    names.append(topology)
    await declare_through(shard_cluster.nodes[0].url, topology)
    assert await members(shard_cluster, topology) == [3, 3, 3]


async def test_one_shard_ignores_shard_replicas(
    shard_cluster: RabbitCluster, names: list[Topology]
) -> None:
    """N = 1 with RABBITMQ_QUEUE_SHARD_REPLICAS set declares today's one queue exactly."""
    topology = fresh(1, 1)
    names.append(topology)
    url = shard_cluster.nodes[0].url
    await declare_through(url, topology)
    assert await members(shard_cluster, topology) == [3]
    # the same queue declared without the setting is accepted: its arguments are today's
    await declare_through(url, dataclasses.replace(topology, shard_replicas=0))
    connection = await aio_pika.connect(url, timeout=30)
    try:
        raw = await (await connection.channel()).get_underlay_channel()
        assert not await exchange_exists(raw.connection, topology.shard_exchange)
    finally:
        await connection.close()


async def test_another_group_size_than_the_shards_have_names_the_variable(
    shard_cluster: RabbitCluster, names: list[Topology]
) -> None:
    topology = fresh(3, 1)
    names.append(topology)
    url = shard_cluster.nodes[0].url
    await declare_through(url, topology)
    connection = await aio_pika.connect(url, timeout=30)
    try:
        with pytest.raises(TopologyMismatch, match="RABBITMQ_QUEUE_SHARD_REPLICAS") as caught:
            await declare_or_mismatch(
                await connection.channel(), dataclasses.replace(topology, shard_replicas=2)
            )
    finally:
        await connection.close()
    assert topology.shard_queue(2) in str(caught.value), caught.value


async def publish(url: str, exchange: str, count: int) -> tuple[int, int]:
    """``count`` persistent messages on one confirm channel, all in flight at once: how many the
    broker confirmed and how many it nacked (anything else fails the test)."""
    connection = await aio_pika.connect(url, timeout=30)
    try:
        channel = await connection.channel(publisher_confirms=True)
        target = await channel.get_exchange(exchange)

        async def one() -> bool:
            try:
                await target.publish(
                    aio_pika.Message(b"{}", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key="transaction",
                    timeout=30,
                )
            except aiormq.exceptions.DeliveryError:
                return False
            return True

        outcomes = await asyncio.gather(*(one() for _ in range(count)))
    finally:
        await connection.close()
    return outcomes.count(True), outcomes.count(False)


async def ready(url: str, queue: str) -> int:
    connection = await aio_pika.connect(url, timeout=30)
    try:
        declared = await (await connection.channel()).declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count or 0)
    finally:
        await connection.close()


async def test_a_one_replica_shard_stops_with_its_node_and_comes_back_with_it(
    shard_cluster: RabbitCluster, names: list[Topology]
) -> None:
    """Shard 3 at one replica, on n3 (declared through n3 first: RabbitMQ 3.10 gives a new quorum
    queue the declaring client's node). n3 SIGKILLed: publishes the random exchange sends to
    shard 3 are nacked at once while the others are confirmed, shard 3 reads as empty, and its
    records come back with n3."""
    cluster, topology = shard_cluster, fresh(3, 1)
    names.append(topology)
    first, third = cluster.nodes[0], cluster.nodes[2]
    connection = await aio_pika.connect(third.url, timeout=30)
    try:
        await (await connection.channel()).declare_queue(
            topology.shard_queue(3), durable=True, arguments=topology.queue_arguments(3)
        )
    finally:
        await connection.close()
    await declare_through(first.url, topology)
    shard3 = topology.shard_queue(3)
    status = await asyncio.to_thread(cluster.queue_status, shard3)
    assert status is not None
    assert status.members == (third.node,), status

    assert await publish(first.url, topology.exchange, 300) == (300, 0)
    held = await ready(first.url, shard3)
    assert 0 < held < 300, held

    await asyncio.to_thread(cluster.kill, third)

    async def leaderless() -> bool:
        return await asyncio.to_thread(cluster.queue_status, shard3) is None

    await wait_for(leaderless, timeout=60, interval=0.5)  # a surviving node no longer lists it
    confirmed, nacked = await publish(first.url, topology.exchange, 300)
    assert nacked > 0, (confirmed, nacked)  # about one in three: those sent to shard 3
    assert confirmed > 0, (confirmed, nacked)  # shards 1 and 2 go on
    assert await ready(first.url, shard3) == 0  # it reads as empty, not as unknown

    await asyncio.to_thread(cluster.restart, third)
    await asyncio.to_thread(cluster.wait_for_leader, shard3)

    async def back() -> bool:
        return await ready(first.url, shard3) >= held

    await wait_for(back, timeout=60, interval=0.5)
    assert await ready(first.url, shard3) == held  # every record it held, none of the nacked
