"""The recorder as a subprocess: start it, scrape its metrics, drain a queue through it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.support.env import REPO, rabbitmq_url
from benchmarks.support.machine import PgCpu, cpu_seconds, rss_mib
from consumer.tools.demo_support import free_port
from consumer.topology import Topology


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
        return min(max(base, (self.workers + 1) * self.batch_size), 65_535)


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
