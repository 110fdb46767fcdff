"""SIGKILL the real recorder process again and again while records flow: nothing lost or doubled."""

from __future__ import annotations

import asyncio
import random

import pytest

from consumer.tools.loadgen import LoadSpec, publish_load
from tests.faults.audit import audit_run, row_counts, wait_for_rows, wait_until_settled
from tests.faults.conftest import long_run, scale

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.slow]


@long_run
async def test_sigkill_at_random_moments_then_restart(
    make_settings, recorders, broker, db, services
) -> None:
    settings = make_settings()
    kills = scale(4, 12)
    spec = LoadSpec("mixed", scale(20_000, 150_000), duplicates=0.05, invalid=0.01, seed=11)
    rng = random.Random(11)
    proc = await recorders.start(settings)
    publisher = asyncio.create_task(
        publish_load(services.rabbitmq_url, settings.rabbitmq_exchange, spec)
    )
    conn = await db_when_migrated(db)
    step = spec.count // (kills + 2)
    for _ in range(kills):
        # Kill only once this incarnation has made progress, so every kill lands mid-stream.
        await wait_for_rows(conn, await row_counts(conn) + rng.randint(step // 2, step))
        await asyncio.sleep(rng.uniform(0, 0.2))
        await proc.kill()
        await proc.start()
    report = await publisher
    await wait_until_settled(db, broker, report)
    assert await proc.terminate() == 0
    audit = await audit_run(conn, broker, report, faults=proc.kills)
    audit.assert_exact(dlq_surplus_allowed=True)
    assert proc.kills == kills


async def db_when_migrated(db):
    """A connection to the test database once the recorder has created it."""
    while True:
        try:
            conn = await db()
            await conn.fetchval("SELECT count(*) FROM credit_annotations")
            return conn
        except Exception:
            await asyncio.sleep(0.1)
