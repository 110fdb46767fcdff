"""Machine facts for every result table, and CPU/memory readings from /proc."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import aio_pika
import asyncpg

from benchmarks.support.env import CLK_TCK, REPO, database_url, rabbitmq_url
from benchmarks.support.stats import table


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
