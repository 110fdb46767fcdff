"""One partition run on the hosted rig: services, traffic, a watch on commits and logs, the audit.

:class:`Run` (``await Run.begin(hosted, topology)``) migrates a fresh database on the primary,
makes an API key, and starts two recorders (hosts rec1, rec2), the relay and the API in their
namespaces, all given every broker node (``?heartbeat=2``) and both database servers. Then:

- ``await run.start_services(on="mq1")``: the processes start and are ready; with ``on``,
  their broker connects to the other nodes are refused while they start (:meth:`Net.steer`),
  so all of them sit on that node; the steering is lifted once they are connected;
- ``run.start_traffic(via=[...])``: two API clients posting transactions (each retried with
  its own ``Idempotency-Key`` until 202) and a publisher of the load generator's mixed
  messages (valid, duplicate, invalid) through the forwarders of the broker hosts ``via``;
- ``run.watch`` (:class:`~tests.cluster.failover_support.CommitWatch`) samples committed rows
  every 50 ms through the observer; ``run.logs`` (:class:`LogWatch`) notes when each process
  logged each line (0.1 s resolution), so a scenario reads how the clients noticed and when
  they moved;
- ``await run.finish()``: traffic stopped, everything settled, every process ready and then
  stopped with exit 0, and the audit of ``tests/faults/audit.py`` (lost 0, doubled 0,
  balances exact, DLQ exactly the invalid messages plus at-least-once repeats); returns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import asyncpg

from bulk_recorder.infra import pg_hosts
from consumer.tools.generator import Generator
from consumer.tools.loadgen import LoadReport
from consumer.topology import Topology
from tests.cluster.failover_support import CommitWatch
from tests.cluster.traffic import Client, QueueTraffic
from tests.conftest import Broker, unique_name, wait_for
from tests.faults.audit import Audit, audit_run, wait_until_settled
from tests.faults.conftest import API, RELAY, RecorderProcess
from tests.faults.scrape import scrape
from tests.integration.producer_support import bearer, provision_key
from tests.rigs.hosted import (
    AMQP_PORT,
    BROKERS,
    METRICS_PORT,
    SERVICES,
    Hosted,
    service_settings,
)

# The metrics a partition moves (docs/high-availability.md says what an operator sees).
OPERATOR_SIGNALS = (
    "bulk_recorder_broker_reconnects_total",
    "bulk_recorder_outbox_publish_failures_total",
    "bulk_recorder_messages_released_total",
    "bulk_recorder_db_retries_total",
    "bulk_recorder_paused",
)
HEARTBEAT = 2  # ?heartbeat= on the processes' broker URLs: aiormq gives up after ~9 s
DB_COMMAND_TIMEOUT = 3.0
CONNECTED = re.compile(r"connected to RabbitMQ node ([0-9.]+):\d+/")


@dataclass
class LogWatch:
    """Each process's new log lines with the moment they were seen (polled every 0.1 s)."""

    procs: dict[str, RecorderProcess]
    lines: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    _seen: dict[str, int] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    def start(self) -> LogWatch:
        for name, proc in self.procs.items():
            self._seen[name] = len(proc.log_text())
            self.lines[name] = []
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            self.poll()
            await asyncio.sleep(0.1)

    def poll(self) -> None:
        now = time.monotonic()
        for name, proc in self.procs.items():
            text = proc.log_text()
            new, self._seen[name] = text[self._seen[name] :], len(text)
            self.lines[name] += [(now, line) for line in new.splitlines() if line.strip()]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.poll()

    def after(self, name: str, moment: float) -> list[tuple[float, str]]:
        return [(t, line) for t, line in self.lines[name] if t >= moment]

    def first(self, name: str, pattern: str, after: float) -> float | None:
        """Seconds from ``after`` to the first line of ``name`` matching ``pattern``."""
        for t, line in self.after(name, after):
            if re.search(pattern, line):
                return t - after
        return None

    def connected_after(self, name: str, moment: float) -> tuple[float, str] | None:
        """(when, node address) of the first connect ``name`` logged after ``moment``."""
        for t, line in self.after(name, moment):
            found = CONNECTED.search(line)
            if found:
                return t, found.group(1)
        return None

    def noticed(self, name: str, moment: float, until: float) -> list[str]:
        """The warnings ``name`` logged between ``moment`` and ``until``, de-duplicated,
        with the seconds after ``moment`` of the first of each."""
        seen: dict[str, float] = {}
        for t, line in self.after(name, moment):
            if t > until:
                break
            if " WARNING " in line or " ERROR " in line:
                text = line.split(": ", 1)[-1][:140]
                seen.setdefault(text, t - moment)
        return [f"+{at:.1f} s {text}" for text, at in seen.items()]


async def settle_and_audit(
    hosted: Hosted,
    database: str,
    topo: Topology,
    procs: Mapping[str, RecorderProcess],
    sent: LoadReport,
    faults: int,
    *,
    expected_dlq: Counter[str],
    settle_timeout: float,
    missing_ok: bool = False,
    outbox_drains: bool = False,
    unconfirmed: Mapping[str, set[str]] | None = None,
) -> tuple[Audit, list[str], bool]:
    """The end of a run once its traffic stopped: wait until every record is in (with
    ``missing_ok``, give up after ``settle_timeout``: the audit counts what is missing), and
    the outbox empty (``outbox_drains``), then for every process to be ready; stop each
    cleanly, and audit. Returns the audit, the processes not ready at the end and whether
    settling was given up (the caller asserts, after it printed its report)."""
    opened: list[asyncpg.Connection] = []
    dsn = hosted.test_dsn(database)

    async def connect() -> asyncpg.Connection:
        opened.append(await pg_hosts.connect(dsn))
        return opened[-1]

    gave_up = False
    broker = Broker(hosted.test_amqp_urls()[1], topo)
    await broker.open()
    try:
        conn = await connect()
        try:
            await wait_until_settled(connect, broker, sent, timeout=settle_timeout)
        except AssertionError:
            if not missing_ok:
                raise
            gave_up = True
        if outbox_drains:

            async def outbox_sent() -> bool:
                return int(await conn.fetchval("SELECT count(*) FROM outbox")) == 0

            await wait_for(outbox_sent, timeout=120, interval=0.25)
        with contextlib.suppress(AssertionError):
            await wait_for(hosted.all_ready, timeout=60, interval=0.5)
        unready = await hosted.not_ready()
        for name, proc in procs.items():
            assert proc.running, f"{name} died"
            assert await proc.terminate() == 0, f"{name} did not stop cleanly"
        audit = await audit_run(
            conn, broker, sent, faults=faults, expected_dlq=expected_dlq, unconfirmed=unconfirmed
        )
    finally:
        await broker.close()
        for each in opened:
            each.terminate()
    return audit, unready, gave_up


@dataclass
class Run:
    hosted: Hosted
    topo: Topology
    database: str
    key: str
    procs: dict[str, RecorderProcess] = field(default_factory=dict)
    watch: CommitWatch | None = None
    logs: LogWatch | None = None
    clients: list[Client] = field(default_factory=list)
    queue: QueueTraffic | None = None
    seed: int = 31
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _traffic: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    async def begin(cls, hosted: Hosted, topo: Topology, seed: int = 31) -> Run:
        database = unique_name("brnx")
        # migrates and creates the database on the primary, through the observer
        key = await provision_key(hosted.test_dsn(database))
        return cls(hosted, topo, database, key, seed=seed)

    def settings(self, role: str, **more: object):
        return service_settings(
            self.hosted.database_url(self.database),
            self.hosted.rabbitmq_url(HEARTBEAT),
            self.topo,
            role,
            bulk_recorder_db_command_timeout_s=DB_COMMAND_TIMEOUT,
            rabbitmq_queue_shards=self.topo.shards,
            **more,
        )

    async def start_services(self, on: str | None = None) -> None:
        net = self.hosted.net
        clients = [n for n in SERVICES if n != "api"]
        if on is not None:
            others = [b for b in BROKERS if b != on]
            await asyncio.to_thread(net.steer, clients, others, AMQP_PORT)
        start = self.hosted.start
        self.procs["rec1"] = await start("rec1", self.settings("recorder"))
        self.procs["rec2"] = await start(
            "rec2", self.settings("recorder", bulk_recorder_size=200, rabbitmq_numbers_of_workers=3)
        )
        self.procs["relay"] = await start(
            "relay", self.settings("relay"), args=(*RELAY, "--poll-interval", "0.2")
        )
        self.procs["api"] = await start("api", self.settings("api"), args=API)
        await wait_for(self.hosted.all_ready, timeout=120, interval=0.3)
        if on is not None:
            placed = {n: self.hosted.node_of(n) for n in clients}
            assert set(placed.values()) == {on}, placed
            await asyncio.to_thread(net.unsteer)
        self.watch = await CommitWatch(self.hosted.test_dsn(self.database)).start()
        self.logs = LogWatch(self.procs).start()

    def start_traffic(self, via: list[str] | None = None) -> None:
        """API clients, and a publisher through the broker hosts ``via`` (default: all)."""
        rng = random.Random(self.seed)
        api = self.hosted.forwards[("api", 8080)].port
        self.clients = [
            Client(
                base_url=f"http://127.0.0.1:{api}",
                gen=Generator.create(rng.randrange(2**32)),
                auth=bearer(self.key),
                replay_every=7,
            )
            for _ in range(2)
        ]
        urls = self.hosted.test_amqp_urls()
        chosen = [urls[BROKERS.index(b)] for b in (via or BROKERS)]
        self.queue = QueueTraffic(",".join(chosen), self.topo.exchange, self.seed)
        runs = [c.run(self._stop) for c in self.clients] + [self.queue.run(self._stop)]
        self._traffic = [asyncio.create_task(r) for r in runs]

    async def stop_traffic(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._traffic)

    async def finish(self, faults: int) -> tuple[Audit, list[str]]:
        """Stop the traffic, settle, check readiness, stop the processes, audit.

        Returns the audit and the processes not ready at the end (both asserted by the caller,
        after it printed its report)."""
        await self.stop_traffic()
        assert self.queue is not None
        sent, shapes = self.queue.merged()
        for client in self.clients:
            sent.ids["transaction"] |= client.accepted.keys()
            sent.published += len(client.accepted)
            sent.valid += len(client.accepted)
        try:
            audit, unready, _ = await settle_and_audit(
                self.hosted,
                self.database,
                self.topo,
                self.procs,
                sent,
                faults,
                expected_dlq=shapes,
                settle_timeout=240,
                outbox_drains=True,
                unconfirmed=self.queue.unconfirmed,
            )
        finally:
            for watch in (self.watch, self.logs):
                if watch is not None:
                    await watch.stop()
        return audit, unready

    async def abort(self) -> None:
        """After a failure: stop the traffic and the watches (the fixtures stop the rest)."""
        self._stop.set()
        for task in self._traffic:
            task.cancel()
        await asyncio.gather(*self._traffic, return_exceptions=True)
        for watch in (self.watch, self.logs):
            if watch is not None:
                await watch.stop()

    async def wait_rows(self, rows: int, timeout: float = 120) -> None:
        """Until the watch has seen ``rows`` committed records (progress, not speed)."""
        assert self.watch is not None
        watch = self.watch
        await wait_for(lambda: watch.latest() >= rows, timeout=timeout, interval=0.1)

    async def counters(self, prefixes: tuple[str, ...] = OPERATOR_SIGNALS) -> list[str]:
        """What an operator's Prometheus would read now: each process's samples whose name
        starts with one of ``prefixes`` and whose value is not 0, as ``process: name value``."""
        out = []
        for name in self.procs:
            if name == "api":
                continue
            samples = await scrape((await self.hosted.forward(name, METRICS_PORT)).port)
            out += [
                f"{name}: {key} {value:g}"
                for key, value in sorted(samples.items())
                if key.startswith(prefixes) and value
            ]
        return out

    def records(self) -> int:
        return self.watch.latest() if self.watch is not None else 0
