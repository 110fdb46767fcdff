"""Queue shards on the three-node cluster rig, with ``rabbitmq_random_exchange`` enabled on every
node (``shard_cluster``): what RABBITMQ_QUEUE_SHARDS > 1 promises.

- the shards' leaders spread over the nodes (``x-queue-leader-locator: balanced``);
- two processes that declare different shard counts at the same instant never leave the
  exchange without a route (the route lock, and a bind before each unbind): a mandatory
  publisher running through every change gets none of its messages back;
- at N = 3 every confirmed record is recorded once, with the exact audit, the records spread
  over the three shards, through a SIGKILL of the node leading the last shard (only the shards
  it led elect new leaders) and its restart;
- 1 -> 3 -> 1 under traffic, by rolling recorders of the new N in and the old ones out, then
  ``shards prune``: nothing lost or doubled, the leftover shards and the shard exchange gone.

Fixtures for other modules: ``shard_cluster`` (tests/cluster/conftest.py) and
``shard_topology`` below (unique names at N = 3; everything deleted afterwards, whatever N the
test moved it to).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from collections.abc import AsyncIterator

import aio_pika
import pytest

from bulk_recorder.infra.migrate import migrate
from consumer.delivery import ERROR_HEADER
from consumer.tools.loadgen import LoadSpec, publish_load
from consumer.topology import Topology, declare_topology
from tests.cluster.failover_support import cluster_settings, merge, open_broker
from tests.cluster.traffic import QueueTraffic
from tests.conftest import Broker, run_cli, settings_env, wait_for
from tests.faults.audit import audit_run, row_counts, settled_count, wait_until_settled
from tests.rigs.rabbitmq_cluster import RabbitCluster
from tests.rigs.topology import declare_through, delete_through

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(300)]

SHARDS = 3
ROUNDS = 60  # of two route changes at once


@pytest.fixture
async def shard_topology(shard_cluster: RabbitCluster) -> AsyncIterator[Topology]:
    """Unique names with three shards; every shard queue, the shard exchange and the rest are
    deleted afterwards (one a test pruned already is not an error)."""
    suffix = uuid.uuid4().hex[:10]
    topo = Topology(
        exchange=f"brsh.{suffix}", queue=f"brsh.{suffix}.records", delivery_limit=5, shards=SHARDS
    )
    yield topo
    left = await delete_through(shard_cluster.running_nodes()[0].url, topo)
    assert not [what for what in left if "NOT_FOUND" not in what], left


def routes(cluster: RabbitCluster, topology: Topology) -> set[str]:
    """Where ``topology.exchange`` routes now (its bindings, read on a running node)."""
    source = f'{{resource, <<"/">>, exchange, <<"{topology.exchange}">>}}'
    # a binding is {binding, Source, Key, Destination, Args}; its destination as its name
    return set(
        cluster.running_nodes()[0].erl(
            f"[element(4, B) || B <- rabbit_binding:list_for_source({source})]"
        )
    )


async def wait_for_route(cluster: RabbitCluster, topology: Topology, to: str) -> None:
    async def there() -> bool:
        return await asyncio.to_thread(routes, cluster, topology) == {to}

    await wait_for(there, timeout=60, interval=0.5)


async def shards_ready(broker: Broker, topology: Topology) -> list[int]:
    return [await broker.ready_count(q) for q in topology.shard_queues()]


async def test_the_leaders_of_three_shards_are_on_three_nodes(
    shard_cluster: RabbitCluster, shard_topology: Topology
) -> None:
    await declare_through(shard_cluster.nodes[0].url, shard_topology)
    for queue in shard_topology.shard_queues():
        await asyncio.to_thread(shard_cluster.wait_for_leader, queue)
    statuses = await asyncio.to_thread(shard_cluster.queue_statuses)
    shards = shard_topology.shard_queues()
    placed: dict[str, str] = {}
    for queue in shards:
        leader = statuses[queue].leader
        assert leader is not None, (queue, statuses[queue])
        placed[queue] = leader
    # "balanced" puts each new shard's leader on a node leading the fewest quorum queues at
    # that moment. The session's cluster may already lead other tests' queues unevenly (their
    # leaders moved when a node was killed), so the check replays the placement from what the
    # nodes led besides shards 2..N (shard 1 and the DLQ are declared first, client-local).
    led = {node.node: 0 for node in shard_cluster.nodes}
    for name, status in statuses.items():
        if name not in shards[1:] and status.leader in led:
            led[status.leader] += 1
    for queue in shards[1:]:
        assert led[placed[queue]] == min(led.values()), (queue, placed, led)
        led[placed[queue]] += 1
    fresh = set(statuses) == {*shards, shard_topology.dead_letter_queue}
    if fresh:  # a cluster leading nothing else: three shards, three nodes
        assert len(set(placed.values())) == SHARDS, placed
    assert routes(shard_cluster, shard_topology) == {shard_topology.shard_exchange}


async def test_two_processes_changing_the_shard_count_at_once_always_leave_a_route(
    shard_cluster: RabbitCluster, shard_topology: Topology
) -> None:
    """One process declares 3 shards while another declares 1, round after round, on two
    connections to two nodes, with a random head start: without the lock their changes would
    interleave (bind shards, bind queue, unbind queue, unbind shards: any overlap of the two
    changes) into no route at all.
    A publisher sends mandatory messages with confirms all along, and one more after each round:
    none may come back unroutable."""
    three, one = shard_topology, dataclasses.replace(shard_topology, shards=1)
    nodes = shard_cluster.nodes
    await declare_through(nodes[0].url, one)
    await declare_through(nodes[0].url, three)  # every shard queue exists before the rounds
    await declare_through(nodes[0].url, one)
    a, b, pub = [await aio_pika.connect(n.url, timeout=30) for n in nodes]
    sent, returned = [0], [0]
    stop = asyncio.Event()
    channel = await pub.channel(publisher_confirms=True, on_return_raises=True)
    exchange = await channel.get_exchange(three.exchange)

    async def publish_one() -> None:
        try:
            await exchange.publish(
                aio_pika.Message(b"{}"), routing_key="transaction", mandatory=True
            )
        except aio_pika.exceptions.DeliveryError:
            returned[0] += 1
        sent[0] += 1

    async def publisher() -> None:
        while not stop.is_set():
            await asyncio.gather(*(publish_one() for _ in range(20)))

    async def change(
        connection: aio_pika.abc.AbstractConnection, topology: Topology, late_s: float
    ) -> None:
        await asyncio.sleep(late_s)
        channel = await connection.channel()
        await declare_topology(channel, topology)
        await channel.close()

    rng = random.Random(4104)
    task = asyncio.create_task(publisher())
    try:
        for _ in range(ROUNDS):
            # the 1-shard declare is shorter: started a random while later, so that in some
            # rounds the two route changes meet
            await asyncio.gather(change(a, three, 0), change(b, one, rng.uniform(0, 0.1)))
            await publish_one()  # some route is there after every round
            assert returned[0] == 0, f"round left no route ({returned[0]} of {sent[0]} returned)"
    finally:
        stop.set()
        await task
        for connection in (a, b, pub):
            await connection.close()
    assert returned[0] == 0, f"{returned[0]} of {sent[0]} mandatory messages had no route"
    assert sent[0] > 100


CANCEL_PATH = "the broker cancelled our consumer"  # said only when a Basic.Cancel came
DELETE_ROUNDS = 3  # deletions until one whose Basic.Cancel reached the recorder


async def test_a_deleted_shard_is_declared_again_and_consumed_again(
    shard_cluster: RabbitCluster,
    shard_topology: Topology,
    start_recorder,
    database_url,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A routed shard deleted under a recorder (Basic.Cancel) is declared again, with its
    arguments, and consumed again; readiness counts every shard's consumer (a leftover's cancel,
    a shard pruned, is the only one it lets go).

    RabbitMQ 3.10 now and then loses the cancel of a deleted quorum queue; the queue watch then
    brings the shard back at its next look, and that round proves the watch, not the cancel. So
    the shard is deleted again, up to DELETE_ROUNDS times, until a round whose cancel came: a
    routed shard's cancel taken for a leftover's would leave the shard gone for good."""
    caplog.set_level("WARNING", logger="consumer.consuming")
    await migrate(database_url)
    settings = cluster_settings(
        database_url, shard_cluster.rabbitmq_url, shard_topology, rabbitmq_queue_shards=SHARDS
    )
    rec = await start_recorder(settings)
    broker = await open_broker(shard_cluster, shard_topology)
    third = shard_topology.shard_queue(3)

    async def consumed_again() -> bool:
        # a connection of its own, which declares nothing: only the recorder may bring the
        # shard back
        connection = await aio_pika.connect(shard_cluster.nodes[0].url, timeout=30)
        try:
            channel = await connection.channel()
            declared = await channel.declare_queue(third, passive=True)
        except aio_pika.exceptions.ChannelClosed:
            return False
        finally:
            await connection.close()
        return declared.declaration_result.consumer_count == 1

    paths: list[str] = []
    try:
        for queue in shard_topology.shard_queues():
            assert await _consumers(broker, queue) == 1, queue
        while CANCEL_PATH not in paths and len(paths) < DELETE_ROUNDS:
            caplog.clear()
            await broker.channel.queue_delete(third)
            await wait_for(consumed_again, timeout=60)
            await wait_for(lambda: rec.recorder.ready()[0], timeout=30)
            said = " | ".join(r.getMessage() for r in caplog.records)
            paths.append(CANCEL_PATH if CANCEL_PATH in said else said or "nothing logged")
        assert paths[-1] == CANCEL_PATH, f"no cancel came in {DELETE_ROUNDS} deletions: {paths}"
        assert routes(shard_cluster, shard_topology) == {shard_topology.shard_exchange}
    finally:
        await broker.close()


async def _consumers(broker: Broker, queue: str) -> int:
    declared = await broker.channel.declare_queue(queue, passive=True)
    return int(declared.declaration_result.consumer_count or 0)


async def test_dlq_replay_at_three_shards_spreads_over_the_shards(
    shard_cluster: RabbitCluster, shard_topology: Topology
) -> None:
    """``dlq replay`` publishes to the exchange with the record's routing key: at N = 3 the
    replayed messages reach the shards like new ones (one DLQ for every shard)."""
    topo = shard_topology
    broker = await open_broker(shard_cluster, topo)
    try:
        dlx = await broker.channel.get_exchange(topo.dead_letter_exchange)
        for n in range(60):
            message = aio_pika.Message(
                b"{}", type="transaction", headers={ERROR_HEADER: f"invalid JSON: {n}"}
            )
            await dlx.publish(message, routing_key="transaction")
        assert await broker.ready_count(topo.dead_letter_queue) == 60
        settings = cluster_settings(
            "postgresql://postgres@127.0.0.1:5432/unused",
            shard_cluster.rabbitmq_url,
            topo,
            rabbitmq_queue_shards=SHARDS,
        )
        replayed = await asyncio.to_thread(run_cli, ["dlq", "replay"], settings_env(settings))
        assert replayed.returncode == 0, replayed.stdout + replayed.stderr
        assert await broker.ready_count(topo.dead_letter_queue) == 0
        ready = await shards_ready(broker, topo)
        assert sum(ready) == 60, ready
        assert all(n > 0 for n in ready), ready
    finally:
        await broker.close()


async def test_three_shards_record_every_confirmed_record_once_through_a_node_kill(
    shard_cluster: RabbitCluster, shard_topology: Topology, recorders, database_url, db
) -> None:
    cluster, topo = shard_cluster, shard_topology
    await migrate(database_url)
    conn = await db()
    await declare_through(cluster.nodes[0].url, topo)
    # the records spread over the three shards, whatever their routing key
    first = await publish_load(
        cluster.nodes[1].url, topo.exchange, LoadSpec("mixed", 600, invalid=0.01, seed=4105)
    )
    broker = await open_broker(cluster, topo)
    try:
        ready = await shards_ready(broker, topo)
        assert all(n > 0 for n in ready), ready
        assert sum(ready) == first.published, ready
    finally:
        await broker.close()
    settings = cluster_settings(
        database_url, cluster.rabbitmq_url, topo, rabbitmq_queue_shards=SHARDS
    )
    procs = [await recorders.start(settings) for _ in range(2)]
    # about 1,000 records a second: the backlog a busy machine's recorders leave at the end is
    # what the test waits for last
    traffic = QueueTraffic(cluster.rabbitmq_url, topo.exchange, seed=4106, chunk=100, pause=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(traffic.run(stop))
    await _rows_grow(conn, 1_000)
    # a node SIGKILLed mid-run: the shards it led elect new leaders, the others keep theirs
    before = await asyncio.to_thread(_leaders, cluster, topo)
    killed = cluster.node(before[topo.shard_queues()[-1]])
    await asyncio.to_thread(cluster.kill, killed)
    for queue in topo.shard_queues():
        await asyncio.to_thread(cluster.wait_for_leader, queue, not_on=killed)
    after = await asyncio.to_thread(_leaders, cluster, topo)
    moved = {q for q in before if after[q] != before[q]}
    assert moved == {q for q, leader in before.items() if leader == killed.node}, (before, after)
    await _rows_grow(conn, 500)  # recording while the node is down
    await asyncio.to_thread(cluster.restart, killed)
    for queue in topo.shard_queues():
        await asyncio.to_thread(cluster.wait_all_online, queue)
    stop.set()  # published through the restart too; all of it audited below
    await task
    report, shapes = merge(first, *traffic.reports)
    broker = await open_broker(cluster, topo)
    try:
        await wait_until_settled(db, broker, report, timeout=120)
        await wait_for(lambda: _all_empty(broker, topo), timeout=60)
        for proc in procs:
            assert await proc.terminate() == 0
        audit = await audit_run(
            conn, broker, report, faults=0, expected_dlq=shapes, unconfirmed=traffic.unconfirmed
        )
        for queue in topo.shard_queues()[1:]:
            assert await settled_count(broker, queue) == 0, queue
    finally:
        await broker.close()
    # the node kill may come between a dead letter's confirm and its message's ack: the DLQ is
    # at-least-once (docs/guarantees.md), so repeats there are allowed; none elsewhere
    audit.assert_exact(dlq_surplus_allowed=True)


def _leaders(cluster: RabbitCluster, topology: Topology) -> dict[str, str]:
    """Each shard's leader node now."""
    statuses = cluster.queue_statuses()
    leaders = {q: statuses[q].leader for q in topology.shard_queues()}
    assert all(leaders.values()), leaders
    return {q: leader for q, leader in leaders.items() if leader is not None}


async def _all_empty(broker: Broker, topology: Topology) -> bool:
    return sum(await shards_ready(broker, topology)) == 0


async def test_resharding_1_to_3_to_1_under_traffic_loses_and_doubles_nothing(
    shard_cluster: RabbitCluster, shard_topology: Topology, recorders, database_url, db
) -> None:
    """The documented procedure, under traffic: recorders of the new N rolled in (the first
    one moves the route), the old ones out; back to 1 the same way; then ``shards prune
    --wait`` deletes the drained leftovers and the shard exchange. Exact audit at the end."""
    cluster, three = shard_cluster, shard_topology
    one = dataclasses.replace(three, shards=1)
    await migrate(database_url)
    conn = await db()
    await declare_through(cluster.nodes[0].url, one)
    at_one = cluster_settings(database_url, cluster.rabbitmq_url, one)
    at_three = cluster_settings(database_url, cluster.rabbitmq_url, three, rabbitmq_queue_shards=3)
    old = await recorders.start(at_one)
    traffic = QueueTraffic(cluster.rabbitmq_url, one.exchange, seed=4107, chunk=200, pause=0.1)
    stop = asyncio.Event()
    task = asyncio.create_task(traffic.run(stop))
    try:
        await _rows_grow(conn, 600)
        new = await recorders.start(at_three)  # its declare moves the route onto the shards
        await wait_for_route(cluster, three, three.shard_exchange)
        assert await old.terminate() == 0
        await _rows_grow(conn, 1_000)

        back = await recorders.start(at_one)  # and back: the direct route, shards 2-3 leftovers
        await wait_for_route(cluster, one, one.queue)
        assert await new.terminate() == 0
        await _rows_grow(conn, 600)
        pruned = await asyncio.to_thread(
            run_cli, ["shards", "prune", "--wait", "90"], settings_env(at_one), 150
        )
        assert pruned.returncode == 0, pruned.stdout + pruned.stderr
        for k in (3, 2):
            assert f"deleted {three.shard_queue(k)} (drained)" in pruned.stdout, pruned.stdout
        assert f"deleted exchange {three.shard_exchange}" in pruned.stdout, pruned.stdout
        await _rows_grow(conn, 300)
    finally:
        stop.set()
        await task
    report, shapes = traffic.merged()
    broker = await open_broker(cluster, one)
    try:
        await wait_until_settled(db, broker, report, timeout=120)
        assert await back.terminate() == 0
        audit = await audit_run(
            conn, broker, report, faults=2, expected_dlq=shapes, unconfirmed=traffic.unconfirmed
        )
    finally:
        await broker.close()
    # records exactly once; an invalid message published in the round trip of a route change,
    # while both routes exist, reaches two queues and is dead-lettered twice (at-least-once DLQ)
    audit.assert_exact(dlq_surplus_allowed=True)
    status = await asyncio.to_thread(run_cli, ["shards", "status"], settings_env(at_one))
    assert status.returncode == 0, status.stderr
    assert "absent" in status.stdout.splitlines()[0], status.stdout
    assert three.shard_queue(2) not in status.stdout, status.stdout


async def test_prune_keeps_a_shard_whose_leader_did_not_count_in_time(
    shard_cluster: RabbitCluster, shard_topology: Topology, database_url: str
) -> None:
    """RabbitMQ 3.10 answers a passive declare with 0 messages and 0 consumers when the quorum
    queue's leader does not count within 250 ms (rabbit_quorum_queue:stat/2), which a busy
    node's does. A leftover shard holding records, its leader (the Raft server) suspended while
    ``shards prune`` looks at it (the node itself runs on, so no election moves the leader):
    prune must keep it, name it, and exit 1; the records are still there once the leader
    resumes. Before the fix, prune took the 0 and 0 for drained and deleted the shard with its
    records."""
    cluster, three = shard_cluster, shard_topology
    one = dataclasses.replace(three, shards=1)
    await declare_through(cluster.nodes[0].url, three)
    spec = LoadSpec("mixed", 300, invalid=0.0, seed=4111)
    first = await publish_load(cluster.nodes[0].url, three.exchange, spec)
    leaders = await asyncio.to_thread(_leaders, cluster, three)
    slow = cluster.node(leaders[three.shard_queue(3)])
    # prune talks to another node than the suspended leader's (the balanced locator does not
    # always put shard 1's leader elsewhere: make test at 4210fac had both on one node)
    live = next(node for node in cluster.nodes if node is not slow)
    broker = await open_broker(cluster, three)
    try:
        before = await shards_ready(broker, three)
        assert sum(before) == first.published, before
        assert before[2] > 0, before
        at_one = cluster_settings(database_url, live.url, one)
        name = await asyncio.to_thread(
            slow.erl,
            f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, '
            f'<<"{three.shard_queue(3)}">>)), {{Name, _}} = amqqueue:get_pid(Q), '
            "ok = sys:suspend(Name), Name",
        )
        try:
            prune = asyncio.create_task(
                asyncio.to_thread(run_cli, ["shards", "prune"], settings_env(at_one), 120)
            )
            await asyncio.wait([prune], timeout=30)  # a deletion would wait for the leader
        finally:  # (a leader deleted meanwhile has nothing to resume)
            await asyncio.to_thread(slow.erl, f"catch sys:resume('{name}')")
        pruned = await prune
        assert pruned.returncode == 1, pruned.stdout + pruned.stderr
        assert f"deleted {three.shard_queue(3)}" not in pruned.stdout, pruned.stdout
        named = f"{three.shard_queue(3)} (no count from its leader within 0.25 s)"
        assert named in pruned.stderr, pruned.stderr

        async def kept() -> bool:  # the node runs again: its count comes back whole
            return (await shards_ready(broker, three))[2] == before[2]

        await wait_for(kept, timeout=30, interval=0.5)
    finally:
        await broker.close()


async def _rows_grow(conn, by: int) -> None:
    start = await row_counts(conn)

    async def grown() -> bool:
        return await row_counts(conn) >= start + by

    await wait_for(grown, timeout=120)
