"""Self-tests of the cluster rigs: they must fail the way production clusters fail.

RabbitMQ: a quorum queue declared on the three-node cluster is replicated on all three; the
SIGKILL of its leader's node elects a leader elsewhere while nothing confirmed is lost, and the
killed node boots on its own data, rejoins and votes again. PostgreSQL: a synchronous standby
holds every commit that returned; after the primary's SIGKILL and ``pg_ctl promote`` the
multi-host DSN with ``target_session_attrs=read-write`` reaches the promoted server; a commit
the standby lacks is never acknowledged in synchronous mode, and is acknowledged and then lost
in asynchronous mode.

Nothing is mocked: real ``rabbitmq-server`` nodes and real PostgreSQL servers, real SIGKILLs.
The rigs block, so their slow calls go through ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable

import aio_pika
import asyncpg
import pytest
from aiormq.abc import FieldTable

from tests.cluster.conftest import PgClusterFactory
from tests.conftest import unique_name, wait_for
from tests.rigs.postgres_cluster import PgCluster
from tests.rigs.rabbitmq_cluster import RabbitCluster
from tests.rigs.rabbitmq_node import ErlCallError, RabbitNode

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(180)]

QUORUM: FieldTable = {"x-queue-type": "quorum"}


# -- RabbitMQ ---------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def channel_on(node: RabbitNode) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    """A confirming channel on one node (closing tolerates a node that died meanwhile)."""
    connection = await aio_pika.connect(node.url, timeout=30)
    try:
        yield await connection.channel(publisher_confirms=True)
    finally:
        with contextlib.suppress(Exception):
            await connection.close()


async def publish(node: RabbitNode, queue: str, bodies: list[bytes]) -> None:
    """Publish through ``node`` and wait for every confirm (a quorum majority has them)."""
    async with channel_on(node) as channel:
        await asyncio.gather(
            *(
                channel.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=queue,
                )
                for body in bodies
            )
        )


async def consume_all(node: RabbitNode, queue: str, expected: int) -> list[bytes]:
    """Consume (and ack) ``expected`` messages through ``node``; then check none is left."""
    got: list[bytes] = []
    async with channel_on(node) as channel:
        await channel.set_qos(prefetch_count=100)
        q = await channel.declare_queue(queue, passive=True)
        async with q.iterator() as messages:
            async for message in messages:
                await message.ack()
                got.append(message.body)
                if len(got) == expected:
                    break
        assert await q.get(fail=False) is None, "more messages than published"
    return got


async def declare_quorum_queue(node: RabbitNode) -> str:
    name = unique_name("brha.q")
    async with channel_on(node) as channel:
        await channel.declare_queue(name, durable=True, arguments=QUORUM)
    return name


async def delete_queue(cluster: RabbitCluster, name: str) -> None:
    node = cluster.running_nodes()[0]
    async with channel_on(node) as channel:
        await channel.queue_delete(name)


async def test_quorum_queue_is_replicated_on_every_node(rabbit_cluster: RabbitCluster) -> None:
    cluster = rabbit_cluster
    nodes = cluster.nodes
    assert len({n.amqp_port for n in nodes} | {n.dist_port for n in nodes}) == 6
    assert len({n.base_dir for n in nodes}) == 3
    assert cluster.rabbitmq_url.split(",") == [n.url for n in nodes]
    assert sorted(await asyncio.to_thread(cluster.cluster_running_nodes)) == sorted(
        n.node for n in nodes
    )

    queue = await declare_quorum_queue(nodes[1])
    try:
        status = await asyncio.to_thread(cluster.wait_all_online, queue)
        assert status.members == tuple(sorted(n.node for n in nodes))
        assert status.leader in status.members
        # a message published on one node is consumed on another
        await publish(nodes[0], queue, [b"hello"])
        assert await consume_all(nodes[2], queue, 1) == [b"hello"]
    finally:
        await delete_queue(cluster, queue)


ITEMS = (
    "name",
    "type",
    "leader",
    "members",
    "online",
    "messages_ready",
    "messages_unacknowledged",
    "consumers",
)

STATUS = ("cluster_status", "--formatter", "json")


def _by_name(rows: list[dict[str, object]]) -> dict[object, dict[str, object]]:
    return {row["name"]: row for row in rows}


async def test_a_nodes_answers_over_erl_call_are_rabbitmqctls(
    rabbit_cluster: RabbitCluster,
) -> None:
    """The rigs ask the nodes with erl_call (no Erlang VM booted a question): the queues' rows
    and the cluster's status must be what rabbitmqctl reports, for a quorum queue with a message
    ready and a classic one, and for the cluster's running nodes and partitions."""
    cluster = rabbit_cluster
    node = cluster.nodes[2]
    quorum = await declare_quorum_queue(cluster.nodes[0])
    classic = unique_name("brha.classic")
    async with channel_on(cluster.nodes[1]) as channel:
        await channel.declare_queue(classic, auto_delete=False)
    try:
        await asyncio.to_thread(cluster.wait_all_online, quorum)
        await publish(cluster.nodes[0], quorum, [b"one", b"two"])

        async def ready() -> bool:  # a quorum queue's counts are its metrics' last tick
            rows = _by_name(await asyncio.to_thread(node.queue_rows, "name", "messages_ready"))
            return rows.get(quorum, {}).get("messages_ready") == 2

        await wait_for(ready, timeout=30)
        listed = await asyncio.to_thread(
            node.ctl, "list_queues", "--quiet", "--formatter", "json", *ITEMS
        )
        asked = await asyncio.to_thread(node.queue_rows, *ITEMS)
        ours = {quorum, classic}
        expected = {k: v for k, v in _by_name(json.loads(listed.stdout)).items() if k in ours}
        got = {k: v for k, v in _by_name(asked).items() if k in ours}
        assert set(got) == ours
        assert got == expected
        assert got[quorum]["messages_ready"] == 2
        assert got[quorum]["type"] == "quorum"
        assert got[classic]["type"] == "classic"

        status = json.loads((await asyncio.to_thread(node.ctl, *STATUS)).stdout)
        mine = await asyncio.to_thread(node.cluster_status)
        assert sorted(mine["running_nodes"]) == sorted(status["running_nodes"])
        assert sorted(mine["running_nodes"]) == sorted(n.node for n in cluster.nodes)
        assert mine["partitions"] == status["partitions"] == {}
        assert await asyncio.to_thread(node.booted)

        # a node whose rabbit application is not running answers nothing, as rabbitmqctl
        # refuses to (its Mnesia, while it boots, would still list it as running)
        await asyncio.to_thread(node.ctl, "stop_app")
        try:
            assert not await asyncio.to_thread(node.booted)
            for question in (node.cluster_status, node.queue_rows):
                with pytest.raises(ErlCallError, match="not running"):
                    await asyncio.to_thread(question)
            refused = await asyncio.to_thread(node.ctl, *STATUS, check=False)
            assert refused.returncode != 0
        finally:
            await asyncio.to_thread(node.ctl, "start_app")
        assert await asyncio.to_thread(node.booted)
    finally:
        await delete_queue(cluster, quorum)
        await delete_queue(cluster, classic)


# Questions asked of one node at once: more than the rigs ever ask together (a test's poll, a
# watchdog's, a fault's own).
AT_ONCE = 8


async def test_questions_asked_of_one_node_at_once_all_answer(
    rabbit_cluster: RabbitCluster,
) -> None:
    """Each erl_call is a hidden node of its own to the node it asks. With ``-r`` its name was
    ``c`` and the second modulo 997: calls in the same second had the same name, and the node
    refused each one while it still held a connection of that name (a call that had just
    ended, on a node busy with a peer's SIGKILL: test_shards' node kill failed so; 7 of 8 calls
    at once, by hand). Every call has a name of its own now."""
    node = rabbit_cluster.nodes[0]
    answers = await asyncio.gather(
        *(asyncio.to_thread(node.erl, "timer:sleep(300), ok") for _ in range(AT_ONCE)),
        return_exceptions=True,
    )
    assert answers == ["ok"] * AT_ONCE, answers


def _queue_process(name: str) -> str:
    """An Erlang expression binding ``P`` to the pid of the classic queue ``name`` on "/"."""
    return (
        f'{{ok, Q}} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"{name}">>)), '
        "P = amqqueue:get_pid(Q)"
    )


async def test_a_queue_that_ends_while_the_rows_are_asked_is_left_out_as_rabbitmqctl_does(
    rabbit_cluster: RabbitCluster,
) -> None:
    """A queue whose process ends while it is asked for its row (deleted, its exclusive owner
    gone, its node's shutdown) is left out of the rows, as rabbitmqctl list_queues leaves it
    out, and the other queues' rows are still given. make test at 4b2e1c5 failed on this: a
    classic queue ended during a node kill, and the rows raised ErlCallError instead. Here the
    queue's process is suspended, so the question waits on it, and is then ended with the
    reason ``normal`` (what a queue's own end gives a caller)."""
    cluster = rabbit_cluster
    node, owner = cluster.nodes[2], cluster.nodes[1]
    ending, staying = unique_name("brha.ending"), unique_name("brha.staying")
    async with channel_on(owner) as channel:
        for name in (ending, staying):
            await channel.declare_queue(name, auto_delete=False)
    try:
        await asyncio.to_thread(owner.erl, f"{_queue_process(ending)}, sys:suspend(P)")
        asked = asyncio.create_task(asyncio.to_thread(node.queue_rows, "name", "type"))

        async def waiting() -> bool:  # the question is in the suspended process's mailbox
            length = await asyncio.to_thread(
                owner.erl,
                f"{_queue_process(ending)}, element(2, erlang:process_info(P, message_queue_len))",
            )
            return isinstance(length, int) and length >= 1

        await wait_for(waiting, timeout=30)
        assert not asked.done()
        await asyncio.to_thread(owner.erl, f"{_queue_process(ending)}, sys:terminate(P, normal)")
        names = {row["name"] for row in await asyncio.wait_for(asked, timeout=30)}
        assert staying in names
        assert ending not in names
        # asked again after the end, both answers agree
        listed = await asyncio.to_thread(
            node.ctl, "list_queues", "--quiet", "--formatter", "json", "name"
        )
        again = await asyncio.to_thread(node.queue_rows, "name")
        ctl_names = {row["name"] for row in json.loads(listed.stdout)}
        assert {row["name"] for row in again} == ctl_names
        assert staying in ctl_names
    finally:
        with contextlib.suppress(Exception):
            await delete_queue(cluster, ending)
        await delete_queue(cluster, staying)


async def test_leader_loss_elects_a_new_leader_and_the_node_rejoins(
    rabbit_cluster: RabbitCluster,
) -> None:
    cluster = rabbit_cluster
    queue = await declare_quorum_queue(cluster.nodes[0])
    try:
        await asyncio.to_thread(cluster.wait_all_online, queue)
        before = [f"before-{i}".encode() for i in range(200)]
        await publish(cluster.nodes[0], queue, before)

        leader = await asyncio.to_thread(cluster.leader_of, queue)
        killed_at = time.monotonic()
        await asyncio.to_thread(cluster.kill, leader)
        new_leader = await asyncio.to_thread(cluster.wait_for_leader, queue, not_on=leader)
        elected = time.monotonic() - killed_at
        assert new_leader is not leader
        assert not leader.running
        # a node that is down gives no answer: an error, not an empty one
        with pytest.raises(ErlCallError):
            await asyncio.to_thread(leader.erl, "node()")
        assert not await asyncio.to_thread(leader.booted)

        # through the survivors: publish via one, consume everything via the other
        survivors = [n for n in cluster.nodes if n is not leader]
        during = [f"during-{i}".encode() for i in range(50)]
        await publish(survivors[0], queue, during)
        got = await consume_all(survivors[1], queue, len(before) + len(during))
        assert sorted(got) == sorted(before + during), "confirmed messages lost or doubled"

        # published while the node is down: the restarted member must catch up
        after = [f"after-{i}".encode() for i in range(50)]
        await publish(survivors[0], queue, after)
        restarted_at = time.monotonic()
        await asyncio.to_thread(cluster.restart, leader)
        status = await asyncio.to_thread(cluster.wait_all_online, queue)
        rejoined = time.monotonic() - restarted_at
        assert leader.node in status.online

        # the restarted node votes again: without it the last survivor would have no majority
        # once the current leader dies, and no leader could be elected
        current = await asyncio.to_thread(cluster.leader_of, queue)
        assert current is not leader
        await asyncio.to_thread(cluster.kill, current)
        third = await asyncio.to_thread(cluster.wait_for_leader, queue, not_on=current)
        assert third is not current
        got = await consume_all(leader, queue, len(after))
        assert sorted(got) == sorted(after)
        print(
            f"\nrabbit cluster: leader {leader.name} killed, new leader in {elected:.1f} s; "
            f"restarted node back online in {rejoined:.1f} s"
        )
    finally:
        await delete_queue(cluster, queue)


# -- PostgreSQL -------------------------------------------------------------------------------
LSN = "SELECT pg_current_wal_lsn()::text"


async def connect(dsn: str) -> asyncpg.Connection:
    return await asyncpg.connect(dsn, timeout=10)


def replayed_on_standby(cluster: PgCluster, lsn: str) -> Callable[[], bool]:
    """True once the standby has replayed the primary's WAL up to ``lsn``."""
    query = f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"
    return lambda: cluster.standby.sql(query) == "t"


async def test_sync_standby_holds_every_committed_row(pg_clusters: PgClusterFactory) -> None:
    cluster = await asyncio.to_thread(pg_clusters, True)
    assert cluster.replication_state() == "sync"
    primary = await connect(cluster.primary.dsn())
    standby = await connect(cluster.standby.dsn())
    try:
        await primary.execute("CREATE TABLE t (id int PRIMARY KEY)")
        await primary.execute("INSERT INTO t SELECT generate_series(1, 100)")
        await wait_for(replayed_on_standby(cluster, await primary.fetchval(LSN)), timeout=30)
        assert await standby.fetchval("SELECT count(*) FROM t") == 100
        with pytest.raises(asyncpg.ReadOnlySQLTransactionError):  # SQLSTATE 25006
            await standby.execute("INSERT INTO t VALUES (0)")
    finally:
        await primary.close()
        await standby.close()


async def test_failover_multi_host_dsn_reaches_the_promoted_standby(
    pg_clusters: PgClusterFactory,
) -> None:
    cluster = await asyncio.to_thread(pg_clusters, True)
    # the standby listed first: target_session_attrs=read-write still picks the primary
    dsn = cluster.multi_host_dsn(standby_first=True)
    conn = await connect(dsn)
    assert await conn.fetchval("SELECT inet_server_port()") == cluster.primary.port
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    for i in range(1, 101):  # a hundred commits, each acknowledged on its own
        await conn.execute("INSERT INTO t VALUES ($1)", i)

    killed_at = time.monotonic()
    await asyncio.to_thread(cluster.primary.kill)
    await wait_for(conn.is_closed, timeout=30)  # the server went away under the connection
    # in the gap no server is read-write: the primary refuses, the standby is in recovery
    with pytest.raises((OSError, asyncpg.TargetServerAttributeNotMatched)):
        await connect(dsn)

    await asyncio.to_thread(cluster.standby.promote)
    conn = await connect(dsn)
    try:
        assert await conn.fetchval("SELECT inet_server_port()") == cluster.standby.port
        assert await conn.fetchval("SELECT pg_is_in_recovery()") is False
        await conn.execute("INSERT INTO t VALUES (101)")
        writable = time.monotonic() - killed_at
        assert await conn.fetchval("SELECT count(*) FROM t") == 101, "an acked commit was lost"
    finally:
        await conn.close()
    print(
        f"\npostgres: pair started in {cluster.timings['start']:.1f} s; primary killed -> first "
        f"commit on the promoted standby through the multi-host DSN {writable:.2f} s"
    )


async def test_sync_commit_the_standby_lacks_is_never_acknowledged(
    pg_clusters: PgClusterFactory,
) -> None:
    cluster = await asyncio.to_thread(pg_clusters, True)
    conn = await connect(cluster.primary.dsn())
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    await conn.execute("INSERT INTO t VALUES (1)")
    await asyncio.to_thread(cluster.detach_standby)

    commit = asyncio.create_task(conn.execute("INSERT INTO t VALUES (2)"))
    # committed locally, and waiting for a standby that will never confirm it
    await wait_for(
        lambda: (
            cluster.primary.sql(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            )
            == "1"
        ),
        timeout=30,
    )
    assert not commit.done()
    await asyncio.to_thread(cluster.failover)
    with pytest.raises(asyncpg.ConnectionDoesNotExistError):
        await commit  # the client never got an acknowledgement
    conn.terminate()

    conn = await connect(cluster.multi_host_dsn())
    try:
        rows = [r["id"] for r in await conn.fetch("SELECT id FROM t ORDER BY id")]
    finally:
        await conn.close()
    assert rows == [1], "the acked row survives; the unacknowledged one is not there"


async def test_async_standby_loses_an_acknowledged_commit(pg_clusters: PgClusterFactory) -> None:
    """What asynchronous replication costs: a commit the client saw succeed, gone after failover.

    Deterministic because the standby's WAL receiver is stopped first (a standby that lags, as
    under load or a slow link, opens the same window only for a while).
    """
    cluster = await asyncio.to_thread(pg_clusters, False)
    assert cluster.replication_state() == "async"
    conn = await connect(cluster.primary.dsn())
    await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    await conn.execute("INSERT INTO t VALUES (1)")
    await wait_for(replayed_on_standby(cluster, await conn.fetchval(LSN)), timeout=30)
    await asyncio.to_thread(cluster.detach_standby)

    assert await conn.execute("INSERT INTO t VALUES (2)") == "INSERT 0 1"  # acknowledged
    assert await conn.fetchval("SELECT count(*) FROM t") == 2
    conn.terminate()
    await asyncio.to_thread(cluster.failover)

    conn = await connect(cluster.multi_host_dsn())
    try:
        assert await conn.fetchval("SELECT inet_server_port()") == cluster.standby.port
        rows = [r["id"] for r in await conn.fetch("SELECT id FROM t ORDER BY id")]
    finally:
        await conn.close()
    assert rows == [1], "row 2, acknowledged on the primary, must be missing after failover"
