"""The node that leads both the queue and its DLQ SIGKILLed under steady traffic (issue 23, item 1).

Both quorum queues are declared through one node, so (RabbitMQ's default ``client-local``
leader placement) that node leads both, which the test checks with ``rabbitmqctl list_queues
name leader`` before the kill. Two recorders consume while a paced publisher keeps sending
valid records with one invalid message in 20 among them, so dead-letter publishes are under
way when the node dies and go on through the DLQ's election. The node stays down a few
seconds and is restarted; then the node that leads the queue by then is SIGKILLed too.

The measure is the longest stretch without a commit after each kill, read off PostgreSQL
(:class:`tests.cluster.failover_support.CommitWatch`) while records wait: at most
:data:`MAX_STALL_S` at every kill. The 11-18 s once reported after the first kill of
``test_broker_failover.py`` was that test's quiet queue between its two loads, not a stall
(docs/high-availability.md).

``LEADER_KILL_RUNS=N`` repeats the run N times, each on queues of its own with both leaders on
the victim again, and prints every kill's figures and the load average::

    LEADER_KILL_RUNS=5 .venv/bin/pytest -qs tests/cluster/test_dlq_leader_loss.py
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from dataclasses import dataclass, field

import aio_pika
import aiormq
import pytest
from pamqp import commands as spec

from bulk_recorder.infra.migrate import migrate
from consumer.tools.generator import Generator, dump
from consumer.topology import Topology, declare_topology, delete_topology
from tests.cluster.failover_support import (
    CommitWatch,
    cluster_settings,
    longest_gap_after,
    waits_without_commit,
)
from tests.rigs.rabbitmq_cluster import RabbitCluster
from tests.rigs.rabbitmq_node import RabbitNode

MAX_STALL_S = 3.0
RATE = 400  # messages a second from the paced publisher
INVALID_EVERY = 20  # one message in 20 is invalid: 20 dead letters a second
DOWN_S = 3.0  # the first victim stays down this long before its restart
AFTER_KILL_S = 10.0  # traffic goes on this long after the second kill
RUNS = int(os.environ.get("LEADER_KILL_RUNS", "1"))
BOTH = "queue + DLQ leader"

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.postgres,
    pytest.mark.timeout(60 + 300 * RUNS),
    pytest.mark.exclusive(reason="times the stall after the leaders' loss against 3 s"),
]


@dataclass
class PacedPublisher:
    """Publishes ``RATE`` messages a second, confirms awaited in the background; keeps the ids
    of the valid records the broker confirmed. On a lost connection it goes on through another
    running node (a message without a confirm is not counted as sent)."""

    cluster: RabbitCluster
    exchange: str
    seed: int
    confirmed: set[str] = field(default_factory=set)
    ready: list[float] = field(default_factory=list)  # when each valid record was confirmed
    acks: list[float] = field(default_factory=list)  # when each publish was confirmed
    invalid_confirmed: int = 0
    unconfirmed: int = 0
    stopped_at: float = float("inf")  # when it stopped publishing
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> PacedPublisher:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        self.stopped_at = time.monotonic()
        self._stop.set()
        assert self._task is not None
        await self._task

    async def _run(self) -> None:
        gen = Generator.create(self.seed)
        pending: set[asyncio.Task[None]] = set()
        n = attempt = 0
        while not self._stop.is_set():
            nodes = self.cluster.running_nodes()
            url = nodes[attempt % len(nodes)].url
            attempt += 1
            try:
                connection = await aio_pika.connect(url, timeout=10)
            except (aiormq.exceptions.AMQPError, OSError, TimeoutError):
                continue
            try:
                channel = await connection.channel(publisher_confirms=True)
                raw = await channel.get_underlay_channel()
                n = await self._paced(raw, gen, n, pending)
            except (aiormq.exceptions.AMQPError, OSError):
                pass  # the node died: go on through another
            finally:
                if pending:
                    await asyncio.wait(pending, timeout=60)
                with contextlib.suppress(aiormq.exceptions.AMQPError, OSError):
                    await connection.close()

    async def _paced(
        self,
        raw: aiormq.abc.AbstractChannel,
        gen: Generator,
        n: int,
        pending: set[asyncio.Task[None]],
    ) -> int:
        tick = 0.05
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while not self._stop.is_set() and not raw.is_closed:
            for _ in range(int(RATE * tick)):
                n += 1
                task = asyncio.create_task(self._one(raw, gen, n))
                pending.add(task)
                task.add_done_callback(pending.discard)
            next_at += tick
            await asyncio.sleep(max(0.0, next_at - loop.time()))
        return n

    async def _one(self, raw: aiormq.abc.AbstractChannel, gen: Generator, n: int) -> None:
        if n % INVALID_EVERY == 0:
            body, record_type, _ = gen.invalid(n // INVALID_EVERY)
            record_id = None
        else:
            record_type = ("transaction", "credit_annotation")[n % 2]
            record = gen.record(record_type)
            body, record_id = dump(record), record["id"]
        properties = spec.Basic.Properties(
            content_type="application/json",
            message_type=record_type,
            message_id=record_id,
            delivery_mode=2,
        )
        try:
            confirm = await raw.basic_publish(
                body,
                exchange=self.exchange,
                routing_key=record_type or "untyped",
                properties=properties,
                timeout=60,
            )
        except (aiormq.exceptions.AMQPError, OSError, TimeoutError, asyncio.CancelledError):
            self.unconfirmed += 1
            return
        if not isinstance(confirm, spec.Basic.Ack):
            self.unconfirmed += 1
            return
        self.acks.append(time.monotonic())
        if record_id is None:
            self.invalid_confirmed += 1
        else:
            self.confirmed.add(record_id)
            self.ready.append(time.monotonic())


async def _declare_through(node: RabbitNode, topo: Topology) -> None:
    connection = await aio_pika.connect(node.url, timeout=30)
    try:
        await declare_topology(await connection.channel(), topo)
    finally:
        await connection.close()


async def _delete(cluster: RabbitCluster, topo: Topology) -> None:
    connection = await aio_pika.connect(cluster.running_nodes()[0].url, timeout=30)
    try:
        await delete_topology(connection, topo)
    finally:
        await connection.close()


@dataclass
class Kill:
    what: str  # which leaders the node held
    node: str
    stall_s: float  # the longest stretch without a commit while records waited
    own_s: float  # of which the broker confirmed publishes meanwhile (the queue took work)
    line: str


def _measure(
    watch: CommitWatch,
    publisher: PacedPublisher,
    base: int,
    window: tuple[float, float],
    which: str,
    node: RabbitNode,
    held: str,
) -> Kill:
    """One kill's figures, from the kill to the end of its window (the next kill, or the end
    of the traffic and every confirmed record committed).

    A stretch without a commit while records waited is the recorders' own only where the
    queue went on taking work: its longest span in which the broker confirmed no publish at
    all (the quorum queue stalled for everyone, e.g. while a restarted member rejoins on a
    starved machine) is the broker's, and is subtracted (both are printed)."""
    killed, end = window
    rows = max([base] + [v for t, v in watch.samples if t <= end])
    acks = sorted(publisher.acks)
    stretches = waits_without_commit(watch, killed, sorted(publisher.ready), base, rows)
    stall, own, at = 0.0, 0.0, 0.0
    quiet = publisher.stopped_at  # no publish after it, hence no confirm: not a frozen broker
    for start, stop in stretches:
        frozen = longest_gap_after(acks, start, min(stop, quiet)) if start < quiet else 0.0
        stall = max(stall, stop - start)
        if stop - start - frozen >= own:
            own, at = stop - start - frozen, start - killed
    what = f"{which} ({held})"
    line = (
        f"{what}, {node.name} SIGKILLed: first commit after "
        f"{watch.first_change_after(killed) or 0:.2f} s; longest stretch without a commit while "
        f"records waited {stall:.2f} s, the recorders' own {own:.2f} s (at +{at:.2f} s); the "
        f"broker confirmed no publish for {longest_gap_after(acks, killed, min(end, quiet)):.2f} s"
    )
    print(line)
    return Kill(what, node.name, stall, own, line)


async def _one_run(run: int, cluster: RabbitCluster, recorders, database_url: str) -> list[Kill]:
    """Kill the node leading the queue and its DLQ; restart it; kill the queue's next leader."""
    suffix = uuid.uuid4().hex[:10]
    topo = Topology(exchange=f"dlql.{suffix}", queue=f"dlql.{suffix}.records", delivery_limit=5)
    victim = cluster.nodes[run % len(cluster.nodes)]
    await _declare_through(victim, topo)  # client-local placement: both leaders on the victim
    for queue in (topo.queue, topo.dead_letter_queue):
        await asyncio.to_thread(cluster.wait_all_online, queue)
        leader = await asyncio.to_thread(cluster.leader_of, queue)
        assert leader is victim, f"{queue} is led by {leader.name}, not {victim.name}"
    procs = [
        await recorders.start(
            cluster_settings(database_url, cluster.rabbitmq_url, topo, **overrides),
            name=f"run{run}-recorder",
        )
        for overrides in ({}, {"bulk_recorder_size": 200, "rabbitmq_numbers_of_workers": 3})
    ]
    watch = await CommitWatch(database_url).start()
    await _wait(lambda: bool(watch.samples), 30, "the commit watch's first count")
    before = watch.latest()  # rows of the earlier runs
    publisher = PacedPublisher(cluster, topo.exchange, seed=2300 + run).start()
    try:
        await _wait(lambda: watch.latest() > before + RATE, 60, "the recorders committing")
        killed_1 = time.monotonic()
        await asyncio.to_thread(cluster.kill, victim)
        await asyncio.sleep(DOWN_S)  # the scenario: the node stays down a few seconds
        await asyncio.to_thread(cluster.restart, victim)
        await asyncio.to_thread(cluster.wait_all_online, topo.queue)
        back_after = time.monotonic() - killed_1
        victim_2 = await asyncio.to_thread(cluster.leader_of, topo.queue)
        dlq_leader = await asyncio.to_thread(cluster.leader_of, topo.dead_letter_queue)
        killed_2 = time.monotonic()
        await asyncio.to_thread(cluster.kill, victim_2)
        await asyncio.sleep(AFTER_KILL_S)  # traffic goes on through the other nodes
        await publisher.stop()
        expected = before + len(publisher.confirmed)
        await _wait(lambda: watch.latest() >= expected, 120, f"{expected} rows recorded")
        done = time.monotonic()
        assert all(p.running for p in procs), "a recorder died"
        second = "queue + DLQ leader" if dlq_leader is victim_2 else "queue leader only"
        kills = [
            _measure(watch, publisher, before, (killed_1, killed_2), "1st kill", victim, BOTH),
            _measure(watch, publisher, before, (killed_2, done), "2nd kill", victim_2, second),
        ]
        print(
            f"run {run}: {len(publisher.confirmed)} valid and {publisher.invalid_confirmed} "
            f"invalid confirmed, {publisher.unconfirmed} unconfirmed; the first victim back "
            f"(a member of the queue again) +{back_after:.1f} s after its kill"
        )
    finally:
        await watch.stop()
        for node in cluster.nodes:
            if not node.running:
                await asyncio.to_thread(cluster.restart, node)
        for proc in procs:
            if proc.running:
                await proc.terminate()
        await _delete(cluster, topo)
    return kills


async def _wait(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.05)


async def test_losing_the_node_that_leads_the_queue_and_its_dlq_stalls_commits_3_s_at_most(
    rabbit_cluster: RabbitCluster, recorders, database_url
) -> None:
    await migrate(database_url)
    kills: list[Kill] = []
    for run in range(RUNS):
        kills += await _one_run(run, rabbit_cluster, recorders, database_url)
    print("\nload average (1, 5, 15 min):", [round(x, 1) for x in os.getloadavg()])
    for what in sorted({k.what for k in kills}):
        mine = [k for k in kills if k.what == what]
        stall, own = [k.stall_s for k in mine], [k.own_s for k in mine]
        print(
            f"{what}, {len(mine)} kills: without a commit while records waited "
            f"{min(stall):.2f}-{max(stall):.2f} s, "
            f"the recorders' own {min(own):.2f}-{max(own):.2f} s"
        )
    worst = max(kills, key=lambda k: k.own_s)
    assert worst.own_s <= MAX_STALL_S, f"too long without a commit: {worst.line}"
