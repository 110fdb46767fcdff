"""Several `consume` processes on one queue with overlapping duplicate ids: no deadlock, no
duplicate, no lost row, even when one of them is killed and restarted."""

from __future__ import annotations

import asyncio
import random

import pytest

from bulk_recorder.infra.migrate import migrate
from consumer.tools.loadgen import LoadSpec, publish_load
from tests.faults.audit import audit_run, row_counts, wait_for_rows, wait_until_settled
from tests.faults.conftest import long_run, scale

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.slow]


@long_run
async def test_three_recorders_with_overlapping_duplicates(
    make_settings, recorders, broker, db, services, database_url
) -> None:
    await migrate(database_url)
    conn = await db()
    # Different batch sizes and timeouts so that the replicas' flushes interleave unevenly.
    procs = [
        await recorders.start(make_settings(bulk_recorder_size=size, rabbitmq_numbers_of_workers=w))
        for size, w in ((50, 5), (200, 3), (20, 8))
    ]
    # A fifth of the messages re-publish a recent id: replicas race to insert the same rows.
    spec = LoadSpec("mixed", scale(30_000, 200_000), duplicates=0.2, invalid=0.01, seed=41)
    rng = random.Random(41)
    publisher = asyncio.create_task(
        publish_load(services.rabbitmq_url, procs[0].settings.rabbitmq_exchange, spec)
    )
    await wait_for_rows(conn, spec.count // 3)
    await asyncio.sleep(rng.uniform(0, 0.2))
    await procs[1].kill()
    await procs[1].start()
    report = await publisher
    await wait_until_settled(db, broker, report)
    for proc in procs:
        assert await proc.terminate() == 0
    assert await row_counts(conn) == spec.count
    audit = await audit_run(conn, broker, report, faults=sum(p.kills for p in procs))
    audit.assert_exact(dlq_surplus_allowed=True)
    logs = "\n".join(p.log_text() for p in procs)
    # Rows sorted by id and balance keys by account: writers never wait on each other in a cycle.
    assert "deadlock" not in logs.lower()
    assert "Traceback" not in logs
