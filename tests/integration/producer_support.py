"""Helpers for the producer-side tests: the API in process, a relay in process, a TCP proxy."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
from aio_pika.abc import AbstractChannel

from bulk_recorder.infra import pg_hosts
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer.api import create_app
from bulk_recorder.producer.key_store import DEFAULT_SCOPES, create_key
from bulk_recorder.producer.relay import Relay, RelayConfig
from bulk_recorder.records import CreditAnnotation, decode, exact
from consumer.tools.generator import Generator
from consumer.topology import Topology, declare_topology
from settings import Settings
from tests.conftest import settings_env, wait_for


async def provision_key(
    database_url: str, name: str = "test-client", scopes: Iterable[str] = DEFAULT_SCOPES
) -> str:
    """Migrate the database and make an API key for client ``name``; returns the key."""
    await migrate(database_url)
    conn = await pg_hosts.connect(database_url)  # every host of a multi-host URL, as the API
    try:
        _, key = await create_key(conn, name, scopes)
    finally:
        await conn.close()
    return key


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@contextlib.asynccontextmanager
async def api_client(
    settings: Settings,
    *,
    raise_app_exceptions: bool = True,
    client_name: str = "test-client",
    scopes: Iterable[str] = DEFAULT_SCOPES,
    **options: Any,
) -> AsyncIterator[tuple[httpx.AsyncClient, Metrics]]:
    """The app in process (lifespan included) behind an httpx client that sends an API key of
    client ``client_name`` with ``scopes`` (by default a client's own work, no admin)."""
    metrics = Metrics()
    app = create_app(settings, metrics=metrics, **options)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://api") as client,
    ):
        if settings.api_auth == "on":
            client.headers.update(
                bearer(await provision_key(settings.database_url, client_name, scopes))
            )
        yield client, metrics


def declare_for(settings: Settings) -> Any:
    topology = Topology.from_settings(settings)

    async def declare(channel: AbstractChannel) -> None:
        await declare_topology(channel, topology)

    return declare


@dataclass
class RunningRelay:
    relay: Relay
    stop: asyncio.Event
    task: asyncio.Task[None]

    def value(self, name: str, **labels: str) -> float:
        return self.relay.metrics.registry.get_sample_value(name, labels or None) or 0.0

    @property
    def published(self) -> float:
        return self.value("bulk_recorder_outbox_published_total")

    async def shutdown(self, timeout: float = 60) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout)


@contextlib.asynccontextmanager
async def running_relay(
    settings: Settings, config: RelayConfig | None = None, *, declare: Any = "default"
) -> AsyncIterator[RunningRelay]:
    relay = Relay(
        settings,
        Metrics(),
        config or RelayConfig(batch_size=200, poll_interval_s=0.2),
        declare=declare_for(settings) if declare == "default" else declare,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    handle = RunningRelay(relay, stop, task)
    try:
        yield handle
    finally:
        if not task.done():
            await handle.shutdown()
        elif not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def ndjson(objects: list[dict[str, Any]]) -> bytes:
    return b"\n".join(json.dumps(o).encode() for o in objects) + b"\n"


def expected_balances(transactions: list[dict[str, Any]]) -> dict[tuple[str, str], Decimal]:
    """Balance per (account, asset) from unique APPROVED transactions: credits minus debits."""
    unique = {t["id"]: t for t in transactions}
    out: dict[tuple[str, str], Decimal] = {}
    for t in unique.values():
        if t["status"] != "APPROVED":
            continue
        for op in t["operations"]:
            key = (op["account_id"], op["asset_code"])
            amount = Decimal(str(op["amount"]))  # exactly: the contract's 38 digits, not 28
            signed = amount if op["type"] == "CREDIT" else amount.copy_negate()
            out[key] = exact.add(out.get(key, exact.ZERO), signed)
    return out


def annotation_records(seed: int, count: int, **changes: Any) -> list[CreditAnnotation]:
    """``count`` valid annotations of the generator, decoded as the recorder would; ``changes``
    set fields of each (e.g. an amount at the contract's limit)."""
    gen = Generator.create(seed)
    out = []
    for _ in range(count):
        raw = {k: v for k, v in gen.credit_annotation().items() if v is not None}
        record = decode(json.dumps({**raw, **changes}).encode(), "credit_annotation")
        assert isinstance(record, CreditAnnotation)
        out.append(record)
    return out


async def balances(conn: Any) -> dict[tuple[str, str], Decimal]:
    rows = await conn.fetch("SELECT account_id::text, asset_code, available FROM balances")
    return {(r["account_id"], r["asset_code"]): r["available"] for r in rows}


class TcpProxy:
    """A TCP forwarder the test can cut (close every connection, refuse new ones) and restore."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.target_port = host, port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.connections = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (OSError, asyncio.IncompleteReadError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update((writer, up_writer))


@contextlib.asynccontextmanager
async def running_api(
    settings: Settings, log_path: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """``bulk-recorder api`` in a child process, ready on ``settings.api_port``, its output in
    ``log_path``. If the body leaves it running, it is stopped with SIGTERM and must exit 0; if
    the body fails, it is killed."""
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "consumer.cli",
            "api",
            env=settings_env(settings),
            stdout=log_file,
            stderr=log_file,
        )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.api_port}") as c:

                async def up() -> bool:
                    try:
                        return (await c.get("/readyz")).status_code == 200
                    except httpx.TransportError:
                        return False

                await wait_for(up, timeout=30)
            yield proc
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
