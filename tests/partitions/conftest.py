"""Partition fixtures: the system on hosts in network namespaces (tests/rigs/hosted.py).

``hosts`` is one :class:`~tests.rigs.hosted.Hosts` for the session (namespaces and the
three-node RabbitMQ cluster, some 30 s to start), stopped once no test left in the session
needs it; its teardown checks that nothing is left behind (namespaces, links or rules of the
root namespace changed) and fails the session's last test that used it if something is.
``hosted`` gives each test a fresh PostgreSQL pair, forwarders and a process launcher, and
heals every partition afterwards, waiting until the cluster has every node running again
(:func:`cluster_whole`, which nudges a node stuck in ``global`` on its way back from
pause_minority, as an operator of RabbitMQ 3.10.8 on OTP 25 must: :class:`GlobalNudge`).
``hosted_topology`` makes unique exchange and queue names on the cluster and deletes them,
with ``shards`` queue shards (1 here; a module overrides the fixture, as the nemesis run does
with ``SOAK_SHARDS``). With ``SOAK_SHARDS`` above 1 the session's broker nodes run the random
exchange plugin that RABBITMQ_QUEUE_SHARDS > 1 routes through.

Without root the tests skip, saying so; as root without ``ip`` or ``nft`` they fail (``make
test`` installs them: ``make system-tools``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
import pytest

from consumer.topology import Topology, declare_topology, delete_topology
from tests.faults.conftest import (
    RecorderPool,
    recorders,  # noqa: F401  (real service processes)
)
from tests.rigs import netns, postgres_cluster, rabbitmq_node
from tests.rigs.hosted import Hosted, Hosts, start_pg
from tests.rigs.rabbitmq_node import ErlCallError, RabbitNode
from tests.rigs.wait import poll

# Every node of the rig's cluster: what docs/high-availability.md ships (pause_minority: a node
# that loses the majority closes its clients' connections and they move), and a shorter
# net_ticktime than the default 60 s so a partition is detected in 8-12 s instead of 45-75 s.
NET_TICKTIME = 10
# info: a node's partition handling (paused, recovering, restarting) is logged at info
RABBIT_CONFIG = (
    f"cluster_partition_handling = pause_minority\nnet_ticktime = {NET_TICKTIME}\n"
    "log.console.level = info\n"
)


# RABBITMQ_QUEUE_SHARDS of the nemesis run's roles (make soak-partitions SHARDS=N)
SHARDS = int(os.environ.get("SOAK_SHARDS", "1"))
# enabled at boot on every broker node when SHARDS > 1: the shards route through an x-random
# exchange
SHARD_PLUGINS = ("rabbitmq_random_exchange",)


def _check_machine() -> None:
    lacking = netns.missing()
    if "root" in lacking:
        pytest.skip("needs root: the partition rig makes network namespaces and nft rules")
    if lacking:
        pytest.fail(f"the partition rig needs {', '.join(lacking)}: run `make system-tools`")
    if not rabbitmq_node.available() or not postgres_cluster.available():
        pytest.fail("the partition rig needs the installed rabbitmq-server and PostgreSQL 15")


_STARTED: list[Hosts] = []

# The scenarios' reports, shown again in pytest's summary (make test and make soak-partitions
# print them even when the tests pass).
REPORTS: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORTS:
        terminalreporter.section("partition runs")
        for report in REPORTS:
            terminalreporter.write_line(report)


@pytest.fixture(scope="session")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    _check_machine()
    folder = tmp_path_factory.mktemp("netns")
    started = Hosts.start(folder, RABBIT_CONFIG, plugins=SHARD_PLUGINS if SHARDS > 1 else ())
    _STARTED.append(started)
    print(
        f"\nnetns rig {started.net.prefix}: cluster start {started.rabbit.timings['start']:.1f} s"
    )
    try:
        yield started
    finally:
        _stop(started)


def _stop(started: Hosts) -> None:
    if started in _STARTED:
        _STARTED.remove(started)
        left = started.stop()
        assert left == [], f"the partition rig left things behind: {left}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # the test's own fixtures first
    items = item.session.items
    rest = items[items.index(nextitem) :] if nextitem is not None else []
    if not any("hosts" in getattr(i, "fixturenames", ()) for i in rest):
        for started in list(_STARTED):
            _stop(started)


View = tuple[set[str], list[str]]  # the nodes one node reports running, and its partitions


def node_view(node: RabbitNode, timeout: float = 30) -> tuple[View, dict[str, list[str]]]:
    """What ``node`` reports (the nodes running, its partitions as lines), and the partitions
    themselves: each node with the nodes it recorded as partitioned from it."""
    try:
        status = node.cluster_status(timeout=timeout)
    except subprocess.TimeoutExpired:  # a busy machine: not whole yet
        return (set(), [f"no answer in {timeout:.0f} s"]), {}
    except ErlCallError as exc:  # booting, paused, stuck on its way back, or down
        return (set(), [f"no answer: {exc}"[:200]]), {}
    partitions = {str(k): [str(n) for n in v] for k, v in (status.get("partitions") or {}).items()}
    running = set(status.get("running_nodes") or ())
    return (running, [f"{k}: {v}" for k, v in partitions.items()]), partitions


# A node back from pause_minority boots again through global:sync(), which waits until
# `global` has finished its handshake with every connected peer. The reconnect after the heal
# can leave a peer's `global` believing the handshake done while the node waits for it (an OTP
# `global` race of RabbitMQ's prevent_overlapping_partitions = false); RabbitMQ's own remedy
# after 20 s, the "global hang workaround", sends nodedown/nodeup messages that OTP 25.1 and
# later ignore ("The global_name_server received an unexpected message";
# rabbitmq-server#6034, fixed by #6046 in 3.10.9 and 3.11.1), so on 3.10.8 the node stays down
# for good. The operator's nudge, done here after GLOBAL_STUCK_AFTER: disconnect the node from
# the peers `global` has not synced with; both sides start the handshake over and the boot
# goes on (docs/high-availability.md).
GLOBAL_STUCK_AFTER = 30.0  # s: past RabbitMQ's own 20 s, so a release with the fix goes first
_GLOBAL_CHECK_EVERY = 5.0  # s: a node stuck is nudged 30 to 35 s after it was first seen
# the peers a node whose rabbit application is not running has not synced `global` with
# (OTP 25's global state record: its 4th element lists the synced nodes)
_UNSYNCED = (
    "case rabbit:is_running() of true -> []; "
    "false -> nodes() -- element(4, sys:get_state(global_name_server, 10000)) end"
)


def unsynced_peers(node: RabbitNode) -> list[str] | None:
    """The peers ``node`` waits on in ``global`` while its rabbit application is not running
    (``[]`` when it runs; None when it gives no answer)."""
    try:
        return list(node.erl(_UNSYNCED, timeout=60))
    except (ErlCallError, subprocess.TimeoutExpired):
        return None


@dataclass
class GlobalNudge:
    """Disconnects a node from the peers it has waited on in ``global`` for ``after`` s."""

    after: float = GLOBAL_STUCK_AFTER
    done: list[str] = field(default_factory=list)  # what it did, one line a nudge
    _since: dict[str, float] = field(default_factory=dict)
    _checked: dict[str, float] = field(default_factory=dict)

    def check(self, node: RabbitNode) -> None:
        now = time.monotonic()
        if now - self._checked.get(node.node, -_GLOBAL_CHECK_EVERY) < _GLOBAL_CHECK_EVERY:
            return
        self._checked[node.node] = now
        peers = unsynced_peers(node)
        if peers is None:  # no answer (a busy machine): the wait so far still counts
            return
        if not peers:
            self._since.pop(node.node, None)
            return
        waited = now - self._since.setdefault(node.node, now)
        if waited < self.after:
            return
        listed = ", ".join(f"'{p}'" for p in peers)
        with contextlib.suppress(ErlCallError, subprocess.TimeoutExpired):  # if still stuck:
            node.erl(f"[erlang:disconnect_node(N) || N <- [{listed}]]")  # again, later
        self._since.pop(node.node, None)
        line = f"{node.node} waited {waited:.0f} s in global for {listed}: disconnected from them"
        self.done.append(line)
        print(f"cluster_whole: {line}")


# A partition recorded while every node runs: Mnesia tells a node's monitor
# `running_partitioned_network` after a reconnect (a nudge's, above, in one make mutants run),
# and under pause_minority nothing clears that record (only a minority pauses), so the cluster
# never reads whole again. Restarting the rabbit application of the node named did not clear
# it here (the record's holder kept it); the holder's own restart does (its node monitor starts
# again with no partition), so that is the remedy, done here after STALE_PARTITION_AFTER:
# stop_app and start_app on the node holding the record.
STALE_PARTITION_AFTER = 15.0  # s: longer than a record that a pause or a heal clears itself


@dataclass
class PartitionReset:
    """Restarts the rabbit application of a node that has recorded a partition while every node
    has run for ``after`` s."""

    after: float = STALE_PARTITION_AFTER
    done: list[str] = field(default_factory=list)  # what it did, one line a restart
    _since: float | None = None

    def check(self, nodes: list[RabbitNode], partitions: dict[str, list[str]]) -> None:
        """Called with the partitions of a view in which every node runs ({} for any other)."""
        if not partitions:
            self._since = None
            return
        now = time.monotonic()
        self._since = self._since or now
        if now - self._since < self.after:
            return
        holder, named = next(iter(sorted(partitions.items())))
        target = next((n for n in nodes if n.node == holder), None)
        if target is None:
            return
        try:
            target.erl("ok = rabbit:stop(), ok = rabbit:start(), ok", timeout=180)
            how = "restarted its rabbit application"
        except (ErlCallError, subprocess.TimeoutExpired) as exc:  # again, later
            how = f"its restart failed ({exc})"[:300]
        line = f"{holder} recorded {named} as partitioned while every node ran for " + (
            f"{now - self._since:.0f} s: {how}"
        )
        self._since = None
        self.done.append(line)
        print(f"cluster_whole: {line}")


def cluster_whole(started: Hosts, timeout: float = 120) -> list[str]:
    """Wait until every node reports every node running and no partition (a paused minority
    resumes once it sees the majority again); a node stuck in ``global`` on its way back is
    nudged (:class:`GlobalNudge`), and a partition still recorded while every node runs is
    cleared (:class:`PartitionReset`). Returns what those did, one line each. While one node's
    view is not whole the others are not asked."""
    nodes = started.rabbit.nodes
    expected = {n.node for n in nodes}
    last: dict[str, View] = {}
    nudge = GlobalNudge()
    reset = PartitionReset()
    deadline = time.monotonic() + timeout

    def whole() -> bool:
        for node in (nodes[1], nodes[2], nodes[0]):  # mq2 first: mq1 is the usual victim
            # a call may take what is left of the wait: a node's answer waits on its peers'
            # (an rpc to each running node for its partitions), and one cut short is lost work
            left = max(30.0, deadline - time.monotonic())
            view, partitions = node_view(node, left)
            last[node.name] = view
            if view[0] != expected or view[1]:
                missing = expected - view[0] if view[0] else {node.node}
                for suspect in nodes:
                    if suspect.node in missing:
                        nudge.check(suspect)
                reset.check(nodes, partitions if view[0] == expected else {})
                return False
        reset.check(nodes, {})
        return True

    try:
        poll(whole, timeout, "every broker node running in the cluster", interval=1)
    except TimeoutError as exc:
        raise TimeoutError(
            f"{exc}; the nodes' last views: {last}; nudges: {nudge.done}; restarts: {reset.done}"
        ) from None
    return nudge.done + reset.done


@pytest.fixture
async def hosted(
    hosts: Hosts,
    recorders: RecorderPool,  # noqa: F811
    tmp_path: Path,
) -> AsyncIterator[Hosted]:
    pg = await asyncio.to_thread(start_pg, tmp_path / "pg", hosts)
    view = Hosted(hosts, pg, recorders)
    try:
        await view.open()
        yield view
    finally:
        await asyncio.to_thread(hosts.net.heal)
        await asyncio.to_thread(hosts.net.unsteer)
        try:
            await view.close()
        finally:
            await asyncio.to_thread(pg.stop)
            await asyncio.to_thread(cluster_whole, hosts)


@pytest.fixture
def shards() -> int:
    """The queue shards of ``hosted_topology``: one, unless a module says otherwise."""
    return 1


@pytest.fixture
async def hosted_topology(hosted: Hosted, shards: int) -> AsyncIterator[Topology]:
    """Unique exchange and queue names on the hosted cluster, with ``shards`` queue shards,
    declared; deleted afterwards (every shard)."""
    suffix = uuid.uuid4().hex[:10]
    topo = Topology(
        exchange=f"brnx.{suffix}",
        queue=f"brnx.{suffix}.records",
        delivery_limit=5,
        shards=shards,
    )
    urls = hosted.test_amqp_urls()
    connection = await aio_pika.connect(urls[0], timeout=30)
    try:
        await declare_topology(await connection.channel(), topo)
    finally:
        await connection.close()
    yield topo
    # before the queue goes: no partition, every node back, no process to declare it again
    await asyncio.to_thread(hosted.net.heal)
    await hosted.pool.close()
    await asyncio.to_thread(cluster_whole, hosted.hosts)
    connection = await aio_pika.connect(urls[0], timeout=30)
    try:
        left = await delete_topology(connection, topo)
    finally:
        await connection.close()
    assert not left, f"test topology left on the cluster: {left}"
