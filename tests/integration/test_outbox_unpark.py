"""``bulk-recorder outbox unpark`` puts parked rows back, and the job counts stay right
(issue 18 item 4: nothing un-parked rows, e.g. every row parked while the queue was deleted).

The rows are parked by the relay's own settlement (``BatchSender._refuse`` with
``max_attempts=1``, as after a broker refusal), so the job's ``dead_lettered`` is what a relay
leaves. The command runs as a process; the relay and the recorder run in process.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest

from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.producer.outbox import enqueue
from bulk_recorder.producer.relay import RelayConfig
from bulk_recorder.producer.relay_batch import BatchSender
from consumer.tools.generator import Generator
from tests.conftest import REPO, settings_env, wait_for
from tests.integration.producer_support import api_client, ndjson, running_relay

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

LINES = 20
PARKED = 15  # of the job's lines; and one transaction row of no job


async def cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``bulk-recorder ARGS`` as a process, without blocking the relay and recorder meanwhile."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "consumer.cli",
        *args,
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return subprocess.CompletedProcess(args, int(proc.returncode or 0), out.decode(), err.decode())


async def parked_ids(conn: Any) -> list[int]:
    rows = await conn.fetch("SELECT id FROM outbox WHERE parked_at IS NOT NULL ORDER BY id")
    return [int(r["id"]) for r in rows]


async def test_outbox_unpark_puts_parked_rows_back_and_keeps_job_counts_right(
    make_settings, start_recorder, db, broker
) -> None:
    settings = make_settings()
    env = settings_env(settings)
    gen = Generator.create(1803)
    lines = [gen.credit_annotation() for _ in range(LINES)]
    async with api_client(settings) as (client, _):
        response = await client.post(
            "/v1/credit-annotation-jobs",
            content=ndjson(lines),
            headers={"content-type": "application/x-ndjson"},
        )
        assert response.status_code == 202, response.text
        job = response.json()
        conn = await db()
        transaction = gen.transaction()
        await enqueue(conn, "transaction", transaction["id"], json.dumps(transaction).encode())
        ids = [int(r["id"]) for r in await conn.fetch("SELECT id FROM outbox ORDER BY id")]
        to_park = ids[:PARKED] + ids[-1:]  # the transaction row is the last one
        async with conn.transaction():
            parker = BatchSender(RelayConfig(max_attempts=1), Metrics(), "unused")
            await parker._refuse(conn, to_park, ["closed the channel: test"] * len(to_park))

        async def status() -> dict[str, Any]:
            return dict((await client.get(job["status_url"])).json())

        await start_recorder(settings)
        async with running_relay(settings, RelayConfig(batch_size=5, poll_interval_s=0.2)):
            # The rest is published and recorded: the job completes with its parked rows.
            async def completed() -> bool:
                return bool((await status())["status"] == "completed")

            await wait_for(completed, timeout=60)
            first = await status()
            assert (first["published"], first["dead_lettered"]) == (LINES - PARKED, PARKED)
            assert first["recorded"] == LINES - PARKED

            dry = await cli(["outbox", "unpark", "--dry-run"], env)
            assert dry.returncode == 0, dry.stderr
            assert (
                "would put back 16 parked outbox rows (15 of 1 job(s), 1 of no job)" in dry.stdout
            )
            assert f"job {job['id']}: 15 rows" in dry.stdout
            assert "nothing changed" in dry.stdout
            assert await parked_ids(conn) == sorted(to_park)
            assert (await status())["dead_lettered"] == PARKED

            some = await cli(["outbox", "unpark", "--limit", "10"], env)
            assert some.returncode == 0, some.stderr
            assert "put back 10 parked outbox rows" in some.stdout
            job_row = await conn.fetchrow(
                "SELECT dead_lettered, completed_at, recorded FROM credit_annotation_jobs"
                " WHERE id = $1",
                job["id"],
            )
            assert tuple(job_row) == (PARKED - 10, None, None), "the job was not opened again"
            # the 10 oldest went back and were published; the job was opened again and
            # completes again with them recorded
            await wait_for(lambda: _parked_are(conn, sorted(to_park)[10:]), timeout=30)

            async def completed_with(recorded: int) -> bool:
                s = await status()
                return bool(s["status"] == "completed" and s["recorded"] == recorded)

            await wait_for(lambda: completed_with(LINES - PARKED + 10), timeout=60)
            middle = await status()
            assert (middle["published"], middle["dead_lettered"]) == (15, 5), middle

            rest = await cli(["outbox", "unpark"], env)
            assert rest.returncode == 0, rest.stderr
            assert "put back 6 parked outbox rows (5 of 1 job(s), 1 of no job)" in rest.stdout

            await wait_for(lambda: completed_with(LINES), timeout=60)
            final = await status()
            assert (final["published"], final["dead_lettered"], final["unsent"]) == (LINES, 0, 0)
            assert final["progress"] == 1.0
            assert int(await conn.fetchval("SELECT count(*) FROM outbox")) == 0
            recorded_tx = await conn.fetchval(
                "SELECT count(*) FROM transactions WHERE id = $1", transaction["id"]
            )
            assert recorded_tx == 1

        nothing = await cli(["outbox", "unpark"], env)
        assert nothing.returncode == 0, nothing.stderr
        assert "put back 0 parked outbox rows" in nothing.stdout


async def _parked_are(conn: Any, expected: list[int]) -> bool:
    if await parked_ids(conn) != expected:
        return False
    left = await conn.fetchval("SELECT count(*) FROM outbox WHERE parked_at IS NULL")
    return int(left) == 0


async def test_a_row_put_back_gets_the_full_backoff_again_not_parked_at_its_first_refusal(
    make_settings, db
) -> None:
    """docs/reference.md: unpark puts rows back with attempts 0. A row the broker refused
    ``max_attempts`` times and that is put back is retried from the first backoff step (1 s)
    and parked again only after ``max_attempts`` more refusals, as a new row would be."""
    settings = make_settings()
    assert (await cli(["migrate"], settings_env(settings))).returncode == 0
    conn = await db()
    transaction = Generator.create(1804).transaction()
    await enqueue(conn, "transaction", transaction["id"], json.dumps(transaction).encode())
    row = int(await conn.fetchval("SELECT id FROM outbox"))
    sender = BatchSender(RelayConfig(max_attempts=3), Metrics(), "unused")

    async def refused() -> tuple[int, float]:
        """Refuse the row once, as the relay's settlement does: (parked?, backoff seconds)."""
        async with conn.transaction():
            parked = await sender._refuse(conn, [row], ["closed the channel: test"])
        wait = await conn.fetchval(
            "SELECT extract(epoch FROM available_at - now()) FROM outbox WHERE id = $1", row
        )
        return parked, float(wait)

    assert [(await refused())[0] for _ in range(3)] == [0, 0, 1]
    assert await parked_ids(conn) == [row]
    back = await cli(["outbox", "unpark"], settings_env(settings))
    assert back.returncode == 0, back.stderr
    assert "put back 1 parked outbox rows" in back.stdout
    assert tuple(await conn.fetchrow("SELECT attempts, parked_at FROM outbox")) == (0, None)

    first = await refused()
    assert first[0] == 0, "parked again at its first refusal after unpark"
    assert first[1] <= 1.5, f"backoff {first[1]:.1f} s after unpark: its attempts were kept"
    assert [(await refused())[0] for _ in range(2)] == [0, 1]
