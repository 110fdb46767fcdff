"""The API's job workers (API_JOB_WORKERS processes) in a real ``bulk-recorder api`` process:
a worker killed in the middle of an upload costs the job nothing (its lines are validated on
the loop instead: the job is stored whole, never half), the next job gets fresh workers, and
the workers end with the API, on SIGTERM as on SIGKILL."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from consumer.tools.generator import Generator
from tests.conftest import free_port, wait_for
from tests.integration.producer_support import bearer, ndjson, provision_key, running_api

pytestmark = [pytest.mark.postgres]

JOBS = "/v1/credit-annotation-jobs"


def job_workers(pid: int) -> set[int]:
    """The live job workers of process ``pid``: its spawned children (not the resource
    tracker, not zombies)."""
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                children = [int(c) for c in f.read().split()]
        except FileNotFoundError:
            continue
        for child in children:
            if alive(child) and b"spawn_main" in _cmdline(child):
                found.add(child)
    return found


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its new parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


async def stored(conn: Any) -> tuple[int, int]:
    jobs = await conn.fetchval("SELECT count(*) FROM credit_annotation_jobs")
    rows = await conn.fetchval("SELECT count(*) FROM outbox")
    return int(jobs), int(rows)


async def send_job(port: int, key: str, parts: list[bytes], between: Any) -> bytes:
    """POST a job in ``parts``, awaiting ``between()`` after the first; the raw answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    size = sum(len(p) for p in parts)
    writer.write(
        f"POST {JOBS} HTTP/1.1\r\nHost: api\r\nContent-Type: application/x-ndjson\r\n"
        f"Authorization: Bearer {key}\r\nConnection: close\r\n"
        f"Content-Length: {size}\r\n\r\n".encode()
        + parts[0]
    )
    await writer.drain()
    await between()
    for part in parts[1:]:
        writer.write(part)
        await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    return answer


async def test_a_worker_killed_mid_upload_costs_the_job_nothing_and_workers_end_with_the_api(
    make_settings, db, tmp_path: Path
) -> None:
    port = free_port()
    settings = make_settings(api_port=port, api_job_workers=2)
    gen = Generator.create(91)
    key = await provision_key(settings.database_url)
    conn = await db()
    first = ndjson([gen.credit_annotation() for _ in range(3000)])
    rest = ndjson([gen.credit_annotation() for _ in range(3000)])
    async with running_api(settings, tmp_path / "api.log") as proc:
        killed: list[int] = []

        async def kill_a_worker() -> None:
            await wait_for(lambda: len(job_workers(proc.pid)) == 2, timeout=60)
            victim = min(job_workers(proc.pid))
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

        answer = await send_job(port, key, [first, rest], kill_a_worker)
        assert answer.startswith(b"HTTP/1.1 202 "), answer[:300]
        assert b'"accepted":6000' in answer
        assert b'"rejected":0' in answer
        assert await stored(conn) == (1, 6000)  # the whole job, once
        log = (tmp_path / "api.log").read_text()
        assert "a job worker process died" in log

        # the next job runs on fresh workers, the killed one among none of them
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            again = await client.post(
                JOBS,
                content=ndjson([gen.credit_annotation() for _ in range(50)]),
                headers={"content-type": "application/x-ndjson", **bearer(key)},
            )
        assert again.status_code == 202, again.text
        assert again.json()["accepted"] == 50
        assert await stored(conn) == (2, 6050)
        workers = job_workers(proc.pid)
        assert len(workers) == 2
        assert not workers & set(killed)
    # running_api sent SIGTERM and saw exit 0: the workers went with the API
    assert not any(alive(pid) for pid in workers)


async def test_job_workers_die_with_an_api_killed_by_sigkill(
    make_settings, db, tmp_path: Path
) -> None:
    port = free_port()
    settings = make_settings(api_port=port, api_job_workers=2)
    gen = Generator.create(92)
    key = await provision_key(settings.database_url)
    async with running_api(settings, tmp_path / "api.log") as proc:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            job = await client.post(
                JOBS,
                content=ndjson([gen.credit_annotation() for _ in range(20)]),
                headers={"content-type": "application/x-ndjson", **bearer(key)},
            )
        assert job.status_code == 202, job.text
        workers = job_workers(proc.pid)
        assert len(workers) == 2
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), 30)

    def gone() -> bool:
        return not any(alive(pid) for pid in workers)

    await wait_for(gone, timeout=30)
