"""Waiting for the database is three kinds of line, as waiting for the broker: one WARNING when
the wait starts, DEBUG for each retry after it, one INFO when the database answers again. A
database down for an hour is two lines at INFO, not one warning a retry."""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit, urlunsplit

import pytest

from bulk_recorder.infra.db import open_pool_when_ready
from bulk_recorder.masking import endpoint
from tests.conftest import wait_for
from tests.faults.proxy import TcpProxy

pytestmark = [pytest.mark.postgres]


def _through(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    netloc = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}{netloc[1]}127.0.0.1:{port}"))


async def test_a_database_wait_is_one_warning_then_debug_then_one_info(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    target = urlsplit(database_url)
    proxy = await TcpProxy(target.hostname or "127.0.0.1", target.port or 5432).start()
    proxy.cut()  # a server that accepts and closes: PostgreSQL is not there yet
    stop = asyncio.Event()
    caplog.set_level(logging.DEBUG, logger="bulk_recorder.infra.db")

    def lines(level: int) -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "bulk_recorder.infra.db" and r.levelno == level
        ]

    dsn = _through(database_url, proxy.port)
    task = asyncio.create_task(open_pool_when_ready(dsn, max_size=1, stop=stop))
    try:
        await wait_for(lambda: len(lines(logging.DEBUG)) >= 3, timeout=30)
        proxy.restore()
        pool = await asyncio.wait_for(task, 30)
        assert pool is not None
        await pool.close()
    finally:
        stop.set()
        task.cancel()
        await proxy.close()
    warnings, retries, infos = lines(logging.WARNING), lines(logging.DEBUG), lines(logging.INFO)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"database at {endpoint(dsn)} not reachable yet (")
    assert all("still not reachable" in line for line in retries), retries
    assert len(infos) == 1, infos
    failed = 1 + len(retries)
    assert infos[0] == f"database at {endpoint(dsn)} reachable again after {failed} failed attempts"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
