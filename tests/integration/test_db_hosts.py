"""DATABASE_URL with several hosts, the first one silent: every command passes over it in time.

A host that never answers (a dead machine whose packets vanish, or a server that accepted the
socket and hangs) is the hard case of a host list: a refused port fails at once, a silent one
holds the connect. asyncpg bounds the whole connect with one timeout, so a silent first host
spent all of it and the next host was never tried. Each host now gets its own
``connect_timeout`` (1 s here): ``migrate`` (its reachability check and create-if-missing
included), the recorder's pool, the API's pool and the relay's pool and LISTEN connection all
reach the live server behind the silent one.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from bulk_recorder.infra import pg_hosts
from consumer.tools.generator import Generator
from tests.conftest import SettingsFactory, run_cli, settings_env, wait_for
from tests.integration.producer_support import api_client, ndjson, running_relay

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes the TCP connection (the kernel's backlog) and never says a word."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(64)
        yield int(sock.getsockname()[1])


def silent_host_first(
    dsn: str, silent_port: int, query: str = "target_session_attrs=read-write&connect_timeout=1"
) -> str:
    parts = urlsplit(dsn)
    userinfo, at, hostspec = parts.netloc.rpartition("@")
    netloc = f"{userinfo}{at}127.0.0.1:{silent_port},{hostspec or '127.0.0.1:5432'}"
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


async def test_every_command_passes_over_a_silent_host(
    make_settings: SettingsFactory, database_url: str, silent_port: int, start_recorder, broker
) -> None:
    settings = make_settings(database_url=silent_host_first(database_url, silent_port))

    # migrate: the reachability check, create-if-missing and the migrations
    done = run_cli(["migrate"], settings_env(settings), timeout=50)
    assert done.returncode == 0, done.stderr
    assert "applied: 001_records.sql" in done.stdout

    # the recorder's pool
    rec = await start_recorder(settings)
    gen = Generator.create(seed=11)
    messages = [(json.dumps(gen.credit_annotation()).encode(), "credit_annotation")] * 3
    await broker.publish_many(messages)
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 3, timeout=30)

    # the API's pool, then the relay's pool and LISTEN connection
    lines = [gen.credit_annotation() for _ in range(20)]
    async with api_client(settings) as (client, _):
        answer = await client.post(
            "/v1/credit-annotation-jobs",
            content=ndjson(lines),
            headers={"content-type": "application/x-ndjson"},
        )
        assert answer.status_code == 202, answer.text
    async with running_relay(settings) as relay:
        await wait_for(lambda: relay.published == len(lines), timeout=30)
        conn = await asyncpg.connect(database_url)
        try:

            async def listening() -> bool:
                n = await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND query LIKE 'LISTEN %bulk_recorder_outbox%'"
                )
                return int(n) == 1

            await wait_for(listening, timeout=30)
        finally:
            await conn.close()
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 3 + 20, timeout=30)


@pytest.mark.timeout(60)
@pytest.mark.exclusive(reason="times a 5 s wait within 5 s")
async def test_without_connect_timeout_a_silent_host_is_given_5_seconds(
    database_url: str, silent_port: int
) -> None:
    """docs/high-availability.md: each host is tried for ``connect_timeout`` seconds, default 5."""
    server = urlunsplit(urlsplit(database_url)._replace(path="/postgres"))  # one that exists
    dsn = silent_host_first(server, silent_port, query="target_session_attrs=read-write")
    started = time.monotonic()
    # past 10 s the wait is already wrong: not waited for (a 15 s default would hold it 15 s)
    try:
        conn = await asyncio.wait_for(pg_hosts.connect(dsn), 10.0)
    except TimeoutError:
        raise AssertionError("the silent host was given 10 s or more, not 5") from None
    waited = time.monotonic() - started
    try:
        assert await conn.fetchval("SELECT 1") == 1  # the live host behind the silent one
    finally:
        await conn.close()
    # the silent host had its 5 s, not less; the live one answers within a few more
    assert 5.0 <= waited < 10.0, waited
