"""The PostgreSQL primary SIGKILLed mid-run and its standby promoted (issue 11, item 4 c).

A primary with a synchronous standby (``tests/rigs``), and DATABASE_URL listing both with
``target_session_attrs=read-write``, the standby first. ``bulk-recorder migrate`` creates the
database through that URL (on the primary). Two real recorders, the relay and the API run on
it; records arrive both through the queue and through the API (a client that retries each
transaction with its Idempotency-Key, honouring Retry-After, as a client should). The primary is
SIGKILLed with every process of it mid-run; until the standby is promoted (``pg_ctl promote``)
the API answers 503 with Retry-After, then accepts again. The exact audit follows (every
transaction the API accepted and every valid message published is recorded once, balances
exact, DLQ exact, queue drained, nothing unacked), every process still up.

The recovery time, read off the database, runs from the kill to the first commit on the
promoted server; the promotion itself is part of it (the test promotes as soon as the API has
answered 503).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import asyncpg
import httpx
import pytest

from bulk_recorder.infra import pg_hosts
from consumer.tools.generator import Generator
from consumer.tools.loadgen import LoadSpec, publish_load
from tests.cluster.conftest import PgClusterFactory
from tests.cluster.failover_support import CommitWatch, recovery_line
from tests.cluster.traffic import Client
from tests.conftest import free_port, run_cli, settings_env, wait_for
from tests.faults.audit import audit_run, wait_for_rows, wait_until_settled
from tests.faults.conftest import API, RELAY
from tests.integration.producer_support import bearer, provision_key

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.postgres,
    pytest.mark.rabbitmq,
    pytest.mark.timeout(240),
]


async def test_primary_killed_standby_promoted_with_recorders_relay_and_api(
    pg_clusters: PgClusterFactory, make_settings, recorders, broker, services
) -> None:
    pg = await asyncio.to_thread(pg_clusters, True)
    dsn = pg.multi_host_dsn("bulk_recorder_ha", standby_first=True)
    settings = make_settings(database_url=dsn)
    done = run_cli(["migrate"], settings_env(settings), timeout=60)
    assert done.returncode == 0, done.stderr  # created on the primary, through the standby first
    assert pg.primary.sql("SELECT 1 FROM pg_database WHERE datname = 'bulk_recorder_ha'") == "1"

    api_port = free_port()
    procs = [
        await recorders.start(settings),
        await recorders.start(make_settings(database_url=dsn, bulk_recorder_size=200)),
        await recorders.start(settings, args=(*RELAY, "--poll-interval", "0.2"), name="relay"),
        await recorders.start(settings, args=API, name="api", env={"API_PORT": str(api_port)}),
    ]
    base_url = f"http://127.0.0.1:{api_port}"

    async def api_up() -> bool:
        with contextlib.suppress(httpx.TransportError):
            async with httpx.AsyncClient(base_url=base_url, timeout=2) as http:
                return (await http.get("/readyz")).status_code == 200
        return False

    await wait_for(api_up, timeout=60)
    watch = await CommitWatch(dsn).start()
    client = Client(
        base_url=base_url, gen=Generator.create(seed=1151), auth=bearer(await provision_key(dsn))
    )
    stop_client = asyncio.Event()
    posting = asyncio.create_task(client.run(stop_client))
    opened: list[asyncpg.Connection] = []  # connections of the settle check
    try:
        publisher = asyncio.create_task(
            publish_load(
                services.rabbitmq_url,
                settings.rabbitmq_exchange,
                LoadSpec("mixed", 8_000, duplicates=0.05, invalid=0.01, seed=1152),
            )
        )
        conn = await pg_hosts_connect(dsn)
        try:
            await wait_for_rows(conn, 1_000, timeout=120)
        finally:
            conn.terminate()
        assert client.accepted, "the API accepted nothing before the kill"

        killed = time.monotonic()
        await asyncio.to_thread(pg.primary.kill)
        await wait_for(lambda: any(t > killed for t in client.unavailable), timeout=60)
        await asyncio.to_thread(pg.standby.promote)
        promoted = time.monotonic() - killed
        await wait_for(lambda: any(t > killed for t in client.accepted.values()), timeout=60)
        await wait_for(lambda: sum(t > killed for t in client.accepted.values()) >= 30, timeout=60)
        stop_client.set()
        await posting
        report = await publisher
        for tx_id in client.accepted:
            report.ids["transaction"].add(tx_id)
        report.published += len(client.accepted)
        report.valid += len(client.accepted)

        async def connect_promoted():
            opened.append(await pg_hosts_connect(dsn))
            return opened[-1]

        await wait_until_settled(connect_promoted, broker, report, timeout=180)
        assert all(p.running for p in procs), "a process died"
        for proc in procs:
            assert await proc.terminate() == 0
        conn = await pg_hosts_connect(dsn)
        try:
            assert await conn.fetchval("SELECT inet_server_port()") == pg.standby.port
            audit = await audit_run(conn, broker, report, faults=1)
        finally:
            await conn.close()
    finally:
        for each in opened:
            each.terminate()
        stop_client.set()
        await watch.stop()
        with contextlib.suppress(BaseException):
            await posting
    gap = [t for t in client.unavailable if t > killed]
    first_503 = min(gap) - killed
    back = min(t for t in client.accepted.values() if t > min(gap)) - killed
    print()
    print(
        f"primary SIGKILLed; standby promoted {promoted:.2f} s after the kill; API: "
        f"{len(gap)} answer(s) 503 + Retry-After from {first_503:.2f} s, accepting again at "
        f"{back:.2f} s; {len(client.accepted)} transactions accepted, other answers "
        f"{len(client.other)}"
    )
    print(recovery_line("recorders (rows committed on the promoted standby)", watch, killed))
    audit.assert_exact(dlq_surplus_allowed=True)


async def pg_hosts_connect(dsn: str) -> asyncpg.Connection:
    return await pg_hosts.connect(dsn)
