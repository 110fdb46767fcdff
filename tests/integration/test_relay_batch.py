"""What the relay publishes, against the real PostgreSQL and RabbitMQ: every row the API accepts
goes out, whatever its size, and no row left behind (parked) holds up the rows after it.

Issue 18, item 2: a valid transaction larger than one AMQP frame (``frame_max``, 128 KiB on
RabbitMQ 3.10) was refused by the batched publish; the relay took that for a lost confirm (an
outage), republished its batch on every round and deleted nothing, and the claim window, which
starts at that row, kept every row behind it waiting.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import aio_pika
import pytest

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer.outbox import enqueue, notify
from bulk_recorder.producer.relay import RelayConfig
from bulk_recorder.producer.relay_claim import CLAIM_WINDOW
from consumer.tools.generator import Generator
from tests.conftest import Broker, Services, wait_for
from tests.integration.producer_support import api_client, running_relay

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

PAIRS = 480  # operation pairs of the large transaction of the report
METADATA_BYTES = 60_000


def large_transaction(gen: Generator) -> dict[str, Any]:
    """A valid transaction of about 200 KB: 480 debit/credit pairs and 60 KB of metadata."""
    tx = gen.transaction()
    debit, credit = tx["operations"][0]["account_id"], tx["operations"][1]["account_id"]
    tx["operations"] = [
        {
            "id": str(uuid.uuid4()),
            "account_id": account,
            "type": kind,
            "amount": "1.00",
            "asset_code": tx["asset_code"],
        }
        for _ in range(PAIRS)
        for account, kind in ((debit, "DEBIT"), (credit, "CREDIT"))
    ]
    tx["amount"] = f"{PAIRS}.00"
    tx["metadata"] = {"note": "m" * METADATA_BYTES}
    return tx


async def frame_max(url: str) -> int:
    """The frame_max this broker negotiates with a client that asks for nothing."""
    connection = await aio_pika.connect(url)
    try:
        channel = await (await connection.channel()).get_underlay_channel()
        return int(channel.connection.connection_tune.frame_max)
    finally:
        await connection.close()


async def _outbox_bodies(conn) -> list[bytes]:
    return [bytes(r["body"]) for r in await conn.fetch("SELECT body FROM outbox ORDER BY id")]


async def _outbox_empty(conn) -> bool:
    return int(await conn.fetchval("SELECT count(*) FROM outbox")) == 0


async def test_a_transaction_larger_than_a_frame_is_published_and_holds_up_nothing(
    make_settings, services: Services, broker: Broker, db
) -> None:
    settings = make_settings()
    gen = Generator.create(181)
    large = large_transaction(gen)
    ordinary = [gen.transaction() for _ in range(300)]
    limit = await frame_max(services.rabbitmq_url)
    assert len(json.dumps(large)) > limit  # 131,072 on RabbitMQ 3.10's defaults

    async with api_client(settings) as (client, _):
        for tx in [large, *ordinary]:
            response = await client.post("/v1/transactions", json=tx)
            assert response.status_code == 202, response.text
    conn = await db()
    sent = await _outbox_bodies(conn)
    assert len(sent) == 301
    assert len(sent[0]) > limit  # the large row comes first: the claim window starts there

    async with running_relay(settings) as relay:  # batches of 200: it shares one with 199
        await wait_for(lambda: _outbox_empty(conn), timeout=60)
        assert relay.value("bulk_recorder_outbox_publish_failures_total", reason="lost") == 0

    delivered = [bytes(m.body) for m in await broker.drain(broker.topology.queue)]
    assert sorted(delivered) == sorted(sent)  # each once, byte for byte
    assert json.loads(sent[0]) == large


async def test_a_parked_row_far_below_the_rest_holds_up_nothing(
    make_settings, database_url: str, broker: Broker, db
) -> None:
    """The claim reads a window of ids from the first row it may publish: a parked row, more
    than a window of ids below the rest, must not be where that window starts."""
    settings = make_settings()
    await migrate(database_url)
    conn = await db()
    config = RelayConfig(batch_size=10, lanes=1, poll_interval_s=0.2)
    window = CLAIM_WINDOW * config.batch_size * config.lanes
    gen = Generator.create(182)
    parked = gen.transaction()
    parked_id = await enqueue(conn, "transaction", parked["id"], json.dumps(parked).encode())
    # Parked as the relay parks a row refused max_attempts times (its retry time long past).
    await conn.execute(
        "UPDATE outbox SET attempts = 10, parked_at = now(), available_at = '-infinity',"
        " last_error = 'returned: 312 NO_ROUTE' WHERE id = $1",
        parked_id,
    )
    # The rows published since, deleted, leave a gap of ids wider than the window.
    await conn.execute(
        "SELECT setval(pg_get_serial_sequence('outbox', 'id'), $1)", parked_id + 10 * window
    )
    records = [gen.transaction() for _ in range(3 * config.batch_size)]
    async with conn.transaction():
        for record in records:
            await enqueue(conn, "transaction", record["id"], json.dumps(record).encode())
        await notify(conn)

    async with running_relay(settings, config):

        async def only_the_parked_row_left() -> bool:
            ids = [r["id"] for r in await conn.fetch("SELECT id FROM outbox")]
            return ids == [parked_id]

        await wait_for(only_the_parked_row_left, timeout=30)

    delivered = {json.loads(m.body)["id"] for m in await broker.drain(broker.topology.queue)}
    assert delivered == {r["id"] for r in records}
