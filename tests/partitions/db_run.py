"""A run for the database-side partitions: two recorders on their hosts, queue traffic, watches.

:class:`DbRun` (``await DbRun.begin(hosted, topology)``) migrates a fresh database on the
primary (pg1, through the observer) and starts two recorders, on hosts rec1 and rec2, given
every broker node (``?heartbeat=2``) and both database servers (``connect_timeout=2``), with a
short database command timeout and release time so a cut of a few seconds shows every step.
Then:

- ``run.start_traffic()``: the load generator's mixed messages (valid, duplicate, invalid) in
  chunks, each published until confirmed, through the forwarders of every broker node;
- ``run.watch`` (:class:`~tests.cluster.failover_support.CommitWatch`): committed rows every
  50 ms through the observer (it follows the writable server);
- ``run.logs`` (:class:`~tests.partitions.harness.LogWatch`): when each recorder logged each
  line (0.1 s resolution);
- ``run.metrics`` (:class:`MetricsWatch`): each recorder's /metrics every 0.25 s (what an
  operator's Prometheus would scrape), for the figures of the report;
- ``await run.finish()``: traffic stopped, everything recorded, every recorder ready, then
  stopped with exit 0, and the audit of ``tests/faults/audit.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass, field

import httpx

from consumer.topology import Topology
from settings import Settings
from tests.cluster.failover_support import CommitWatch
from tests.cluster.traffic import QueueTraffic
from tests.conftest import unique_name, wait_for
from tests.faults.audit import Audit
from tests.faults.conftest import RecorderProcess
from tests.integration.producer_support import provision_key
from tests.partitions.harness import LogWatch, settle_and_audit
from tests.rigs.hosted import Hosted, service_settings

HEARTBEAT = 2  # ?heartbeat= on the recorders' broker URLs
DB_COMMAND_TIMEOUT = 3.0  # BULK_RECORDER_DB_COMMAND_TIMEOUT_S (default 15)
RELEASE_AFTER = 6.0  # BULK_RECORDER_RELEASE_AFTER_S (default 60)
RECORDERS = ("rec1", "rec2")
WATCHED = (
    "bulk_recorder_paused",
    "bulk_recorder_db_retries_total",
    "bulk_recorder_messages_acked_total",
    "bulk_recorder_messages_released_total",
    "bulk_recorder_broker_reconnects_total",
    "bulk_recorder_buffer_messages",
    "bulk_recorder_oldest_held_seconds",
)
_SAMPLE = re.compile(r"^([a-z_]+)(?:\{[^}]*\})? ([0-9.e+-]+|NaN)$")


@dataclass
class MetricsWatch:
    """A few of each recorder's metrics, scraped every ``interval`` s through the observer."""

    urls: dict[str, str]
    interval: float = 0.25
    samples: dict[str, list[tuple[float, dict[str, float]]]] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    def start(self) -> MetricsWatch:
        self.samples = {name: [] for name in self.urls}
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=2) as http:
            while True:
                for name, url in self.urls.items():
                    with contextlib.suppress(httpx.HTTPError):
                        answer = await http.get(f"{url}/metrics")
                        self.samples[name].append((time.monotonic(), _parse(answer.text)))
                await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def value(self, name: str, metric: str, at: float) -> float:
        """The last value of ``metric`` scraped from ``name`` at or before ``at``."""
        before = [v.get(metric, 0.0) for t, v in self.samples[name] if t <= at]
        return before[-1] if before else 0.0

    def first(self, name: str, metric: str, after: float, test: object) -> float | None:
        """Seconds from ``after`` to the first scrape where ``test(value)`` holds."""
        assert callable(test)
        for t, values in self.samples[name]:
            if t >= after and test(values.get(metric, 0.0)):
                return t - after
        return None

    def peak(self, name: str, metric: str, start: float, end: float) -> float:
        return max(
            (v.get(metric, 0.0) for t, v in self.samples[name] if start <= t <= end), default=0.0
        )

    def changes(self, name: str, metric: str, start: float, end: float) -> float:
        return self.value(name, metric, end) - self.value(name, metric, start)


def _parse(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        found = _SAMPLE.match(line)
        if found and found.group(1) in WATCHED:
            out[found.group(1)] = out.get(found.group(1), 0.0) + float(found.group(2))
    return out


@dataclass
class DbRun:
    hosted: Hosted
    topo: Topology
    database: str
    procs: dict[str, RecorderProcess] = field(default_factory=dict)
    watch: CommitWatch | None = None
    logs: LogWatch | None = None
    metrics: MetricsWatch | None = None
    queue: QueueTraffic | None = None
    seed: int = 3107
    unsettled: bool = False  # finish() gave up waiting for every record (the audit says why)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _traffic: asyncio.Task[None] | None = None

    @classmethod
    async def begin(cls, hosted: Hosted, topo: Topology, seed: int = 3107) -> DbRun:
        database = unique_name("brdb")
        await provision_key(hosted.test_dsn(database))  # migrates, on the primary
        return cls(hosted, topo, database, seed=seed)

    def settings(self, **more: object) -> Settings:
        return service_settings(
            self.hosted.database_url(self.database),
            self.hosted.rabbitmq_url(HEARTBEAT),
            self.topo,
            "recorder",
            bulk_recorder_db_command_timeout_s=DB_COMMAND_TIMEOUT,
            bulk_recorder_release_after_s=RELEASE_AFTER,
            **more,
        )

    async def start_recorders(self) -> None:
        self.procs["rec1"] = await self.hosted.start("rec1", self.settings())
        self.procs["rec2"] = await self.hosted.start(
            "rec2", self.settings(bulk_recorder_size=200, rabbitmq_numbers_of_workers=3)
        )
        await wait_for(self.hosted.all_ready, timeout=120, interval=0.3)
        self.watch = await CommitWatch(self.hosted.test_dsn(self.database)).start()
        self.logs = LogWatch(self.procs).start()
        urls = {name: await self.hosted.base_url(name) for name in RECORDERS}
        self.metrics = MetricsWatch(urls).start()

    def start_traffic(self, chunk: int = 100, pause: float = 0.2) -> None:
        urls = ",".join(self.hosted.test_amqp_urls())
        self.queue = QueueTraffic(urls, self.topo.exchange, self.seed, chunk=chunk, pause=pause)
        self._traffic = asyncio.create_task(self.queue.run(self._stop))

    async def stop_traffic(self) -> None:
        self._stop.set()
        if self._traffic is not None:
            await self._traffic

    async def wait_rows(self, rows: int, timeout: float = 120) -> None:
        """Until the watch has seen ``rows`` committed records (progress, not speed)."""
        watch = self.watch
        assert watch is not None
        await wait_for(lambda: watch.latest() >= rows, timeout=timeout, interval=0.1)

    def watches(self) -> tuple[CommitWatch, LogWatch, MetricsWatch]:
        """The commit, log and metrics watches (started by :meth:`start_recorders`)."""
        assert self.watch is not None
        assert self.logs is not None
        assert self.metrics is not None
        return self.watch, self.logs, self.metrics

    def records(self) -> int:
        return self.watch.latest() if self.watch is not None else 0

    async def finish(self, faults: int) -> tuple[Audit, list[str]]:
        """Stop the traffic, settle, check readiness, stop the recorders, audit.

        Returns the audit and the recorders not ready at the end (asserted by the caller,
        after it printed its report)."""
        await self.stop_traffic()
        assert self.queue is not None
        sent, shapes = self.queue.merged()
        try:
            audit, unready, self.unsettled = await settle_and_audit(
                self.hosted,
                self.database,
                self.topo,
                self.procs,
                sent,
                faults,
                expected_dlq=shapes,
                settle_timeout=180,
                missing_ok=True,
            )
        finally:
            await self.stop_watches()
        return audit, unready

    async def stop_watches(self) -> None:
        for watch in (self.watch, self.logs, self.metrics):
            if watch is not None:
                await watch.stop()

    async def abort(self) -> None:
        """After a failure: stop the traffic and the watches (the fixtures stop the rest)."""
        self._stop.set()
        if self._traffic is not None:
            self._traffic.cancel()
            await asyncio.gather(self._traffic, return_exceptions=True)
        await self.stop_watches()
