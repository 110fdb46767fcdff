"""Shared plumbing of the benchmarks: statistics, tables, machine facts, throw-away resources.

Every benchmark prints markdown tables of medians with min-max over its runs, so a table can be
pasted into RESULTS.md as it is. Everything a run creates (databases, queues, exchanges,
processes) has a unique name and is removed at the end, even when the run fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg

from bulk_recorder.infra.migrate import migrate
from consumer.tools.loadgen import LoadReport, LoadSpec, publish_load
from consumer.topology import Topology, declare_topology, delete_topology

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def database_url() -> str:
    """Maintenance DSN of the server to benchmark (``DATABASE_URL`` overrides the default)."""
    return os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL)


def rabbitmq_url() -> str:
    return os.environ.get("RABBITMQ_URL", DEFAULT_RABBITMQ_URL)


def unique(prefix: str) -> str:
    """A name no other run uses: ``prefix_<pid>_<random>``."""
    return f"{prefix}_{os.getpid()}_{secrets.token_hex(3)}"


def use_uvloop() -> None:
    """Run benchmarks on uvloop, as the recorder does."""
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def add_recorder_arguments(parser: argparse.ArgumentParser) -> None:
    """The recorder settings a benchmark run uses (the service's defaults)."""
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--prefetch", type=int, default=10)
    parser.add_argument("--size", type=int, default=0)
    parser.add_argument("--timeout-ms", type=int, default=100)


def run_main(
    parser: argparse.ArgumentParser,
    main_async: Callable[[argparse.Namespace], Coroutine[Any, Any, None]],
) -> None:
    """Parse the command line and run the benchmark on uvloop."""
    args = parser.parse_args()
    use_uvloop()
    asyncio.run(main_async(args))


# -- statistics and tables -------------------------------------------------------------------


@dataclass(slots=True)
class Stat:
    """Values of one figure over several runs."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def low(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def high(self) -> float:
        return max(self.values) if self.values else float("nan")

    def fmt(self, digits: int = 0, unit: str = "") -> str:
        """``median (min-max)``, e.g. ``9,812 (9,500-10,100)``."""
        if not self.values:
            return "-"
        f = f"{{:,.{digits}f}}"
        core = f.format(self.median) + unit
        if len(self.values) == 1 or self.low == self.high:
            return core
        return f"{core} ({f.format(self.low)}-{f.format(self.high)})"


def ratio(numerator: Stat, denominator: Stat) -> Stat:
    """Per-run ratios (runs paired in order: both were taken in the same round)."""
    out = Stat()
    for a, b in zip(numerator.values, denominator.values, strict=False):
        out.add(a / b if b else float("nan"))
    return out


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines)


def emit(title: str, body: str) -> None:
    print(f"\n### {title}\n\n{body}\n", flush=True)


def save_json(path: str | None, data: Any) -> None:
    """Write raw results for the charts (``--json PATH``)."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- machine facts ------------------------------------------------------------------------


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


async def machine_facts() -> dict[str, str]:
    """nproc, RAM, CPU, load, library and server versions: the header of every result."""
    facts = {
        "recorder code (git)": _code_version(),
        "nproc": str(os.cpu_count()),
        "cpu": _cpu_model(),
        "ram": f"{_mem_total_gib():.1f} GiB",
        "load average (1/5/15 min)": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "python": platform.python_version(),
        "aio-pika / aiormq / asyncpg / uvloop": " / ".join(
            _version(p) for p in ("aio-pika", "aiormq", "asyncpg", "uvloop")
        ),
    }
    with contextlib.suppress(Exception):
        conn = await asyncpg.connect(database_url())
        try:
            facts["postgresql"] = str(await conn.fetchval("SHOW server_version"))
            facts["postgresql fsync / synchronous_commit"] = (
                f"{await conn.fetchval('SHOW fsync')} / "
                f"{await conn.fetchval('SHOW synchronous_commit')}"
            )
        finally:
            await conn.close()
    with contextlib.suppress(Exception):
        mq = await aio_pika.connect(rabbitmq_url())
        try:
            props = mq.transport.connection.server_properties  # type: ignore[union-attr]
            facts["rabbitmq"] = str(props.get("version", "?"))
        finally:
            await mq.close()
    return facts


_RECORDER_PATHS = ("bulk_recorder", "consumer", "settings.py")


def _code_version() -> str:
    """HEAD of the repository, and whether the recorder's files differ from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "log", "-1", "--format=%h %cI"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--", *_RECORDER_PATHS],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + (" (+ uncommitted changes)" if dirty else "")


def facts_table(facts: dict[str, str]) -> str:
    return table(["machine", "value"], facts.items())


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def _mem_total_gib() -> float:
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024 / 1024
    return float("nan")


# -- /proc -----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (0 when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = raw.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores (from /proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return (total - idle) / CLK_TCK, total / CLK_TCK


def rss_mib(pid: int) -> float:
    """Resident set size (VmRSS) of a process in MiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def backend_pids(dsn_admin: str, database: str) -> list[int]:
    """PostgreSQL server processes working for ``database`` (connections and autovacuum)."""
    conn = await asyncpg.connect(dsn_admin)
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            database,
        )
    finally:
        await conn.close()
    return [r["pid"] for r in rows]


class PgCpu:
    """CPU seconds spent by the PostgreSQL processes of one database between two samples."""

    def __init__(self, dsn_admin: str, database: str) -> None:
        self._dsn = dsn_admin
        self._database = database
        self._start: dict[int, float] = {}

    async def begin(self) -> None:
        self._start = {
            pid: cpu_seconds(pid) for pid in await backend_pids(self._dsn, self._database)
        }

    async def end(self) -> float:
        total = 0.0
        for pid in await backend_pids(self._dsn, self._database):
            total += cpu_seconds(pid) - self._start.get(pid, 0.0)
        return total


# -- PostgreSQL ----------------------------------------------------------------------------


def with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def with_port(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    netloc = parts.netloc.rsplit("@", 1)
    host = (netloc[-1].rsplit(":", 1)[0]) if ":" in netloc[-1] else netloc[-1]
    hostport = f"{host}:{port}"
    netloc_out = f"{netloc[0]}@{hostport}" if len(netloc) == 2 else hostport
    return urlunsplit((parts.scheme, netloc_out, parts.path, parts.query, parts.fragment))


async def drop_database(name: str) -> None:
    conn = await asyncpg.connect(database_url())
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def temp_database(prefix: str = "bench") -> AsyncIterator[tuple[str, str]]:
    """A fresh migrated database: yields (dsn, name); dropped on exit."""
    name = unique(prefix)
    dsn = with_database(database_url(), name)
    try:
        await migrate(dsn)
        yield dsn, name
    finally:
        with contextlib.suppress(Exception):
            await drop_database(name)


async def count_rows(dsn: str, table_name: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {table_name}"))
    finally:
        await conn.close()


# -- RabbitMQ --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def temp_topology(prefix: str = "bench") -> AsyncIterator[Topology]:
    """The recorder's exchange and quorum queue (and dead-letter pair) under unique names."""
    name = unique(prefix)
    topology = Topology(exchange=name, queue=name + ".records", delivery_limit=5)
    connection = await aio_pika.connect(rabbitmq_url())
    try:
        channel = await connection.channel()
        await declare_topology(channel, topology)
        yield topology
    finally:
        with contextlib.suppress(Exception):
            await connection.close()
        # a fresh connection: the benchmark's may have died with whatever ended the benchmark
        cleanup = await aio_pika.connect(rabbitmq_url())
        try:
            left = await delete_topology(cleanup, topology, wait_s=300)
        finally:
            await cleanup.close()
        for what in left:
            print(f"warning: could not delete {what}", file=sys.stderr)


async def ready_count(queue: str) -> int:
    connection = await aio_pika.connect(rabbitmq_url())
    try:
        channel = await connection.channel()
        q = await channel.declare_queue(queue, passive=True)
        return int(q.declaration_result.message_count or 0)
    finally:
        await connection.close()


async def fill(
    topology: Topology, count: int, record_type: str = "transaction", *, ready: int = 0
) -> LoadReport:
    """Pre-fill the queue with ``count`` valid records (loadgen, publisher confirms); wait
    until ``ready`` (default ``count``) messages are in the queue."""
    report = await publish_load(
        rabbitmq_url(), topology.exchange, LoadSpec(record_type=record_type, count=count)
    )
    await wait_visible(topology.queue, ready or count)
    return report


async def wait_visible(queue: str, count: int, timeout: float = 30) -> None:
    """Wait until ``count`` messages are ready (a quorum queue confirms before it counts)."""
    for _ in range(int(timeout / 0.1)):
        if await ready_count(queue) >= count:
            return
        await asyncio.sleep(0.1)


# -- the recorder as a subprocess ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {"name{label=value,...}": value} (labels sorted, quotes dropped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if "{" in key:
            name, labels = key.split("{", 1)
            parts = sorted(p.replace('"', "") for p in labels.rstrip("}").split(",") if p)
            key = name + "{" + ",".join(parts) + "}"
        with contextlib.suppress(ValueError):
            out[key] = float(value)
    return out


async def http_get(port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, body.decode()


@dataclass(slots=True)
class RecorderConfig:
    workers: int = 5
    prefetch: int = 10
    size: int = 0
    timeout_ms: int = 100
    bulk: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)

    def label(self) -> str:
        mode = "bulk" if self.bulk else "per-message"
        return f"{mode} w={self.workers} p={self.prefetch} size={self.size} t={self.timeout_ms}ms"

    @property
    def batch_size(self) -> int:
        if not self.bulk:
            return 1
        return self.size or self.workers * self.prefetch

    @property
    def channel_prefetch(self) -> int:
        """Mirror of settings.Settings.channel_prefetch (the QoS the recorder sets)."""
        base = self.workers * self.prefetch
        return min(max(base, 2 * self.batch_size), 65_535)


class RecorderProcess:
    """``python -m consumer`` with env settings, its /metrics, its /proc figures."""

    def __init__(
        self,
        dsn: str,
        topology: Topology,
        config: RecorderConfig,
        *,
        log_path: Path | None = None,
        wrap: Sequence[str] = (),
        src: Path | None = None,
    ) -> None:
        """``src``: run the recorder from another source tree (a scratch copy with a change to
        measure); its packages shadow the installed ones because it is the working directory."""
        self.port = free_port()
        self.config = config
        env = dict(os.environ)
        env.update(
            {
                "DATABASE_URL": dsn,
                "RABBITMQ_URL": rabbitmq_url(),
                "RABBITMQ_EXCHANGE": topology.exchange,
                "RABBITMQ_QUEUE": topology.queue,
                "RABBITMQ_NUMBERS_OF_WORKERS": str(config.workers),
                "RABBITMQ_NUMBERS_OF_PREFETCH": str(config.prefetch),
                "BULK_RECORDER_ENABLED": "true" if config.bulk else "false",
                "BULK_RECORDER_SIZE": str(config.size),
                "BULK_RECORDER_FLUSH_TIMEOUT_MS": str(config.timeout_ms),
                "METRICS_PORT": str(self.port),
                "LOG_LEVEL": "WARNING",
                **config.extra_env,
            }
        )
        self._log = open(log_path or os.devnull, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*wrap, sys.executable, "-m", "consumer"],
            cwd=src or REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._pid: int | None = None if wrap else self.proc.pid

    @property
    def pid(self) -> int:
        """The recorder's own pid (the python child when wrapped by e.g. py-spy)."""
        if self._pid is None:
            self._pid = _python_child(self.proc.pid) or self.proc.pid
        return self._pid

    async def metrics(self) -> dict[str, float]:
        status, body = await http_get(self.port, "/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        return parse_metrics(body)

    async def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"recorder exited with {self.proc.returncode}")
            with contextlib.suppress(OSError, TimeoutError, IndexError, ValueError):
                status, _ = await http_get(self.port, "/readyz", 2)
                if status == 200:
                    return
            await asyncio.sleep(0.1)
        raise TimeoutError("recorder not ready")

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM if self._pid == self.proc.pid else signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return int(self.proc.returncode or 0)


def _python_child(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        for child in children:
            return int(child)
    return None


@dataclass(slots=True)
class Drain:
    """What happened while recorders drained a pre-filled queue."""

    rate: float  # msg/s between 1% and 100% acked
    seconds: float
    recorder_cpu_s: float  # recorder process CPU over the same window
    pg_cpu_s: float  # PostgreSQL backend CPU over the same window
    metrics: dict[str, float]  # last scrape (summed over processes)
    rss_peak_mib: float


def _sum_metrics(scrapes: Sequence[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for scrape in scrapes:
        for k, v in scrape.items():
            out[k] = out.get(k, 0.0) + v
    return out


async def drain(
    recorders: Sequence[RecorderProcess],
    expected: int,
    pg_cpu: PgCpu | None,
    *,
    timeout: float = 1800.0,
    poll_s: float = 0.05,
    on_sample: Callable[[float, float, list[float]], None] | None = None,
) -> Drain:
    """Poll /metrics until ``expected`` deliveries are acked; measure the rate from the first
    1% to the last ack so that start-up (connect, migrate) is not counted."""
    started = time.monotonic()
    start_at: float | None = None
    start_acked = 0.0
    cpu0 = 0.0
    peak = 0.0
    last: dict[str, float] = {}
    while True:
        now = time.monotonic()
        if now - started > timeout:
            raise TimeoutError(f"only {last.get('bulk_recorder_messages_acked_total')} acked")
        for r in recorders:
            if r.proc.poll() is not None:
                raise RuntimeError(f"recorder exited with {r.proc.returncode}")
        try:
            scrapes = await asyncio.gather(*(r.metrics() for r in recorders))
        except OSError:  # not listening yet
            await asyncio.sleep(poll_s)
            continue
        now = time.monotonic()
        last = _sum_metrics(scrapes)
        acked = last.get("bulk_recorder_messages_acked_total", 0.0)
        rss = [rss_mib(r.pid) for r in recorders]
        peak = max(peak, *rss)
        if on_sample is not None:
            on_sample(now, acked, rss)
        if start_at is None and acked >= max(1, expected // 100):
            start_at, start_acked = now, acked
            cpu0 = sum(r.cpu_seconds() for r in recorders)
            if pg_cpu is not None:
                await pg_cpu.begin()
        if acked >= expected and start_at is not None:
            cpu = sum(r.cpu_seconds() for r in recorders) - cpu0
            pg = await pg_cpu.end() if pg_cpu is not None else 0.0
            seconds = now - start_at
            rate = (acked - start_acked) / seconds if seconds > 0 else float("nan")
            return Drain(rate, seconds, cpu, pg, last, peak)
        await asyncio.sleep(poll_s)


def histogram_buckets(metrics: dict[str, float], name: str) -> list[tuple[float, float]]:
    """Cumulative (upper bound, count) pairs of a histogram from a parsed scrape."""
    out = []
    prefix = name + "_bucket{le="
    for key, value in metrics.items():
        if key.startswith(prefix):
            bound = key[len(prefix) :].rstrip("}")
            out.append((float("inf") if bound == "+Inf" else float(bound), value))
    return sorted(out)


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Upper bound of the bucket holding the q-quantile (coarse, like Prometheus without
    interpolation)."""
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    target = q * buckets[-1][1]
    for bound, count in buckets:
        if count >= target:
            return bound
    return buckets[-1][0]


# -- a delaying proxy in front of PostgreSQL ---------------------------------------------------


@contextlib.contextmanager
def delay_proxy(delay_ms: float, target: str = "127.0.0.1:5432") -> Iterator[int]:
    """Run benchmarks/delay_proxy.py; yields its port (the process is stopped on exit)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.delay_proxy",
            *("--target", target, "--delay-ms", str(delay_ms)),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"delay proxy did not start: {line!r}")
        yield int(line.rsplit(":", 1)[1])
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def round_trip_ms(dsn: str, count: int = 200) -> float:
    """Median milliseconds of ``SELECT 1`` on one connection."""
    conn = await asyncpg.connect(dsn)
    try:
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            await conn.fetchval("SELECT 1")
            samples.append((time.perf_counter() - started) * 1000)
        return statistics.median(samples)
    finally:
        await conn.close()
