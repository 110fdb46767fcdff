"""Issue 27 item 5: a dead letter, and its replay, keep the message's properties
(docs/messages.md, "Message properties"). A real recorder dead-letters a message published with
every property; the DLQ copy and the replayed message are read from the broker."""

from __future__ import annotations

import datetime
import io

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage

from consumer.copy_properties import (
    ORIGINAL_DELIVERY_MODE_HEADER,
    ORIGINAL_EXPIRATION_HEADER,
    ORIGINAL_USER_ID_HEADER,
)
from consumer.tools.dlq import replay_dlq
from tests.conftest import Broker, wait_for

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

WHEN = datetime.datetime(2026, 12, 2, 6, 0, tzinfo=datetime.UTC)
# kept as they are on the dead letter and on the replay
KEPT = {
    "content_type": "application/json; charset=utf-8",
    "content_encoding": "utf-8",
    "type": "transaction",
    "message_id": "m-27-5",
    "correlation_id": "c-27-5",
    "reply_to": "answers.27",
    "priority": 7,
    "app_id": "issue-27",
}


def published() -> aio_pika.Message:
    return aio_pika.Message(
        b"{not json",
        headers={"app-header": "kept"},
        delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT,
        expiration=600,  # seconds: "600000" ms on the wire
        user_id="guest",  # the broker refuses any other than the connection's user
        timestamp=WHEN,
        **KEPT,  # type: ignore[arg-type]
    )


def properties_of(message: AbstractIncomingMessage) -> dict[str, object]:
    return {name: getattr(message, name) for name in KEPT}


async def test_dead_letter_and_replay_keep_the_message_properties(
    make_settings, start_recorder, broker: Broker
) -> None:
    settings = make_settings(bulk_recorder_flush_timeout_ms=50)
    rec = await start_recorder(settings)
    exchange = await broker.channel.get_exchange(settings.rabbitmq_exchange)
    await exchange.publish(published(), routing_key="transaction")
    await wait_for(
        lambda: rec.value("bulk_recorder_messages_dead_lettered_total", reason="decode") == 1
    )
    await rec.shutdown()  # nothing consumes the replayed message: it is read from the queue

    dlq = await broker.channel.declare_queue(settings.dead_letter_queue, passive=True)
    copy = await dlq.get(no_ack=False, timeout=5)
    assert properties_of(copy) == KEPT
    assert copy.timestamp == WHEN
    assert copy.headers["app-header"] == "kept"
    # a dead letter is persistent, whatever the original: the original mode is in a header
    assert copy.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert copy.headers[ORIGINAL_DELIVERY_MODE_HEADER] == 1
    # an expiration would make the dead letter expire, and the broker refuses a user_id other
    # than the recorder's own: both are kept in headers, not as properties
    assert copy.expiration is None
    assert copy.headers[ORIGINAL_EXPIRATION_HEADER] == "600000"
    assert copy.user_id is None
    assert copy.headers[ORIGINAL_USER_ID_HEADER] == "guest"
    await copy.nack(requeue=True)

    assert await replay_dlq(settings, out=io.StringIO()) == 0
    (replayed,) = await broker.drain(settings.rabbitmq_queue)
    assert replayed.body == b"{not json"
    assert properties_of(replayed) == KEPT
    assert replayed.timestamp == WHEN
    assert replayed.headers["app-header"] == "kept"
    assert replayed.delivery_mode == aio_pika.DeliveryMode.NOT_PERSISTENT  # restored
    assert ORIGINAL_DELIVERY_MODE_HEADER not in replayed.headers
    # not restored (see docs/messages.md), still told
    assert replayed.expiration is None
    assert replayed.user_id is None
    assert replayed.headers[ORIGINAL_EXPIRATION_HEADER] == "600000"
    assert replayed.headers[ORIGINAL_USER_ID_HEADER] == "guest"
