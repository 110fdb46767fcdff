"""Messages from other clients than aio-pika (issue 23 item 5): pika, and Node's amqplib with its
default properties; header tables of every field type, x-delivery-count of odd types; no
content_type; content_encoding set; a type of another case. Each message is recorded exactly
(every amount to the last digit) or dead-lettered with its reason: none dropped."""

from __future__ import annotations

import gzip
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pika
import pytest

from consumer.tools.generator import Generator, dump
from tests.conftest import Broker, wait_for
from tests.integration.clients_support import (
    Sent,
    check_exact,
    node_publish,
    node_ready,
    pika_publish,
    run_in_thread,
)

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

WIDE = "12345678901234567890.123456789012345678"  # 20 integer digits, 18 decimals
ENCODING_REASON = "body: content_encoding"

# A header table with a value of every type a client can send (pika's encodings)
PIKA_HEADERS: dict[str, Any] = {
    "small": 7,
    "int32": 70_000,
    "int64": 2**40,
    "negative": -3,
    "yes": True,
    "no": False,
    "nested": {"a": {"b": [1, "two", {"c": False}]}, "empty": {}},
    "array": [1, "x", None, [True]],
    "bytes": b"\x00\xffraw",
    "decimal": Decimal("123.4500"),
    "when": datetime(2026, 12, 1, 12, 0, tzinfo=UTC),
    "void": None,
    "text": "ação",
}  # pika encodes no float (UnsupportedAMQPFieldException): amqplib sends them below
# x-delivery-count as a publisher may set it (the broker sets it only on a redelivery)
ODD_DELIVERY_COUNTS: list[Any] = [
    "4",
    True,
    Decimal("2.5"),
    {"n": 1},
    b"\x03",
    -1,
    2**40,
    None,
    datetime(2026, 1, 1, tzinfo=UTC),
    [1, 2],
]


def wide_transaction(gen: Generator) -> dict[str, Any]:
    tx = gen.transaction()
    tx["amount"] = WIDE
    for op in tx["operations"]:
        op["amount"] = WIDE
    return tx


async def test_pika_messages_with_every_header_type_are_recorded_exactly(
    make_settings, start_recorder, broker: Broker, db
) -> None:
    gen = Generator.create(seed=2351)
    settings = make_settings(bulk_recorder_flush_timeout_ms=50)
    await start_recorder(settings)
    conn = await db()
    sent = Sent()
    messages: list[tuple[bytes, str, Any]] = []
    for n, count in enumerate(ODD_DELIVERY_COUNTS):
        record_type = "transaction" if n % 2 == 0 else "credit_annotation"
        record = wide_transaction(gen) if n % 2 == 0 else gen.credit_annotation()
        headers = {**PIKA_HEADERS, "x-delivery-count": count}
        # pika's defaults otherwise: no content_type, transient, no message_id
        properties = pika.BasicProperties(type=record_type, headers=headers)
        messages.append((dump(record), record_type, properties))
        sent.recorded.append((record_type, record))
    unbalanced = gen.transaction()
    unbalanced["operations"][1]["amount"] = "0.01"
    invalid = [
        (dump(unbalanced), "transaction", "debits"),
        (dump(gen.transaction()), "Transaction", "unknown type: Transaction"),
        (dump(gen.transaction()), "TRANSACTION", "unknown type: TRANSACTION"),
        (dump(gen.credit_annotation()), "Credit_Annotation", "unknown type: Credit_Annotation"),
        (b"{nope", "transaction", "invalid JSON"),
    ]
    for body, record_type, reason in invalid:
        headers = {**PIKA_HEADERS, "x-delivery-count": {"odd": [b"\x01"]}}
        properties = pika.BasicProperties(type=record_type, headers=headers)
        messages.append((body, record_type, properties))
        sent.dead[body] = reason
    await run_in_thread(pika_publish, settings.rabbitmq_url, settings.rabbitmq_exchange, messages)
    await check_exact(broker, conn, sent)


async def test_pika_content_encoding_and_content_type(
    make_settings, start_recorder, broker: Broker, db
) -> None:
    """content_encoding names how the body is encoded: identity or utf-8 (any case) is the
    contract's UTF-8 JSON and is recorded; any other (gzip, deflate) is dead-lettered with a
    reason naming it, whatever the body (the recorder decompresses nothing)."""
    gen = Generator.create(seed=2352)
    settings = make_settings(bulk_recorder_flush_timeout_ms=50)
    await start_recorder(settings)
    conn = await db()
    sent = Sent()
    messages: list[tuple[bytes, str, Any]] = []
    for encoding, content_type in [
        ("utf-8", None),
        ("UTF-8", "application/json; charset=utf-8"),
        ("identity", "application/json"),
        ("", "text/plain"),  # content_type is not the contract's: the body decides
        (None, "application/octet-stream"),
    ]:
        tx = wide_transaction(gen)
        properties = pika.BasicProperties(
            type="transaction", content_encoding=encoding, content_type=content_type
        )
        messages.append((dump(tx), "transaction", properties))
        sent.recorded.append(("transaction", tx))
    for encoding, body in [
        ("gzip", gzip.compress(dump(gen.transaction()))),
        ("gzip", dump(gen.transaction())),  # labelled gzip, sent plain: refused all the same
        ("deflate", dump(gen.transaction())),
        ("latin-1", dump(gen.transaction())),
    ]:
        properties = pika.BasicProperties(
            type="transaction", content_encoding=encoding, content_type="application/json"
        )
        messages.append((body, "transaction", properties))
        sent.dead[body] = f"{ENCODING_REASON} {encoding!r} is not supported"
    await run_in_thread(pika_publish, settings.rabbitmq_url, settings.rabbitmq_exchange, messages)
    await check_exact(broker, conn, sent)


def typed(kind: str, value: Any) -> dict[str, Any]:
    return {"!": kind, "value": value}


# amqplib's own notation for each field type of a header table
NODE_HEADERS: dict[str, Any] = {
    "int8": typed("int8", -8),
    "uint8": typed("uint8", 200),
    "int16": typed("int16", -30000),
    "uint16": typed("uint16", 60000),
    "int32": typed("int32", -2_000_000_000),
    "uint32": typed("uint32", 4_000_000_000),
    "int64": typed("int64", 2**52),
    "float": typed("float", 1.5),
    "double": typed("double", 0.1),
    "decimal": typed("decimal", {"places": 2, "digits": 12345}),
    "timestamp": typed("timestamp", 1_764_590_400),
    "bytes": {"!bytes": "AP9yYXc="},
    "nested": {"a": {"b": [1, "two", {"c": False}]}},
    "array": [1, "x", None, True],
    "void": None,
    "flag": True,
    "text": "ação",
}
NODE_DELIVERY_COUNTS: list[Any] = [
    typed("uint8", 3),
    typed("float", 2.5),
    typed("decimal", {"places": 1, "digits": 25}),
    typed("timestamp", 1_764_590_400),
    "three",
    {"!bytes": "Aw=="},
    typed("int64", 2**40),
]


async def test_node_amqplib_with_its_default_properties(
    make_settings, start_recorder, broker: Broker, db
) -> None:
    node_ready()
    gen = Generator.create(seed=2353)
    settings = make_settings(bulk_recorder_flush_timeout_ms=50)
    await start_recorder(settings)
    conn = await db()
    exchange = settings.rabbitmq_exchange
    sent = Sent()
    messages: list[dict[str, Any]] = []
    # only the type the contract needs; amqplib's defaults for everything else (transient,
    # no content_type, no message_id, no headers)
    for record_type in ("transaction", "credit_annotation"):
        record = wide_transaction(gen) if record_type == "transaction" else gen.credit_annotation()
        messages.append(
            {
                "exchange": exchange,
                "routingKey": record_type,
                "body": dump(record),
                "options": {"type": record_type},
            }
        )
        sent.recorded.append((record_type, record))
    for count in NODE_DELIVERY_COUNTS:
        tx = wide_transaction(gen)
        headers = {**NODE_HEADERS, "x-delivery-count": count}
        messages.append(
            {
                "exchange": exchange,
                "routingKey": "transaction",
                "body": dump(tx),
                "options": {"type": "transaction", "headers": headers, "contentEncoding": "utf-8"},
            }
        )
        sent.recorded.append(("transaction", tx))
    for body, options, reason in [
        (dump(gen.transaction()), {}, "missing type property"),
        (dump(gen.transaction()), {"type": "Transaction"}, "unknown type: Transaction"),
        (
            gzip.compress(dump(gen.transaction())),
            {"type": "transaction", "contentEncoding": "gzip", "headers": NODE_HEADERS},
            f"{ENCODING_REASON} 'gzip' is not supported",
        ),
        (b"\xff\xfe{}", {"type": "transaction", "headers": NODE_HEADERS}, "body"),
    ]:
        messages.append(
            {"exchange": exchange, "routingKey": "transaction", "body": body, "options": options}
        )
        sent.dead[body] = reason
    out = await run_in_thread(node_publish, settings.rabbitmq_url, messages)
    assert out.strip() == f"published {len(messages)}"
    await check_exact(broker, conn, sent)


async def test_refused_rows_with_an_odd_x_delivery_count_are_dead_lettered(
    make_settings, start_recorder, broker: Broker, db
) -> None:
    """A row the database refuses is dead-lettered with its reason whatever x-delivery-count
    its publisher set: a string counts as 0 (it goes the whole delivery limit), a huge number
    as its last delivery (dead-lettered at its first refusal)."""
    gen = Generator.create(seed=2354)
    settings = make_settings(bulk_recorder_flush_timeout_ms=50)
    rec = await start_recorder(settings)
    conn = await db()
    sent = Sent()
    earlier = [gen.transaction() for _ in ODD_DELIVERY_COUNTS]
    await run_in_thread(
        pika_publish,
        settings.rabbitmq_url,
        settings.rabbitmq_exchange,
        [(dump(tx), "transaction", pika.BasicProperties(type="transaction")) for tx in earlier],
    )
    sent.recorded += [("transaction", tx) for tx in earlier]
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == len(earlier))
    messages = []
    for tx, count in zip(earlier, ODD_DELIVERY_COUNTS, strict=True):
        clash = gen.transaction()
        clash["operations"][0]["id"] = tx["operations"][0]["id"]
        headers = {**PIKA_HEADERS, "x-delivery-count": count}
        properties = pika.BasicProperties(type="transaction", headers=headers)
        messages.append((dump(clash), "transaction", properties))
        sent.dead[dump(clash)] = "database refused the row: 23505"
    await run_in_thread(pika_publish, settings.rabbitmq_url, settings.rabbitmq_exchange, messages)
    await check_exact(broker, conn, sent)
