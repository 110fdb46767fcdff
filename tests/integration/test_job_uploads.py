"""Job uploads are bounded: body size, line count, time; and no transaction spans an upload.

The API in process (httpx + ASGITransport: the app's own receive loop, the real PostgreSQL) and
as a real uvicorn process (a stalled socket, a SIGKILL in the middle of an upload).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import bulk_recorder.producer.api.jobs as jobs_module
from bulk_recorder.producer.job_staging import STAGING_TABLE
from bulk_recorder.producer.parsers import CSV_COLUMNS
from consumer.tools.generator import Generator
from tests.conftest import free_port, wait_for
from tests.faults.pg_locks import backend_pid, wait_for_backends_gone, wait_for_blocked_by
from tests.integration.producer_support import api_client, ndjson, provision_key, running_api

pytestmark = [pytest.mark.postgres]

NDJSON = {"content-type": "application/x-ndjson"}
CSV = {"content-type": "text/csv"}
JOBS = "/v1/credit-annotation-jobs"


class StallingBody:
    """A request body sent as ``first``; when the app asks for more, ``asked`` is set and the
    body waits for ``release`` (never set: a client that stalls), then sends ``rest``.

    The app reads a job's body only once it holds a job slot, so ``asked`` also says that the
    upload holds its slot and has handled ``first``."""

    def __init__(self, first: bytes, rest: bytes = b"") -> None:
        self.first, self.rest = first, rest
        self.started = False
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.started = True
        yield self.first
        self.asked.set()
        await self.release.wait()
        if self.rest:
            yield self.rest


def lines(gen: Generator, n: int) -> bytes:
    return ndjson([gen.credit_annotation() for _ in range(n)])


async def stored(conn: Any) -> tuple[int, int]:
    """(jobs, outbox rows) visible to other sessions."""
    jobs = await conn.fetchval("SELECT count(*) FROM credit_annotation_jobs")
    outbox = await conn.fetchval("SELECT count(*) FROM outbox")
    return int(jobs), int(outbox)


async def staging_tables(conn: Any) -> int:
    """Staging tables alive in any session (a temporary table lives as long as its session)."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_class WHERE relname = $1 AND relpersistence = 't'",
            STAGING_TABLE,
        )
    )


# -- size ------------------------------------------------------------------------------------


async def test_a_declared_body_over_the_limit_is_413_before_any_of_it_is_read(
    make_settings, db
) -> None:
    settings = make_settings(api_max_job_bytes=4096)
    body = StallingBody(lines(Generator.create(60), 2))
    body.release.set()
    async with api_client(settings) as (client, _):
        response = await client.post(
            JOBS, content=body, headers={**NDJSON, "content-length": "1000000"}
        )
        assert response.status_code == 413, response.text
        assert response.json()["detail"] == "body too large (1000000 bytes > 4096)"
        assert response.headers["connection"] == "close"
        assert not body.started  # refused from the header, before taking a slot
        assert await stored(await db()) == (0, 0)


async def test_a_streamed_body_over_the_limit_is_413_and_leaves_nothing(make_settings, db) -> None:
    settings = make_settings(api_max_job_bytes=4096)
    gen = Generator.create(61)

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: chunked encoding
        for _ in range(10):
            yield lines(gen, 5)

    async with api_client(settings) as (client, _):
        response = await client.post(JOBS, content=chunked(), headers=NDJSON)
        assert response.status_code == 413, response.text
        assert response.json()["detail"] == "body too large (more than 4096 bytes)"
        conn = await db()
        assert await stored(conn) == (0, 0)
        assert await staging_tables(conn) == 0  # staged lines dropped, not left behind


@pytest.mark.parametrize("headers", [NDJSON, CSV], ids=["ndjson", "csv"])
async def test_blank_lines_count_toward_the_line_limit(make_settings, db, headers) -> None:
    """One valid line and three blank ones: four lines, over a limit of three."""
    settings = make_settings()
    one = Generator.create(62).credit_annotation()
    if headers is CSV:
        rows = [CSV_COLUMNS, [str(one[name]) for name in CSV_COLUMNS]]
        body = "".join(",".join(row) + "\n" for row in rows).encode() + b"\n" * 3
    else:
        body = ndjson([one]) + b"\n" * 3
    async with api_client(settings, max_job_lines=3) as (client, _):
        response = await client.post(JOBS, content=body, headers=headers)
        assert response.status_code == 413, response.text
        assert response.json()["detail"] == "a job has at most 3 lines"
        assert await stored(await db()) == (0, 0)


async def test_blank_filler_is_refused_not_accepted_as_a_tiny_job(make_settings, db) -> None:
    """The reported attack: a valid line and megabytes of blank filler (here 1.2 MB, past the
    default one million lines)."""
    settings = make_settings()
    body = lines(Generator.create(63), 1) + b"\n" * 1_200_000
    async with api_client(settings) as (client, _):
        response = await client.post(JOBS, content=body, headers=NDJSON)
        assert response.status_code == 413, response.text
        assert response.json()["detail"] == "a job has at most 1000000 lines"
        assert await stored(await db()) == (0, 0)


# -- time and slots ----------------------------------------------------------------------------


async def test_stalled_uploads_get_408_and_free_their_slots_and_connections(
    make_settings, db
) -> None:
    """Two slots (pool of 4): two stalled clients fill them, a third upload is turned away, a
    single transaction still works. Both stalled clients get 408; then two new uploads hold
    both slots again and a transaction still finds a connection, so none was leaked."""
    settings = make_settings(api_body_timeout_s=1.0)
    gen = Generator.create(64)
    async with api_client(settings, pool_max_size=4) as (client, _):
        stalled = [StallingBody(lines(gen, 3)) for _ in range(2)]
        tasks = [
            asyncio.create_task(client.post(JOBS, content=body, headers=NDJSON)) for body in stalled
        ]
        for body in stalled:
            await asyncio.wait_for(body.asked.wait(), 30)
        busy = await client.post(JOBS, content=lines(gen, 1), headers=NDJSON)
        assert busy.status_code == 503  # the slot bound holds
        assert (await client.post("/v1/transactions", json=gen.transaction())).status_code == 202

        for response in await asyncio.wait_for(asyncio.gather(*tasks), 30):
            assert response.status_code == 408, response.text
            assert response.json()["detail"] == (
                "request body timeout: nothing received for 1 s; send the body without pauses"
            )
            assert response.headers["connection"] == "close"

        held = [StallingBody(lines(gen, 2), lines(gen, 2)) for _ in range(2)]
        tasks = [
            asyncio.create_task(client.post(JOBS, content=body, headers=NDJSON)) for body in held
        ]
        for body in held:
            await asyncio.wait_for(body.asked.wait(), 30)
        tx = await client.post("/v1/transactions", json=gen.transaction())
        assert tx.status_code == 202, tx.text  # a connection was free: none leaked
        for body in held:
            body.release.set()
        for response in await asyncio.gather(*tasks):
            assert response.status_code == 202, response.text
            assert response.json()["accepted"] == 4
    conn = await db()
    assert await stored(conn) == (2, 10)  # the two stalled uploads left nothing
    assert await staging_tables(conn) == 0


async def test_a_drip_fed_upload_gets_408_at_the_upload_deadline(make_settings, db) -> None:
    """A client that never pauses long but never finishes either (slowloris)."""
    settings = make_settings(api_body_timeout_s=30, api_upload_timeout_s=1.0)
    gen = Generator.create(65)

    async def drip() -> AsyncIterator[bytes]:
        while True:
            yield lines(gen, 1)
            await asyncio.sleep(0.05)  # the client's pace, not a wait in the test

    async with api_client(settings) as (client, _):
        response = await asyncio.wait_for(client.post(JOBS, content=drip(), headers=NDJSON), 30)
        assert response.status_code == 408, response.text
        assert response.json()["detail"] == (
            "request body timeout: the body was not complete within 1 s"
        )
        assert await stored(await db()) == (0, 0)


async def test_no_transaction_is_open_while_an_upload_waits_for_its_client(
    make_settings, db, monkeypatch
) -> None:
    """Lines already written to the database, the client paused: no session of the database is
    inside a transaction (none holds back vacuum), nothing is visible yet, and once the body
    is complete the job and all its outbox rows appear together."""
    monkeypatch.setattr(jobs_module, "COPY_BATCH_ROWS", 5)
    settings = make_settings()
    gen = Generator.create(66)
    body = StallingBody(lines(gen, 20), lines(gen, 7))
    async with api_client(settings) as (client, _):
        task = asyncio.create_task(client.post(JOBS, content=body, headers=NDJSON))
        await asyncio.wait_for(body.asked.wait(), 30)
        conn = await db()

        async def written_and_no_transaction_open() -> bool:
            row = await conn.fetchrow(
                "SELECT count(*) FILTER (WHERE xact_start IS NOT NULL) AS open,"
                "       count(*) FILTER (WHERE query LIKE 'COPY %') AS copied"
                " FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                "   AND backend_type = 'client backend'"
            )
            return bool(row["copied"] >= 1 and row["open"] == 0)

        await wait_for(written_and_no_transaction_open, timeout=10)
        assert await stored(conn) == (0, 0)  # the relay sees nothing of a partial job
        body.release.set()
        response = await asyncio.wait_for(task, 30)
        assert response.status_code == 202, response.text
        assert response.json()["accepted"] == 27
        assert await stored(conn) == (1, 27)
        ids = await conn.fetch("SELECT job_id::text FROM outbox")
        assert {r["job_id"] for r in ids} == {response.json()["id"]}


async def test_a_database_session_lost_mid_upload_is_503_and_leaves_nothing(
    make_settings, db, monkeypatch
) -> None:
    """The upload's session is terminated after lines were staged: the staged lines die with
    it, the client gets 503, and the next upload works on a fresh connection.

    The server drops a terminated session's temporary table on the backend's way out, which
    may end after pg_terminate_backend returns (it only signals). Here that drop is held at a
    lock, as a busy machine may hold it, and the count waits until the backend is gone. The
    lock is let go before the upload goes on: a COPY sent to a backend stuck in its exit
    waits for the pool's command timeout, not for the FATAL, and the 503 with it."""
    monkeypatch.setattr(jobs_module, "COPY_BATCH_ROWS", 5)
    settings = make_settings()
    gen = Generator.create(68)
    body = StallingBody(lines(gen, 10), lines(gen, 10))
    async with api_client(settings) as (client, _):
        task = asyncio.create_task(client.post(JOBS, content=body, headers=NDJSON))
        await asyncio.wait_for(body.asked.wait(), 30)
        conn = await db()
        copied = (
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND query LIKE 'COPY %' || $1 || '%' AND state = 'idle'"
        )
        await wait_for(lambda: _fetchval(conn, copied, STAGING_TABLE), timeout=10)
        pid = await conn.fetchval(copied, STAGING_TABLE)
        holder = await db()
        await hold_staging_table(holder)
        assert await conn.fetchval("SELECT pg_terminate_backend($1)", pid)
        await wait_for_blocked_by(conn, await backend_pid(holder))  # its exit waits for us
        assert await staging_tables(conn) == 1  # terminated, and its table still there
        await holder.execute("ROLLBACK")
        await wait_for_backends_gone(conn, [pid])
        assert await staging_tables(conn) == 0
        body.release.set()
        response = await asyncio.wait_for(task, 30)
        assert response.status_code == 503, response.text
        assert response.headers["retry-after"] == "1"
        assert await stored(conn) == (0, 0)
        assert await staging_tables(conn) == 0
        again = await client.post(JOBS, content=lines(gen, 3), headers=NDJSON)
        assert again.status_code == 202, again.text
        assert await stored(conn) == (1, 3)


async def hold_staging_table(conn: Any) -> None:
    """Lock the (one) staging table in a transaction on ``conn``: its session's drop of it,
    even the drop when that session ends, waits until the transaction ends."""
    schema = await conn.fetchval(
        "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relname = $1 AND c.relpersistence = 't'",
        STAGING_TABLE,
    )
    await conn.execute("BEGIN")
    await conn.execute(f"LOCK TABLE {schema}.{STAGING_TABLE} IN ACCESS SHARE MODE")


async def _fetchval(conn: Any, query: str, *args: Any) -> bool:
    return bool(await conn.fetchval(query, *args))


# -- a real uvicorn process ----------------------------------------------------------------------


async def test_real_api_process_408s_a_stalled_socket_and_a_killed_upload_leaves_nothing(
    make_settings, db, tmp_path: Path
) -> None:
    port = free_port()
    settings = make_settings(api_port=port, api_body_timeout_s=1.0)
    gen = Generator.create(67)
    log_path = tmp_path / "api.log"
    key = await provision_key(settings.database_url)
    async with running_api(settings, log_path) as proc:

        async def start_upload(part: bytes) -> tuple[Any, Any]:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                f"POST {JOBS} HTTP/1.1\r\nHost: api\r\nContent-Type: application/x-ndjson\r\n"
                f"Authorization: Bearer {key}\r\n"
                f"Content-Length: {len(part) * 10}\r\n\r\n".encode()
                + part
            )
            await writer.drain()
            return reader, writer

        # A client that stops sending: 408, and the server closes the connection.
        reader, writer = await start_upload(lines(gen, 10))
        answer = await asyncio.wait_for(reader.read(), 30)  # until the server closes
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"request body timeout" in answer

        # The API killed while lines are staged: PostgreSQL ends its sessions, and with
        # them the staging table; no job and no outbox row were ever visible.
        reader, writer = await start_upload(lines(gen, 6000))  # past one COPY batch
        conn = await db()

        async def staged() -> bool:
            return bool(
                await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND query LIKE 'COPY %' || $1 || '%'",
                    STAGING_TABLE,
                )
            )

        await wait_for(staged, timeout=30)
        assert await staging_tables(conn) == 1
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 30)
        writer.close()

        async def cleaned_up() -> bool:
            return await staging_tables(conn) == 0

        await wait_for(cleaned_up, timeout=30)
        assert await stored(conn) == (0, 0)
