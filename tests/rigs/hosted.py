"""The whole system on hosts of its own: each role in a network namespace (tests/rigs/netns.py).

Hosts (names are the namespaces' suffixes and the nemesis's targets)::

    mq1 mq2 mq3   the RabbitMQ cluster (RabbitCluster, nodes name@10.47.0.11-13, port 5672)
    pg1 pg2       PostgreSQL primary and its synchronous standby (PgCluster, port 5432)
    rec1 rec2     two recorders          (metrics and /readyz on port 9100)
    relay         the relay              (port 9100)
    api           the API                (port 8080)
    obs           the observer: the test's own connections leave from here (never cut)

Two layers, because the broker cluster takes some 30 s to boot and the rest a few seconds:

- :class:`Hosts` (blocking): the namespaces and the RabbitMQ cluster, kept for a whole
  session by ``tests/partitions/conftest.py``'s ``hosts`` fixture. ``Hosts.start(folder,
  rabbit_config, plugins=())`` (``plugins``: enabled at boot on every broker node),
  ``.stop()`` (returns :meth:`Net.leftovers`: ``[]`` when nothing is left).
- :class:`Hosted` (asyncio, one per test, the ``hosted`` fixture): a fresh PostgreSQL pair on
  pg1/pg2, forwarders for the test's own clients, and the service processes:

  - ``hosted.net`` (partitions: ``cut``, ``drop``, ``isolate``, ``heal``, ``steer``),
    ``hosted.rabbit``, ``hosted.pg``;
  - ``hosted.database_url(db)`` and ``hosted.rabbitmq_url(heartbeat=2)``: what the processes
    are given (host addresses: both servers, every node);
  - ``hosted.test_dsn(db)``, ``hosted.test_amqp_urls()``: the same through the forwarders,
    for the test's asyncpg and aio-pika (both servers / every node, on 127.0.0.1);
  - ``await hosted.start(name, settings, args=CONSUME)``: the command in host ``name``'s
    namespace (a :class:`~tests.faults.conftest.RecorderProcess`, so ``kill``, ``start``,
    ``terminate``, ``log_text``); ``settings`` should come from :func:`service_settings`;
  - ``await hosted.not_ready()``: the processes whose ``/readyz`` is not 200 now;
  - ``hosted.node_of(name)``: the broker host a process last logged ``connected to``.

Teardown (the fixture's): heal and unsteer, stop the processes (SIGTERM), close the
forwarders, stop PostgreSQL; at the session's end the cluster, then every namespace, and a
check that nothing is left.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

from consumer.topology import Topology
from settings import Settings
from tests.cluster.failover_support import cluster_settings
from tests.faults.conftest import CONSUME, RecorderPool, RecorderProcess
from tests.rigs.netns import Forward, Net
from tests.rigs.postgres_cluster import PgCluster
from tests.rigs.rabbitmq_cluster import RabbitCluster

BROKERS = ("mq1", "mq2", "mq3")
DATABASES = ("pg1", "pg2")
SERVICES = ("rec1", "rec2", "relay", "api")
HOSTS = (*BROKERS, *DATABASES, *SERVICES)
AMQP_PORT = 5672
PG_PORT = 5432
METRICS_PORT = 9100
API_PORT = 8080


def service_settings(
    database_url: str, rabbitmq_url: str, topology: Topology, role: str, **more: object
) -> Settings:
    """Settings for a process on a host: listening on the host's address (all of them), on
    :data:`METRICS_PORT` (the API on :data:`API_PORT`)."""
    ports: dict[str, object] = (
        {"api_host": "0.0.0.0", "api_port": API_PORT, "metrics_port": 0}
        if role == "api"
        else {"metrics_port": METRICS_PORT}
    )
    return cluster_settings(
        database_url, rabbitmq_url, topology, metrics_host="0.0.0.0", **{**ports, **more}
    )


@dataclass
class Hosts:
    """The namespaces and the broker cluster (blocking; a session's)."""

    net: Net
    rabbit: RabbitCluster

    @classmethod
    def start(cls, folder: Path, rabbit_config: str = "", plugins: tuple[str, ...] = ()) -> Hosts:
        """The namespaces, then the cluster: ``rabbit_config`` (rabbitmq.conf text) and
        ``plugins`` (enabled at boot) on every node."""
        net = Net(HOSTS).start()
        try:
            rabbit = RabbitCluster(
                folder / "rabbit",
                hosts=[net.host(n) for n in BROKERS],
                config=rabbit_config,
                plugins=plugins,
            )
            rabbit.start()
        except BaseException:
            net.close()
            raise
        return cls(net, rabbit)

    def stop(self) -> list[str]:
        """Stop the cluster, remove every namespace; what is left (``[]``: nothing)."""
        try:
            self.rabbit.stop()
        finally:
            self.net.close()
        return self.net.leftovers()

    def broker_host(self, node_name: str) -> str:
        """``mq1``... for a node name ``x@10.47.0.11`` (or its address)."""
        address = node_name.rsplit("@", 1)[-1]
        for name in BROKERS:
            if self.net.host(name).address == address:
                return name
        raise KeyError(node_name)


_CONNECTED = re.compile(r"connected to RabbitMQ node ([0-9.]+):\d+/")


@dataclass
class Hosted:
    """One test's view: PostgreSQL, forwarders and the processes (asyncio)."""

    hosts: Hosts
    pg: PgCluster
    pool: RecorderPool
    processes: dict[str, RecorderProcess] = field(default_factory=dict)
    forwards: dict[tuple[str, int], Forward] = field(default_factory=dict)

    @property
    def net(self) -> Net:
        return self.hosts.net

    @property
    def rabbit(self) -> RabbitCluster:
        return self.hosts.rabbit

    async def open(self) -> Hosted:
        for name in BROKERS:
            await self.forward(name, AMQP_PORT)
        for name in DATABASES:
            await self.forward(name, PG_PORT)
        return self

    async def forward(self, host: str, port: int) -> Forward:
        """The test's way to ``host:port`` (kept for the test; closed with the rest)."""
        if (host, port) not in self.forwards:
            self.forwards[(host, port)] = await self.net.forward(host, port)
        return self.forwards[(host, port)]

    async def close(self) -> None:
        await self.pool.close()
        await self.net.close_forwards()
        self.forwards.clear()

    # -- addresses --------------------------------------------------------------------------
    def database_url(self, database: str) -> str:
        """The processes' DATABASE_URL: both servers, the writable one chosen."""
        return self.pg.multi_host_dsn(database, connect_timeout="2")

    def rabbitmq_url(self, heartbeat: int | None = 2) -> str:
        """The processes' RABBITMQ_URL: every node (``?heartbeat=``: aiormq's interval)."""
        query = f"heartbeat={heartbeat}" if heartbeat is not None else ""
        return ",".join(_with_query(node.url, query) for node in self.rabbit.nodes)

    def test_dsn(self, database: str) -> str:
        """Both servers through the forwarders, the writable one chosen (the test's own)."""
        hosts = ",".join(f"127.0.0.1:{self.forwards[(h, PG_PORT)].port}" for h in DATABASES)
        return (
            f"postgresql://postgres@{hosts}/{database}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )

    def test_amqp_urls(self) -> list[str]:
        """Every node through its forwarder (the test's own)."""
        return [
            f"amqp://guest:guest@127.0.0.1:{self.forwards[(h, AMQP_PORT)].port}/" for h in BROKERS
        ]

    # -- processes --------------------------------------------------------------------------
    async def start(
        self, name: str, settings: Settings, args: tuple[str, ...] = CONSUME
    ) -> RecorderProcess:
        """Run ``python ARGS`` with ``settings`` in host ``name``'s namespace."""
        launcher = tuple(self.net.host(name).argv([]))
        proc = await self.pool.start(settings, args=args, name=name, launcher=launcher)
        self.processes[name] = proc
        return proc

    async def not_ready(self) -> list[str]:
        """Processes whose /readyz does not answer 200 now, with what they said."""
        out = []
        async with httpx.AsyncClient(timeout=3) as http:
            for name in self.processes:
                port = API_PORT if name == "api" else METRICS_PORT
                forward = await self.forward(name, port)
                try:
                    answer = await http.get(f"http://127.0.0.1:{forward.port}/readyz")
                except httpx.HTTPError as exc:
                    out.append(f"{name}: no answer ({exc!r})")
                    continue
                if answer.status_code != 200:
                    out.append(f"{name}: {answer.status_code} {answer.text.strip()[:160]}")
        return out

    async def all_ready(self) -> bool:
        return not await self.not_ready()

    async def base_url(self, name: str) -> str:
        """http://127.0.0.1:<forward> to a process's HTTP port (the API's, or its metrics')."""
        port = API_PORT if name == "api" else METRICS_PORT
        return f"http://127.0.0.1:{(await self.forward(name, port)).port}"

    def node_of(self, name: str) -> str | None:
        """The broker host (``mq1``...) process ``name`` last logged being connected to."""
        found = _CONNECTED.findall(self.processes[name].log_text())
        return self.hosts.broker_host(found[-1]) if found else None


def _with_query(url: str, query: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", query, ""))


def start_pg(folder: Path, hosts: Hosts, synchronous: bool = True) -> PgCluster:
    """A fresh primary (pg1) and standby (pg2) (blocking, a second or two)."""
    pg = PgCluster(
        folder, synchronous=synchronous, hosts=(hosts.net.host("pg1"), hosts.net.host("pg2"))
    )
    return pg.start()


__all__ = [
    "API_PORT",
    "BROKERS",
    "DATABASES",
    "HOSTS",
    "METRICS_PORT",
    "SERVICES",
    "Hosted",
    "Hosts",
    "service_settings",
    "start_pg",
]
