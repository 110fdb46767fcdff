"""Shared fixtures: real PostgreSQL and RabbitMQ, a fresh database and fresh queue names per test.

The machine's services are used when reachable (``DATABASE_URL`` and ``RABBITMQ_URL`` override
the defaults); where they are not and a Docker engine exists, testcontainers starts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import aiormq
import asyncpg
import pytest
from hypothesis import Phase
from hypothesis import settings as hypothesis_settings

from bulk_recorder.infra.metrics import Metrics
from consumer.app import Recorder
from consumer.tools import demo_support
from consumer.topology import Topology, declare_topology, delete_topology
from settings import Settings, load_settings
from tests.compiled import stale_builds
from tests.mutants import MUTANT_RUN_ENV
from tests.role_server import install as install_role_server
from tests.role_server import uninstall as uninstall_role_server

# Each test's CPU beside its wall time in a JUnit report (tests/durations.py reads both); the
# lock that lets tests run side by side (tests/suite_lock.py); pytester runs throwaway sessions.
pytest_plugins = ["tests.cpu_clock", "tests.suite_lock", "pytester"]

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
# How long Broker.ready_count asks again while a quorum leader answers too late to count.
READY_COUNT_WAIT_S = 30.0


def _reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 2
        ):
            return True
    except OSError:
        return False


def _docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


@dataclass(frozen=True)
class Services:
    database_url: str  # DSN of the server's maintenance database; tests create their own
    rabbitmq_url: str


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    db_url = os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)
    mq_url = os.environ.get("RABBITMQ_URL", DEFAULT_RABBITMQ_URL)
    if _reachable(db_url, 5432) and _reachable(mq_url, 5672):
        yield Services(db_url, mq_url)
        return
    if not _docker_available():
        pytest.fail(
            "PostgreSQL and RabbitMQ are not reachable at DATABASE_URL / RABBITMQ_URL "
            f"({db_url}, {mq_url}) and no Docker engine is available for testcontainers"
        )
    from testcontainers.postgres import PostgresContainer
    from testcontainers.rabbitmq import RabbitMqContainer

    with PostgresContainer("postgres:15") as pg, RabbitMqContainer("rabbitmq:3.13") as mq:
        db = pg.get_connection_url().replace("postgresql+psycopg2://", "postgresql://")
        params = mq.get_connection_params()
        creds = params.credentials
        yield Services(
            db,
            f"amqp://{creds.username}:{creds.password}@{params.host}:{params.port}/",
        )


def with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def unique_name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


# The ledger layouts a test's database can have: "plain" (the migrations' tables) or
# "partitioned" (bulk_recorder/sql/partitioning/, applied after the migrations, with daily
# partitions from yesterday to two days ahead). Tests marked `ledger_layouts` run on both;
# TEST_LEDGER_LAYOUT=partitioned runs every test on partitioned tables.
LEDGER_LAYOUTS = ("plain", "partitioned")


# Hypothesis's per-example deadline (200 ms) times the machine, not the code: with the suite on
# several workers an example can wait for a core. Speed is proven by benchmarks, never by a
# timed example; every other setting stays Hypothesis's own.
hypothesis_settings.register_profile("suite", deadline=None)
# A mutant's run (tests/mutants/run.py sets MUTANT_RUN) needs a failure, not its smallest
# example: shrinking one took three minutes of `make mutants`. Everything else as in "suite".
hypothesis_settings.register_profile(
    "mutants",
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target],
)
hypothesis_settings.load_profile("mutants" if os.environ.get(MUTANT_RUN_ENV) else "suite")


def pytest_configure(config: pytest.Config) -> None:
    """The commands and roles the tests start are forked from a server that has imported
    them (tests/role_server.py; TEST_ROLE_SERVER=off starts them as before). Every worker,
    and every suite side by side on the machine, hands out ports through one folder, so that
    two never pick the same one (consumer/tools/demo_support.py); the server inherits it."""
    from tests.suite_lock import lock_dir  # a plugin (pytest_plugins): imported once it is

    demo_support.share_ports_through(lock_dir() / "ports")
    install_role_server()


def pytest_unconfigure(config: pytest.Config) -> None:
    uninstall_role_server()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse to test a compiled module older than its source (tests/compiled.py)."""
    stale = stale_builds()
    if stale:
        pytest.exit(
            f"the compiled build of {', '.join(stale)} is older than its source, and Python "
            "would import the build: run `make install` to compile it again",
            returncode=4,
        )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marked = metafunc.definition.get_closest_marker("ledger_layouts") is not None
    if marked and "ledger_layout" in metafunc.fixturenames:
        metafunc.parametrize("ledger_layout", LEDGER_LAYOUTS, indirect=True)


@pytest.fixture
def ledger_layout(request: pytest.FixtureRequest) -> str:
    layout = getattr(request, "param", os.environ.get("TEST_LEDGER_LAYOUT") or "plain")
    assert layout in LEDGER_LAYOUTS, f"TEST_LEDGER_LAYOUT={layout!r}: one of {LEDGER_LAYOUTS}"
    return str(layout)


async def partition_ledger(dsn: str) -> None:
    """Migrate ``dsn`` (creating it), then partition its ledger tables: daily partitions from
    yesterday to two days ahead, so that every UUIDv7 id made during the test has one."""
    from datetime import UTC, datetime, timedelta

    from bulk_recorder.infra import partitions
    from bulk_recorder.infra.migrate import migrate

    await migrate(dsn)
    conn = await asyncpg.connect(dsn)
    try:
        await partitions.apply_layout(conn, "day")
        now = datetime.now(UTC)
        await partitions.create_partitions(
            conn, now - timedelta(days=1), now + timedelta(days=2), "day"
        )
    finally:
        await conn.close()


@pytest.fixture
async def database_url(services: Services, ledger_layout: str) -> AsyncIterator[str]:
    """A DSN for a database that does not exist yet (migrate creates it); dropped afterwards.
    With the partitioned layout it exists already: migrated, its ledger tables partitioned."""
    name = unique_name("brtest")
    dsn = with_database(services.database_url, name)
    if ledger_layout == "partitioned":
        await partition_ledger(dsn)
    yield dsn
    conn = await asyncpg.connect(with_database(services.database_url, "postgres"))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture
async def topology(services: Services) -> AsyncIterator[Topology]:
    """Unique exchange and queue names; every exchange and queue is deleted afterwards."""
    suffix = uuid.uuid4().hex[:10]
    topo = Topology(exchange=f"brtest.{suffix}", queue=f"brtest.{suffix}.records", delivery_limit=5)
    yield topo
    connection = await aio_pika.connect(services.rabbitmq_url)
    try:
        left = await delete_topology(connection, topo)
    finally:
        await connection.close()
    assert not left, f"test topology left on the broker: {left}"


SettingsFactory = Callable[..., Settings]


@pytest.fixture
def make_settings(services: Services, database_url: str, topology: Topology) -> SettingsFactory:
    """Settings for this test's database and queues; keyword overrides use field names."""

    def factory(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "database_url": database_url,
            "rabbitmq_url": services.rabbitmq_url,
            "rabbitmq_exchange": topology.exchange,
            "rabbitmq_queue": topology.queue,
            "rabbitmq_delivery_limit": topology.delivery_limit,
            "metrics_port": 0,
        }
        values.update(overrides)
        return load_settings(**values)

    return factory


@dataclass
class RunningRecorder:
    recorder: Recorder
    metrics: Metrics
    stop: asyncio.Event
    task: asyncio.Task[None]

    def value(self, name: str, **labels: str) -> float:
        """Current value of a metric sample, e.g. value('bulk_recorder_messages_acked_total')."""
        sample = self.metrics.registry.get_sample_value(name, labels or None)
        return sample or 0.0

    async def shutdown(self, timeout: float = 60) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout)


@pytest.fixture
async def start_recorder() -> AsyncIterator[Callable[[Settings], Awaitable[RunningRecorder]]]:
    """Start an in-process Recorder; it is stopped (SIGTERM-like) at the end of the test."""
    running: list[RunningRecorder] = []

    async def start(settings: Settings) -> RunningRecorder:
        metrics = Metrics()
        recorder = Recorder(settings, metrics)
        stop = asyncio.Event()
        task = asyncio.create_task(recorder.run(stop))
        handle = RunningRecorder(recorder, metrics, stop, task)
        running.append(handle)
        await wait_for(lambda: recorder.ready()[0] or task.done(), timeout=30)
        if task.done():
            task.result()
        return handle

    yield start
    for handle in running:
        if not handle.task.done():
            await handle.shutdown()


async def wait_for(
    predicate: Callable[[], bool | Awaitable[bool]],
    timeout: float = 30,
    interval: float = 0.05,
) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)


class Broker:
    """Test-side broker helper: publish raw messages, count and read queues."""

    def __init__(self, url: str, topology: Topology) -> None:
        self.url = url
        self.topology = topology
        self._connection: aio_pika.abc.AbstractConnection | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None

    async def open(self) -> None:
        self._connection = await aio_pika.connect(self.url)
        self._channel = await self._connection.channel(publisher_confirms=True)
        await declare_topology(self._channel, self.topology)

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()

    @property
    def channel(self) -> aio_pika.abc.AbstractChannel:
        assert self._channel is not None
        return self._channel

    async def publish(
        self,
        body: bytes,
        record_type: str | None,
        routing_key: str | None = None,
        headers: dict[str, Any] | None = None,
    ) -> None:
        exchange = await self.channel.get_exchange(self.topology.exchange)
        await exchange.publish(
            aio_pika.Message(
                body,
                content_type="application/json",
                type=record_type,
                headers=headers,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key=routing_key or record_type or "untyped",
        )

    async def publish_many(self, messages: list[tuple[bytes, str | None]]) -> None:
        exchange = await self.channel.get_exchange(self.topology.exchange)
        for start in range(0, len(messages), 500):
            await asyncio.gather(
                *(
                    exchange.publish(
                        aio_pika.Message(
                            body,
                            content_type="application/json",
                            type=record_type,
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        ),
                        routing_key=record_type or "untyped",
                    )
                    for body, record_type in messages[start : start + 500]
                )
            )

    async def ready_count(self, queue: str) -> int:
        """Messages ready in ``queue`` (not counting those delivered and unacked). A quorum
        leader's late 0 and 0 (consumer/queue_count.py) is asked again, never read as empty:
        a test asserting an empty DLQ must not pass on a leader that did not count."""
        from consumer.queue_count import count_within

        channel = self.channel

        async def declare() -> aiormq.spec.Queue.DeclareOk:
            return (await channel.declare_queue(queue, passive=True)).declaration_result

        count = await count_within(declare, READY_COUNT_WAIT_S)
        assert count.counted, f"no count of {queue} from its leader in {READY_COUNT_WAIT_S} s"
        return count.ready

    async def drain(
        self, queue: str, limit: int = 100_000
    ) -> list[aio_pika.abc.AbstractIncomingMessage]:
        """Get (and ack) every ready message of ``queue``."""
        q = await self.channel.declare_queue(queue, passive=True)
        out: list[aio_pika.abc.AbstractIncomingMessage] = []
        while len(out) < limit:
            message = await q.get(fail=False, no_ack=True)
            if message is None:
                break
            out.append(message)
        return out


@pytest.fixture
async def broker(services: Services, topology: Topology) -> AsyncIterator[Broker]:
    b = Broker(services.rabbitmq_url, topology)
    await b.open()
    yield b
    await b.close()


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Callable[[], Awaitable[asyncpg.Connection]]]:
    """Open a connection to the test database (after the recorder has migrated it)."""
    opened: list[asyncpg.Connection] = []

    async def connect() -> asyncpg.Connection:
        conn = await asyncpg.connect(database_url)
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        await conn.close()


def settings_env(settings: Settings, **extra: str) -> dict[str, str]:
    """Environment for a ``bulk-recorder`` subprocess running with these settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "BULK_RECORDER_"))}
    for name, value in settings.model_dump().items():
        if value is None:  # unset: the command's own default (e.g. METRICS_PORT per role)
            env.pop(name.upper(), None)
            continue
        env[name.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
    env.update(extra)
    return env


def free_port() -> int:
    """A port free now, below the kernel's range for port 0 (consumer/tools/demo_support.py):
    one the kernel gave and we closed could go to another test's role that binds port 0
    before ours binds it."""
    return demo_support.free_port()


REPO = Path(__file__).resolve().parents[1]


def run_cli(
    args: list[str], env: dict[str, str], timeout: float = 60, answer: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``bulk-recorder ARGS`` (as ``python -m consumer.cli``) in a child process, to the end;
    ``answer`` is its standard input (a reply to a question)."""
    return subprocess.run(
        [sys.executable, "-m", "consumer.cli", *args],
        cwd=REPO,
        env=env,
        input=answer,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_cli_on_terminal(
    args: list[str], env: dict[str, str], typed: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``run_cli`` with a terminal (a pseudo-terminal) as standard input, ``typed`` on it ahead:
    the CLI asks its questions only on a terminal."""
    import pty

    main, child = pty.openpty()
    try:
        with subprocess.Popen(
            [sys.executable, "-m", "consumer.cli", *args],
            cwd=REPO,
            env=env,
            stdin=child,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as process:
            os.close(child)
            child = -1
            os.write(main, typed.encode())
            out, err = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)
    finally:
        os.close(main)
        if child >= 0:
            os.close(child)


@pytest.fixture
async def lock_log_server(tmp_path: Path) -> AsyncIterator[Any]:
    """A private PostgreSQL that logs every lock wait over 1 ms (tests/rigs/lock_log_server.py);
    its log is kept in the test's ``tmp_path``."""
    from tests.rigs.lock_log_server import LockLogServer

    server = await asyncio.to_thread(LockLogServer(tmp_path).start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


def _raft_server(queue: str) -> str:
    """The Erlang expression of ``queue``'s Raft server (its registered name) on its node."""
    lookup = f'rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"{queue}">>))'
    return f"element(1, amqqueue:get_pid(element(2, {lookup})))"


def rabbitmq_eval(expression: str) -> str:
    """``rabbitmqctl eval EXPRESSION`` on the local broker's node; what it printed."""
    done = subprocess.run(
        ["rabbitmqctl", "eval", expression], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


@contextlib.asynccontextmanager
async def leader_suspended(queue: str) -> AsyncIterator[None]:
    """The Raft server of quorum queue ``queue`` on the local broker suspended (``sys:suspend``
    through ``rabbitmqctl eval``: that queue's process only, the node runs on), resumed at the
    end: a leader that answers nothing, as a busy node's is late. RabbitMQ 3.10 then answers a
    passive declare with 0 and 0 after 250 ms (consumer/queue_count.py)."""
    assert await asyncio.to_thread(rabbitmq_eval, f"sys:suspend({_raft_server(queue)}).") == "ok"
    try:
        yield
    finally:
        await asyncio.to_thread(rabbitmq_eval, f"catch sys:resume({_raft_server(queue)}).")


# How long the node's timer below waits for its start at most (then resumes regardless).
_START_WAIT_S = 120


@contextlib.asynccontextmanager
async def leader_suspended_for(
    url: str, queue: str, seconds: float
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """:func:`leader_suspended`, with a fault of a known length: it yields ``start``, and the
    node itself resumes the Raft server ``seconds`` after ``start`` returns. A resume through
    ``rabbitmqctl`` comes as late as the CLI starts, about 0.7 s on a quiet machine and past 3 s
    on a loaded one: a fault sized against a bound of the recorder (its 5 s wait for the last
    acks) then outlasts it. ``start`` declares a marker queue (a classic one: the suspended
    leader plays no part); a process spawned on the node with the suspend polls for it every
    5 ms, then sleeps ``seconds`` and resumes. The CLI's resume still runs at the end (a start
    that never came; it is a no-op on a running server)."""
    marker = f"{queue}.resume"
    server = _raft_server(queue)
    polls = _START_WAIT_S * 200
    expression = (
        f"P = {server}, ok = sys:suspend(P), "
        f'M = rabbit_misc:r(<<"/">>, queue, <<"{marker}">>), '
        "Started = fun Poll(0) -> ok; Poll(N) -> case rabbit_amqqueue:lookup(M) of "
        "{ok, _} -> ok; _ -> timer:sleep(5), Poll(N - 1) end end, "
        f"spawn(fun() -> Started({polls}), timer:sleep({round(seconds * 1000)}), "
        "catch sys:resume(P) end), ok."
    )
    async with aiormq.connect(url) as connection:
        channel = await connection.channel()
        assert await asyncio.to_thread(rabbitmq_eval, expression) == "ok"

        async def start() -> None:
            await channel.queue_declare(marker, exclusive=True)

        try:
            yield start
        finally:
            await asyncio.to_thread(rabbitmq_eval, f"catch sys:resume({server}).")
