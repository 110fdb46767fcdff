"""Helpers for the failover tests: watch commits over time, build settings and reports, parse logs.

:class:`CommitWatch` counts committed record rows every 50 ms from the test's own connection
(through the multi-host DSN when the database fails over), so the recovery time of a fault is
read off the database, not off the services' own account: from the kill to the first commit
after it, and the longest stretch without a commit until the last row arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg

from bulk_recorder.infra import pg_hosts
from consumer.tools.loadgen import LoadReport
from consumer.topology import Topology
from settings import Settings, load_settings
from tests.conftest import Broker
from tests.faults.audit import expected_invalid_shapes
from tests.rigs.rabbitmq_cluster import RabbitCluster

ROWS = "SELECT (SELECT count(*) FROM transactions) + (SELECT count(*) FROM credit_annotations)"
OUTBOX = "SELECT count(*) FROM outbox"


@dataclass
class CommitWatch:
    """Samples ``query`` (a count) every ``interval`` s until stopped; reconnects on failure."""

    dsn: str
    query: str = ROWS
    interval: float = 0.05
    samples: list[tuple[float, int]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    async def start(self) -> CommitWatch:
        self._task = asyncio.create_task(self._run())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        conn: asyncpg.Connection | None = None
        try:
            while True:
                try:
                    if conn is None or conn.is_closed():
                        conn = await pg_hosts.connect(self.dsn)
                    value = int(await conn.fetchval(self.query, timeout=5))
                    self.samples.append((time.monotonic(), value))
                except (
                    asyncpg.PostgresError,
                    asyncpg.InterfaceError,
                    asyncpg.exceptions.InternalClientError,
                    OSError,
                    TimeoutError,
                ):
                    if conn is not None:
                        conn.terminate()
                    conn = None
                await asyncio.sleep(self.interval)
        finally:
            if conn is not None:
                conn.terminate()

    def latest(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def _before(self, moment: float) -> int:
        before = [v for t, v in self.samples if t <= moment]
        return before[-1] if before else 0

    def first_change_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the first sample whose count differs from the one before."""
        base = self._before(moment)
        for t, v in self.samples:
            if t > moment and v != base:
                return t - moment
        return None

    def longest_stall_after(self, moment: float, until_rows: int | None = None) -> float:
        """The longest time without a change, from ``moment`` to the last change (or to the
        first sample holding ``until_rows`` rows: the work that was waiting then is done, and
        a quiet queue after it is not a stall)."""
        return self.longest_stall_span_after(moment, until_rows)[1]

    def longest_stall_span_after(
        self, moment: float, until_rows: int | None = None
    ) -> tuple[float, float, int]:
        """(start, length, rows at its start) of the stretch :meth:`longest_stall_after` measures:
        start in seconds from ``moment``."""
        previous_t, previous_v = moment, self._before(moment)
        longest = (0.0, 0.0, previous_v)
        for t, v in self.samples:
            if t <= moment or v == previous_v:
                continue
            if t - previous_t > longest[1]:
                longest = (previous_t - moment, t - previous_t, previous_v)
            previous_t, previous_v = t, v
            if until_rows is not None and v >= until_rows:
                break
        return longest


def waits_without_commit(
    watch: CommitWatch, moment: float, ready: list[float], base: int, until_rows: int
) -> list[tuple[float, float]]:
    """Every stretch (from, to) after ``moment`` in which a record waited and none was
    committed, until ``until_rows``. ``ready`` holds, in order, when each record became
    committable (its publish confirmed by the broker), counted on top of ``base`` rows: a
    stretch without a commit counts only from the moment more records were confirmed than
    committed (a quiet queue is no stall)."""
    previous_t, previous_v = moment, watch._before(moment)
    stretches: list[tuple[float, float]] = []
    for t, v in watch.samples:
        if t <= moment or v == previous_v:
            continue
        index = previous_v - base  # the next record to commit, in confirm order
        if 0 <= index < len(ready) and ready[index] < t:
            stretches.append((max(previous_t, ready[index]), t))
        previous_t, previous_v = t, v
        if v >= until_rows:
            break
    return stretches


def longest_gap_after(moments: list[float], start: float, end: float) -> float:
    """The longest time without an event of ``moments`` (sorted) between ``start`` and ``end``."""
    inside = [start, *(m for m in moments if start < m < end), end]
    return max(b - a for a, b in itertools.pairwise(inside))


def cluster_settings(
    database_url: str, rabbitmq_url: str, topology: Topology, **overrides: object
) -> Settings:
    values: dict[str, object] = {
        "database_url": database_url,
        "rabbitmq_url": rabbitmq_url,
        "rabbitmq_exchange": topology.exchange,
        "rabbitmq_queue": topology.queue,
        "rabbitmq_delivery_limit": topology.delivery_limit,
        "metrics_port": 0,
    }
    values.update(overrides)
    return load_settings(**values)


def merge(*reports: LoadReport) -> tuple[LoadReport, Counter[str]]:
    """One report for several load runs, and the DLQ reason shapes they must leave together."""
    total = LoadReport()
    shapes: Counter[str] = Counter()
    for report in reports:
        total.published += report.published
        total.valid += report.valid
        total.duplicates += report.duplicates
        total.invalid += report.invalid
        for record_type, ids in report.ids.items():
            assert not total.ids[record_type] & ids, "two runs published the same id"
            total.ids[record_type] |= ids
        shapes += expected_invalid_shapes(report.invalid)
    return total, shapes


_CONNECTED = re.compile(r"connected to RabbitMQ node 127\.0\.0\.1:(\d+)/")


def last_node_port(log_text: str) -> int | None:
    """The AMQP port of the node a process last connected to, from its log."""
    ports = _CONNECTED.findall(log_text)
    return int(ports[-1]) if ports else None


async def wait_value(
    probe: Callable[[], Awaitable[int]], done: Callable[[int], bool], timeout: float
) -> int:
    """Poll ``probe`` until ``done(value)``; the test fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s (last value {value})")
        await asyncio.sleep(0.05)


def recovery_line(
    what: str, watch: CommitWatch, killed_at: float, until_rows: int | None = None
) -> str:
    first = watch.first_change_after(killed_at)
    start, stall, rows = watch.longest_stall_span_after(killed_at, until_rows)
    first_text = f"{first:.2f} s" if first is not None else "none"
    return (
        f"{what}: kill -> first commit after it {first_text}; longest stall {stall:.2f} s "
        f"(from +{start:.2f} s, at {rows} rows)"
    )


async def open_broker(cluster: RabbitCluster, topo: Topology) -> Broker:
    """The test's own broker helper, on a node that is running now (declares the topology)."""
    broker = Broker(cluster.running_nodes()[0].url, topo)
    await broker.open()
    return broker
