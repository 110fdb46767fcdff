"""An error nobody classified (a driver bug, a protocol desync) counts as an outage: retried,
never judged, never left holding the batch's deliveries unacked."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from bulk_recorder.recorder.writer import PgWriter
from bulk_recorder.records import Record
from consumer.tools.generator import Generator
from tests.conftest import wait_for
from tests.faults.audit import audit_run, report_for

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


async def test_unclassified_writer_error_releases_the_batch(
    make_settings, start_recorder, broker, db, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = 3
    original = PgWriter._write_transactions

    async def flaky(self: PgWriter, conn: Any, records: list[Record], result: Any) -> None:
        nonlocal failures
        if failures:
            failures -= 1
            # an asyncpg error that is neither a PostgresError nor an InterfaceError
            raise asyncpg.exceptions.InternalClientError("unexpected message while idle")
        await original(self, conn, records, result)

    monkeypatch.setattr(PgWriter, "_write_transactions", flaky)
    gen = Generator.create(seed=91)
    messages = [(json.dumps(gen.transaction()).encode(), "transaction") for _ in range(200)]
    rec = await start_recorder(make_settings(bulk_recorder_size=50))
    await broker.publish_many(messages)
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == len(messages))
    await rec.shutdown()
    report, expected = report_for(messages)
    audit = await audit_run(await db(), broker, report, faults=3, expected_dlq=expected)
    audit.assert_exact(dlq_surplus_allowed=False)
    assert rec.value("bulk_recorder_db_retries_total") == 3  # treated as an outage: retried
    assert rec.value("bulk_recorder_messages_rejected_total") == 0
