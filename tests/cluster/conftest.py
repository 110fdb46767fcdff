"""Cluster fixtures: a three-node RabbitMQ cluster and PostgreSQL primary + standby pairs.

``rabbit_cluster`` is one cluster for the whole session, with the random exchange plugin enabled
on every node at boot (``RABBITMQ_QUEUE_SHARDS`` > 1 routes through it; ``shard_cluster`` names
that need) (it takes some 20 s to start on this
machine), shared by every module that asks for it, and stopped once no test left in the
session needs it (so it does not idle beside the rest of the suite); before each test every
node that an earlier test killed is restarted, so tests do not depend on their order.
``pg_clusters`` starts a fresh primary and standby per call (about a second), since a failover
test leaves its primary dead. Everything is stopped at the end, also when a
test fails, and the nodes' and servers' logs are printed then.

The rigs block; call their slow methods through ``asyncio.to_thread`` from async tests.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from consumer.topology import Topology
from tests.faults.conftest import recorders  # noqa: F401  (real service processes)
from tests.rigs import postgres_cluster, rabbitmq_node
from tests.rigs.postgres_cluster import PgCluster
from tests.rigs.rabbitmq_cluster import RabbitCluster
from tests.rigs.topology import delete_through


@pytest.fixture(scope="session")
def rabbit_cluster_module(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[RabbitCluster]:
    if not rabbitmq_node.available():
        pytest.fail(
            "the RabbitMQ cluster rig needs the installed rabbitmq-server "
            f"({rabbitmq_node.SERVER}); deselect these tests with -m 'not cluster'"
        )
    failed_before = request.session.testsfailed
    cluster = RabbitCluster(tmp_path_factory.mktemp("rabbit-cluster"), plugins=SHARD_PLUGINS)
    cluster.start()
    _STARTED.append(cluster)
    print(
        f"\nrabbit cluster: boot {cluster.timings['boot']:.1f} s, join "
        f"{cluster.timings['join']:.1f} s, start {cluster.timings['start']:.1f} s"
    )
    try:
        yield cluster
    finally:
        cluster.stop()
        print(f"\nrabbit cluster: stop {cluster.timings['stop']:.1f} s")
        if request.session.testsfailed > failed_before:
            print(cluster.log_tails(40))


_STARTED: list[RabbitCluster] = []
# enabled at boot on every node of the session's cluster: queue shards route through an x-random
# exchange (RABBITMQ_QUEUE_SHARDS > 1)
SHARD_PLUGINS = ("rabbitmq_random_exchange",)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield  # the test's own fixtures are torn down first (they may still use the cluster)
    items = item.session.items
    rest = items[items.index(nextitem) :] if nextitem is not None else []
    if not any("rabbit_cluster" in getattr(i, "fixturenames", ()) for i in rest):
        for cluster in _STARTED:
            if any(node.running for node in cluster.nodes):
                cluster.stop()


@pytest.fixture
def rabbit_cluster(rabbit_cluster_module: RabbitCluster) -> RabbitCluster:
    """The session's cluster with every node running and clustered again."""
    for node in rabbit_cluster_module.nodes:
        if not node.running:
            rabbit_cluster_module.restart(node)
    return rabbit_cluster_module


@pytest.fixture
def shard_cluster(rabbit_cluster: RabbitCluster) -> RabbitCluster:
    """The session's three-node cluster, every node running, with ``rabbitmq_random_exchange``
    enabled on each (what RABBITMQ_QUEUE_SHARDS > 1 needs)."""
    return rabbit_cluster


@pytest.fixture
async def cluster_topology(rabbit_cluster: RabbitCluster) -> AsyncIterator[Topology]:
    """Unique exchange and queue names on the cluster; deleted afterwards."""
    suffix = uuid.uuid4().hex[:10]
    topo = Topology(exchange=f"brha.{suffix}", queue=f"brha.{suffix}.records", delivery_limit=5)
    yield topo
    left = await delete_through(rabbit_cluster.running_nodes()[0].url, topo)
    assert not left, f"test topology left on the cluster: {left}"


PgClusterFactory = Callable[..., PgCluster]


@pytest.fixture
def pg_clusters(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[PgClusterFactory]:
    """``pg_clusters(synchronous=True)`` starts a primary and a streaming standby."""
    if not postgres_cluster.available():
        pytest.fail(
            "the PostgreSQL cluster rig needs the PostgreSQL 15 binaries "
            f"({postgres_cluster.PG_BIN}) and, under root, a 'postgres' OS user; "
            "deselect these tests with -m 'not cluster'"
        )
    started: list[PgCluster] = []

    def start(synchronous: bool = True) -> PgCluster:
        cluster = PgCluster(tmp_path / f"pg{len(started)}", synchronous=synchronous)
        started.append(cluster)
        return cluster.start()

    try:
        yield start
    finally:
        report = getattr(request.node, "rep_call", None)
        try:
            if report is not None and report.failed:
                for cluster in started:
                    print(cluster.log_tails(40))
        finally:
            for cluster in started:
                cluster.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]


# The reports of the all-faults runs (test_all_faults.py), shown again in pytest's summary, so
# that `make test` and `make soak-cluster` print them even when the tests pass.
SOAK_REPORTS: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if SOAK_REPORTS:
        terminalreporter.section("all-faults runs")
        for report in SOAK_REPORTS:
            terminalreporter.write_line(report)
