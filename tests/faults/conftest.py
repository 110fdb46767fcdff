"""Fault fixtures: TCP proxies in front of PostgreSQL and RabbitMQ, and real recorder processes.

``pg_proxy`` / ``mq_proxy`` forward to the test services; point a recorder at them with
``via_proxy(url, proxy)``. ``recorders`` starts ``python -m consumer`` subprocesses with the
environment built from a :class:`Settings` (the same variables an operator sets), and can
SIGKILL, SIGTERM and restart them. Every process is stopped at the end of the test and its log
is printed when the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from settings import Settings
from tests.conftest import Services, wait_for
from tests.faults.amqp_tap import AmqpTap, CancelDrop, ConfirmHold
from tests.faults.proxy import TcpProxy

REPO = Path(__file__).resolve().parents[2]

# Longer runs (more records, more faults) with SOAK=1 (`make soak`).
SOAK = os.environ.get("SOAK", "") not in ("", "0")


def scale(quick: int, soak: int) -> int:
    return soak if SOAK else quick


# Per-test bound for the long runs (pytest-timeout); soak runs take far longer than 300 s.
long_run = pytest.mark.timeout(scale(300, 3600))


def via_proxy(url: str, proxy: TcpProxy) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (userinfo + "@" if userinfo else "") + f"127.0.0.1:{proxy.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


# Relay lanes holding claimed outbox rows in an open transaction (publishing, or waiting to):
# their claim's row locks show as a RowShareLock on the outbox, whatever statement the lane ran
# last (the claim is followed by a SET LOCAL in the same transaction).
CLAIMS_OPEN = """
SELECT count(DISTINCT a.pid) FROM pg_stat_activity AS a JOIN pg_locks AS l ON l.pid = a.pid
WHERE a.datname = current_database() AND a.state = 'idle in transaction'
  AND l.locktype = 'relation' AND l.relation = 'outbox'::regclass AND l.mode = 'RowShareLock'
"""


async def claims_open(conn: Any) -> int:
    """How many relay lanes hold claimed outbox rows in an open transaction."""
    return int(await conn.fetchval(CLAIMS_OPEN))


def _target(url: str, default_port: int) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or default_port


@pytest.fixture
async def pg_proxy(services: Services) -> AsyncIterator[TcpProxy]:
    async with TcpProxy(*_target(services.database_url, 5432)) as proxy:
        yield proxy


@pytest.fixture
async def mq_proxy(services: Services) -> AsyncIterator[TcpProxy]:
    async with TcpProxy(*_target(services.rabbitmq_url, 5672)) as proxy:
        yield proxy


@pytest.fixture
async def amqp_tap(services: Services) -> AsyncIterator[AmqpTap]:
    """A proxy to RabbitMQ that decodes and records the frames (see amqp_tap.py)."""
    async with AmqpTap(*_target(services.rabbitmq_url, 5672)) as proxy:
        yield proxy


@pytest.fixture
async def cancel_drop(services: Services) -> AsyncIterator[CancelDrop]:
    """A proxy to RabbitMQ that loses every Basic.Cancel the broker sends (amqp_tap.py)."""
    async with CancelDrop(*_target(services.rabbitmq_url, 5672)) as proxy:
        yield proxy


@pytest.fixture
async def confirm_hold(services: Services) -> AsyncIterator[ConfirmHold]:
    """A proxy to RabbitMQ that can hold the confirms of publishing connections (amqp_tap.py)."""
    async with ConfirmHold(*_target(services.rabbitmq_url, 5672)) as proxy:
        yield proxy


def settings_env(settings: Settings) -> dict[str, str]:
    """The environment variables that reproduce ``settings`` in a child process."""
    env = {k: v for k, v in os.environ.items() if k not in _setting_names()}
    for name, value in settings.model_dump().items():
        if value is None:  # unset: the command's own default (e.g. METRICS_PORT per role)
            env.pop(name.upper(), None)
            continue
        env[name.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _setting_names() -> set[str]:
    return {name.upper() for name in Settings.model_fields}


CONSUME = ("-m", "consumer")
RELAY = ("-m", "consumer.cli", "relay")
API = ("-m", "consumer.cli", "api")


class RecorderProcess:
    """One ``python -m consumer`` child process (or another command: ``args``, e.g. ``RELAY``);
    its output goes to a log file. ``launcher`` goes before the command (e.g. ``ip netns exec
    NS``, which execs it: the pid stays the service's own)."""

    def __init__(
        self,
        settings: Settings,
        log_path: Path,
        args: tuple[str, ...] = CONSUME,
        env: dict[str, str] | None = None,
        launcher: tuple[str, ...] = (),
    ) -> None:
        self.settings = settings
        self.log_path = log_path
        self.args = args
        self.env = env or {}
        self.launcher = launcher
        self.proc: asyncio.subprocess.Process | None = None
        self.kills = 0
        self.starts = 0

    async def start(self) -> None:
        assert self.proc is None or self.proc.returncode is not None
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start #{self.starts} =====\n".encode())
            log.flush()
            self.proc = await asyncio.create_subprocess_exec(
                *self.launcher,
                sys.executable,
                *self.args,
                cwd=REPO,
                env={**settings_env(self.settings), **self.env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def kill(self) -> None:
        """SIGKILL: no shutdown flush, no acks, no goodbye to the broker or the database."""
        assert self.proc is not None
        try:
            self.proc.send_signal(signal.SIGKILL)
        except ProcessLookupError:  # it had already exited: a crash of its own, not ours
            code = await self.proc.wait()
            raise AssertionError(
                f"{self.log_path.stem} exited by itself (code {code}) before the test killed it"
            ) from None
        await self.proc.wait()
        self.kills += 1

    async def terminate(self, timeout: float = 60) -> int:
        """SIGTERM and wait for the orderly shutdown; returns the exit code. A process started
        moments ago may still be importing, with no handler for SIGTERM yet: the signal would
        kill it (-15) without its orderly stop ever being tried, so it is sent once the process
        catches it."""
        assert self.proc is not None
        proc = self.proc
        if proc.returncode is None:
            await wait_for(
                lambda: proc.returncode is not None or catches(proc.pid, signal.SIGTERM),
                timeout=timeout,
            )
        if proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
                raise AssertionError(f"recorder did not stop within {timeout} s") from None
        assert self.proc.returncode is not None
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def catches(pid: int, signum: int) -> bool:
    """``pid`` has a handler installed for ``signum`` (the SigCgt mask of /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except FileNotFoundError:
        pass
    return False


@pytest.fixture
async def recorders(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[RecorderPool]:
    pool = RecorderPool(tmp_path)
    yield pool
    await pool.close()
    failed = getattr(request.node, "rep_call", None)
    if failed is not None and failed.failed:
        for proc in pool.processes:
            print(f"----- {proc.log_path.name} (last 60 lines) -----")
            print("\n".join(proc.log_text().splitlines()[-60:]))


class RecorderPool:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.processes: list[RecorderProcess] = []

    async def start(
        self,
        settings: Settings,
        *,
        args: tuple[str, ...] = CONSUME,
        name: str = "recorder",
        env: dict[str, str] | None = None,
        launcher: tuple[str, ...] = (),
    ) -> RecorderProcess:
        """Start ``python ARGS`` (by default the recorder); ``env`` adds to the settings';
        ``launcher`` goes before the command (``ip netns exec NS``)."""
        log_path = self.folder / f"{name}-{len(self.processes)}.log"
        proc = RecorderProcess(settings, log_path, args, env, launcher)
        self.processes.append(proc)
        await proc.start()
        return proc

    async def close(self) -> None:
        for proc in self.processes:
            if proc.running:
                with contextlib.suppress(AssertionError):
                    await proc.terminate(timeout=30)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
