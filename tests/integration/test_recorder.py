"""The recorder against real RabbitMQ and PostgreSQL: flush triggers, duplicates, dead letters,
per-message mode, ack-after-commit, shutdown flush, metrics and health endpoints."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest

import consumer.app
import consumer.delivery
from bulk_recorder.recorder.flusher import Delivery
from consumer.delivery import ERROR_HEADER, AmqpDelivery
from consumer.tools.generator import Generator
from tests.conftest import Broker, RunningRecorder, wait_for
from tests.faults.audit import settled_count
from tests.integration.producer_support import balances, expected_balances

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

CONTRACT_METRICS = [
    "bulk_recorder_messages_received_total",
    "bulk_recorder_messages_acked_total",
    "bulk_recorder_messages_dead_lettered_total",
    "bulk_recorder_rows_attempted_total",
    "bulk_recorder_rows_inserted_total",
    "bulk_recorder_rows_ignored_total",
    "bulk_recorder_flushes_total",
    "bulk_recorder_flush_size",
    "bulk_recorder_flush_duration_seconds",
    "bulk_recorder_fallback_total",
    "bulk_recorder_buffer_messages",
    "bulk_recorder_db_retries_total",
    "bulk_recorder_paused",
]


def body(record: dict[str, Any]) -> bytes:
    return json.dumps(record).encode()


async def count(conn: asyncpg.Connection, table: str) -> int:
    return int(await conn.fetchval(f"SELECT count(*) FROM {table}"))


@pytest.mark.ledger_layouts
async def test_size_flush_records_every_message(make_settings, start_recorder, broker, db) -> None:
    gen = Generator.create(seed=1)
    settings = make_settings(bulk_recorder_size=10, bulk_recorder_flush_timeout_ms=60_000)
    rec = await start_recorder(settings)
    txs = [gen.transaction() for _ in range(30)]
    await broker.publish_many([(body(t), "transaction") for t in txs])
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 30)
    assert rec.value("bulk_recorder_flushes_total", reason="size") == 3
    assert rec.value("bulk_recorder_flushes_total", reason="timeout") == 0
    conn = await db()
    ids = {str(r[0]) for r in await conn.fetch("SELECT id FROM transactions")}
    assert ids == {t["id"] for t in txs}
    assert await count(conn, "operations") == 60
    assert rec.value("bulk_recorder_rows_inserted_total", table="transactions") == 30


async def test_timeout_flush_writes_a_partial_batch(
    make_settings, start_recorder, broker, db
) -> None:
    gen = Generator.create(seed=2)
    settings = make_settings(bulk_recorder_size=1000, bulk_recorder_flush_timeout_ms=100)
    rec = await start_recorder(settings)
    anns = [gen.credit_annotation() for _ in range(7)]
    await broker.publish_many([(body(a), "credit_annotation") for a in anns])
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 7, timeout=10)
    assert rec.value("bulk_recorder_flushes_total", reason="timeout") >= 1
    assert rec.value("bulk_recorder_flushes_total", reason="size") == 0
    conn = await db()
    assert await count(conn, "credit_annotations") == 7


@pytest.mark.ledger_layouts
async def test_duplicates_give_one_row_and_count_as_ignored(
    make_settings, start_recorder, broker, db
) -> None:
    gen = Generator.create(seed=3)
    rec = await start_recorder(
        make_settings(bulk_recorder_size=5, bulk_recorder_flush_timeout_ms=50)
    )
    tx = gen.transaction()
    ann = gen.credit_annotation()
    messages = [(body(tx), "transaction")] * 4 + [(body(ann), "credit_annotation")] * 3
    await broker.publish_many(messages)
    await wait_for(lambda: _acked_judging_nothing(rec, 7))
    conn = await db()
    assert await count(conn, "transactions") == 1
    assert await count(conn, "operations") == 2
    assert await count(conn, "credit_annotations") == 1
    assert rec.value("bulk_recorder_rows_ignored_total", table="transactions") == 3
    assert rec.value("bulk_recorder_rows_ignored_total", table="credit_annotations") == 2
    # the balance moved once, not four times
    amount = await conn.fetchval(
        "SELECT available FROM balances WHERE account_id = $1",
        tx["operations"][1]["account_id"],
    )
    assert str(amount.normalize()) == str(type(amount)(tx["amount"]).normalize())


@pytest.mark.ledger_layouts
async def test_a_duplicate_in_a_later_flush_changes_nothing(
    make_settings, start_recorder, broker, db
) -> None:
    """A record committed and acked, then its copy arrives in a later flush (a republish, or a
    redelivery after a lost ack) beside new records: no second row, operation or balance move
    for the copy; the copy is acked and counted as ignored, the new records are written."""
    gen = Generator.create(seed=10)
    rec = await start_recorder(
        make_settings(bulk_recorder_size=5, bulk_recorder_flush_timeout_ms=50)
    )
    tx, ann = gen.transaction(), gen.credit_annotation()
    assert tx["status"] == "APPROVED"  # it moves balances
    copies = [(body(tx), "transaction"), (body(ann), "credit_annotation")]
    await broker.publish_many(copies)
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 2)
    conn = await db()
    recorded = [tx]
    for _ in range(2):  # each round is written by a flush of its own
        fresh = gen.transaction()
        recorded.append(fresh)
        expected_acks = rec.value("bulk_recorder_messages_acked_total") + 3
        flushes = rec.value("bulk_recorder_flush_size_count")
        await broker.publish_many([*copies, (body(fresh), "transaction")])
        await wait_for(lambda: _acked_judging_nothing(rec, expected_acks))  # noqa: B023
        assert rec.value("bulk_recorder_flush_size_count") > flushes
        assert await balances(conn) == expected_balances(recorded)
    assert await count(conn, "transactions") == 3
    assert await count(conn, "operations") == 6
    assert await count(conn, "credit_annotations") == 1
    assert rec.value("bulk_recorder_rows_ignored_total", table="transactions") == 2
    assert rec.value("bulk_recorder_rows_ignored_total", table="credit_annotations") == 2


def _acked_judging_nothing(rec: RunningRecorder, acked: float) -> bool:
    """All acked yet? Fails at once if a valid record was refused meanwhile."""
    assert rec.value("bulk_recorder_messages_rejected_total") == 0, "a valid record refused"
    assert rec.value("bulk_recorder_fallback_total") == 0, "a valid batch split as bad data"
    return rec.value("bulk_recorder_messages_acked_total") == acked


@pytest.mark.ledger_layouts
async def test_invalid_messages_reach_the_dlq_while_batch_mates_are_recorded(
    make_settings, start_recorder, broker: Broker, db
) -> None:
    gen = Generator.create(seed=4)
    rec = await start_recorder(
        make_settings(bulk_recorder_size=20, bulk_recorder_flush_timeout_ms=50)
    )
    good = [gen.transaction() for _ in range(10)]
    bad_cpf = {**gen.credit_annotation(), "document": "529.982.247-26"}
    unbalanced = gen.transaction()
    unbalanced["operations"][0]["amount"] = "1.00"
    invalid: list[tuple[bytes, str | None, str]] = [
        (b"{oops", "transaction", "invalid JSON"),
        (body(bad_cpf), "credit_annotation", "CPF"),
        (body(unbalanced), "transaction", "debits"),
        (body(gen.transaction()), "refund", "unknown type"),
    ]
    messages: list[tuple[bytes, str | None]] = [(body(t), "transaction") for t in good[:5]]
    messages += [(b, t) for b, t, _ in invalid]
    messages += [(body(t), "transaction") for t in good[5:]]
    await broker.publish_many(messages)
    await wait_for(
        lambda: (
            rec.value("bulk_recorder_messages_acked_total") == 10
            and sum(
                rec.value("bulk_recorder_messages_dead_lettered_total", reason=r)
                for r in ("decode", "type", "validation")
            )
            == 4
        )
    )
    conn = await db()
    ids = {str(r[0]) for r in await conn.fetch("SELECT id FROM transactions")}
    assert ids == {t["id"] for t in good}
    dead = await broker.drain(broker.topology.dead_letter_queue)
    assert len(dead) == 4
    reasons = sorted(str(m.headers[ERROR_HEADER]) for m in dead)
    for _, _, expected in invalid:
        assert any(expected in r for r in reasons), (expected, reasons)
    bodies = {m.body for m in dead}
    assert bodies == {b for b, _, _ in invalid}  # the original body, untouched


async def _snapshot(conn: asyncpg.Connection) -> dict[str, list[tuple[Any, ...]]]:
    return {
        "transactions": [
            tuple(r)
            for r in await conn.fetch(
                "SELECT id, organization_id, ledger_id, description, status, asset_code, amount,"
                " created_at, metadata FROM transactions ORDER BY id"
            )
        ],
        "operations": [
            tuple(r)
            for r in await conn.fetch(
                "SELECT id, transaction_id, account_id, type, amount, asset_code FROM operations"
                " ORDER BY id"
            )
        ],
        "credit_annotations": [
            tuple(r)
            for r in await conn.fetch(
                "SELECT id, job_id, document, document_type, kind, creditor, amount, occurred_on,"
                " reason FROM credit_annotations ORDER BY id"
            )
        ],
        "balances": [
            tuple(r)
            for r in await conn.fetch(
                "SELECT account_id, asset_code, available FROM balances ORDER BY 1, 2"
            )
        ],
    }


@pytest.mark.ledger_layouts
async def test_per_message_mode_gives_identical_tables_and_metrics(
    make_settings, start_recorder, broker, db
) -> None:
    gen = Generator.create(seed=5)
    records = [gen.transaction() for _ in range(40)] + [gen.credit_annotation() for _ in range(40)]
    messages = [
        (body(r), "transaction" if "operations" in r else "credit_annotation") for r in records
    ]
    messages += messages[:10]  # duplicates
    messages.append((b"not json", "transaction"))
    snapshots = []
    values = []
    for enabled in (False, True):
        settings = make_settings(bulk_recorder_enabled=enabled, bulk_recorder_flush_timeout_ms=50)
        rec = await start_recorder(settings)
        await broker.publish_many(messages)
        await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 90)  # noqa: B023
        await wait_for(
            lambda: (
                rec.value("bulk_recorder_messages_dead_lettered_total", reason="decode")  # noqa: B023
                == 1
            )
        )
        await rec.shutdown()
        conn = await db()
        snapshots.append(await _snapshot(conn))
        values.append(
            {
                name: rec.value(name, table=t)
                for name in (
                    "bulk_recorder_rows_inserted_total",
                    "bulk_recorder_rows_ignored_total",
                )
                for t in ("transactions", "credit_annotations")
            }
        )
        if not enabled:
            assert rec.value("bulk_recorder_flush_size_sum") == rec.value(
                "bulk_recorder_flush_size_count"
            )  # one message a flush
            await conn.execute(
                "TRUNCATE operations, balances, credit_annotations, transactions CASCADE"
            )
        await broker.drain(broker.topology.dead_letter_queue)
    per_message, bulk = snapshots
    assert len(bulk["transactions"]) == 40
    assert len(bulk["credit_annotations"]) == 40
    # created_at/metadata come from the message, so the rows are identical, not just as many
    assert per_message == bulk
    assert values[0] == values[1]


@pytest.mark.ledger_layouts
async def test_no_delivery_is_acked_before_its_row_is_committed(
    make_settings, start_recorder, broker, db, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = Generator.create(seed=6)
    settings = make_settings(bulk_recorder_size=25, bulk_recorder_flush_timeout_ms=50)
    await _migrated(settings.database_url)
    checker = await db()
    violations: list[str] = []
    checked: list[str] = []
    lock = asyncio.Lock()

    async def check(delivery: AmqpDelivery) -> None:
        record_id = json.loads(delivery._message.body)["id"]
        async with lock:  # a separate connection: sees only committed rows
            visible = await checker.fetchval(
                "SELECT count(*) FROM credit_annotations WHERE id = $1", record_id
            )
        checked.append(record_id)
        if visible != 1:
            violations.append(record_id)

    # Guard both ack paths: the batched one the recorder uses and the single one.
    original_ack, original_ack_each = AmqpDelivery.ack, consumer.delivery.ack_each

    async def checking_ack(self: AmqpDelivery) -> bool:
        await check(self)
        return await original_ack(self)

    async def checking_ack_each(deliveries: Sequence[Delivery]) -> int:
        for delivery in deliveries:
            assert isinstance(delivery, AmqpDelivery)
            await check(delivery)
        return await original_ack_each(deliveries)

    monkeypatch.setattr(AmqpDelivery, "ack", checking_ack)
    monkeypatch.setattr(consumer.app, "ack_each", checking_ack_each)
    rec = await start_recorder(settings)
    anns = [gen.credit_annotation() for _ in range(120)]
    await broker.publish_many([(body(a), "credit_annotation") for a in anns])
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 120)
    assert len(checked) == 120
    assert violations == []


async def _migrated(dsn: str) -> None:
    from bulk_recorder.infra.migrate import migrate

    await migrate(dsn)


@pytest.mark.ledger_layouts
async def test_shutdown_flushes_the_partial_batch_and_acks_it(
    make_settings, start_recorder, broker, db
) -> None:
    gen = Generator.create(seed=7)
    settings = make_settings(bulk_recorder_size=1000, bulk_recorder_flush_timeout_ms=600_000)
    rec = await start_recorder(settings)
    anns = [gen.credit_annotation() for _ in range(5)]
    await broker.publish_many([(body(a), "credit_annotation") for a in anns])
    await wait_for(lambda: rec.value("bulk_recorder_messages_received_total") == 5)
    assert rec.value("bulk_recorder_buffer_messages") == 5
    await rec.shutdown()
    assert rec.value("bulk_recorder_flushes_total", reason="shutdown") == 1
    assert rec.value("bulk_recorder_messages_acked_total") == 5
    conn = await db()
    assert await count(conn, "credit_annotations") == 5
    assert await settled_count(broker, broker.topology.queue) == 0  # nothing held unacked


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _http_get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, payload = raw.decode().partition("\r\n\r\n")
    return int(head.split(" ")[1]), payload


async def test_metrics_and_health_endpoints(make_settings, start_recorder, broker) -> None:
    port = _free_port()
    rec = await start_recorder(make_settings(metrics_port=port))
    await broker.publish(body(Generator.create(seed=8).transaction()), "transaction")
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 1)
    status, text = await _http_get(port, "/metrics")
    assert status == 200
    for name in CONTRACT_METRICS:
        assert name in text, name
    assert "bulk_recorder_messages_acked_total 1.0" in text
    assert await _http_get(port, "/healthz") == (200, "ok\n")
    status, text = await _http_get(port, "/readyz")
    assert (status, text) == (200, "broker up, database up\n")
    assert (await _http_get(port, "/nope"))[0] == 404


async def test_metadata_numbers_reach_jsonb_exactly(
    make_settings, start_recorder, broker, db
) -> None:
    tx = Generator.create(seed=9).transaction()
    tx["metadata"] = {"__exact__": 1}
    raw = body(tx).replace(b'{"__exact__": 1}', b'{"rate": 0.30000000000000000001, "big": 1e400}')
    rec = await start_recorder(make_settings(bulk_recorder_flush_timeout_ms=20))
    await broker.publish(raw, "transaction")
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 1)
    conn = await db()
    row = await conn.fetchrow(
        "SELECT metadata->>'rate' AS rate, metadata->>'big' AS big FROM transactions WHERE id = $1",
        tx["id"],
    )
    assert row["rate"] == "0.30000000000000000001"
    assert row["big"] == "1" + "0" * 400
