"""Rows PostgreSQL refuses are isolated: batch-mates recorded, the row rejected until its last
allowed delivery, then dead-lettered with the database's reason."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

import pytest

from consumer.delivery import ERROR_HEADER
from consumer.tools.generator import Generator
from tests.conftest import wait_for
from tests.faults.audit import DATABASE_REFUSED, settled_count

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.ledger_layouts]


def _body(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode()


async def test_refused_rows_are_isolated_retried_then_dead_lettered(
    make_settings, start_recorder, broker, db
) -> None:
    gen = Generator.create(seed=51)
    limit = 5
    settings = make_settings(
        bulk_recorder_size=40, bulk_recorder_flush_timeout_ms=300, rabbitmq_delivery_limit=limit
    )
    rec = await start_recorder(settings)
    earlier = gen.transaction()
    await broker.publish(_body(earlier), "transaction")
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 1)

    # Valid JSON, valid record, refused by PostgreSQL: its operation id belongs to `earlier`.
    stolen = gen.transaction()
    stolen["operations"][0]["id"] = earlier["operations"][0]["id"]
    # Two new transactions sharing an operation id: only the first to commit can have it.
    twin_a = gen.transaction()
    twin_b = gen.transaction()
    twin_b["operations"][1]["id"] = twin_a["operations"][1]["id"]
    good = [gen.transaction() for _ in range(30)]
    batch = [*good[:10], stolen, *good[10:20], twin_a, twin_b, *good[20:]]
    await broker.publish_many([(_body(t), "transaction") for t in batch])

    await wait_for(
        lambda: rec.value("bulk_recorder_messages_dead_lettered_total", reason="database") == 2
    )
    conn = await db()
    ids = {str(r[0]) for r in await conn.fetch("SELECT id FROM transactions")}
    assert {t["id"] for t in good} <= ids
    assert stolen["id"] not in ids
    assert len({twin_a["id"], twin_b["id"]} & ids) == 1
    assert len(ids) == 1 + len(good) + 1
    # the stolen operation still belongs to `earlier`
    owner = await conn.fetchval(
        "SELECT transaction_id::text FROM operations WHERE id = $1", earlier["operations"][0]["id"]
    )
    assert owner == earlier["id"]

    dead = await broker.drain(broker.topology.dead_letter_queue)
    recorded_twin = twin_a if twin_a["id"] in ids else twin_b
    refused_twin = twin_b if recorded_twin is twin_a else twin_a
    assert sorted(m.body for m in dead) == sorted([_body(stolen), _body(refused_twin)])
    for message in dead:
        reason = str(message.headers[ERROR_HEADER])
        assert reason.startswith(DATABASE_REFUSED + ": 23505"), reason
        # on partitioned ledger tables the partition's key: operations_p20261130_pkey
        assert re.search(r'"operations_(p[0-9]{8}_)?pkey"', reason), reason
    assert rec.value("bulk_recorder_fallback_total") > 0
    # rejected on each delivery but the broker's last (it delivers limit + 1 times), where we
    # dead-letter it with the reason (the broker would dead-letter it without one)
    assert rec.value("bulk_recorder_messages_rejected_total") == 2 * limit
    assert rec.value("bulk_recorder_messages_received_total") == 1 + len(batch) + 2 * limit
    assert rec.value("bulk_recorder_messages_acked_total") == 1 + len(good) + 1
    await rec.shutdown()
    assert await settled_count(broker, broker.topology.queue) == 0
    # balances moved once for every recorded APPROVED transaction and never for a refused one
    recorded = [earlier, recorded_twin, *good]
    expected: dict[str, Decimal] = {}
    for tx in recorded:
        for op in tx["operations"]:
            amount = Decimal(op["amount"])
            signed = amount if op["type"] == "CREDIT" else -amount
            expected[op["account_id"]] = expected.get(op["account_id"], Decimal(0)) + signed
    actual = {
        str(r[0]): r[1] for r in await conn.fetch("SELECT account_id, available FROM balances")
    }
    assert {k: v for k, v in actual.items() if v} == {k: v for k, v in expected.items() if v}
