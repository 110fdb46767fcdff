"""A delaying proxy in front of PostgreSQL, and the round trip it makes."""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import asyncpg

from benchmarks.support.env import REPO


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
