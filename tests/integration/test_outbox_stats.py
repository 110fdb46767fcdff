"""The outbox's two gauges (docs/producer.md, docs/operations.md): ``bulk_recorder_outbox_backlog``
counts the rows waiting to be published, parked ones excluded, and
``bulk_recorder_outbox_oldest_age_seconds`` is the age of the oldest of them: the alert
``OutboxOldestTooOld`` fires on it past 5 minutes."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bulk_recorder.producer.outbox import enqueue
from tests.integration.producer_support import api_client

pytestmark = [pytest.mark.postgres]


def sample(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return float(s.value)
    raise AssertionError(f"no sample {name}")


async def test_outbox_gauges_count_waiting_rows_and_the_oldest_ones_age(make_settings, db) -> None:
    settings = make_settings()
    async with api_client(settings) as (client, _):
        conn = await db()
        ages = {"old": 600, "young": 30, "parked": 3600}
        ids = {name: await enqueue(conn, "transaction", str(uuid.uuid4()), b"{}") for name in ages}
        for name, age in ages.items():
            row_id = ids[name]
            await conn.execute(
                "UPDATE outbox SET created_at = clock_timestamp() - make_interval(secs => $2)"
                " WHERE id = $1",
                row_id,
                float(age),
            )
        await conn.execute("UPDATE outbox SET parked_at = now() WHERE id = $1", ids["parked"])
        metrics = (await client.get("/metrics")).text
    assert sample(metrics, "bulk_recorder_outbox_backlog") == 2  # the parked row not counted
    # the oldest waiting row, not the newest, nor the parked one
    assert 600 <= sample(metrics, "bulk_recorder_outbox_oldest_age_seconds") < 660
