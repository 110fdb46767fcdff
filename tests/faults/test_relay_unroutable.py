"""A deleted queue is an outage, not the rows' fault (issue 18 item 4).

The relay publishes ``mandatory`` to the main exchange, bound to the main queue with ``#``: any
routing key reaches it while the topology exists. A ``basic.return`` (312 NO_ROUTE) therefore
says the topology is missing (the queue was deleted), never that the row is bad. It used to
count as the row's refusal: after ``max_attempts`` every row of the outbox was parked and counted
in its job's ``dead_lettered``, and nothing put them back. Made for real here: the main queue is
deleted (``queue_delete``) under a running relay.
"""

from __future__ import annotations

import json
from typing import Any

import aio_pika
import pytest

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer.relay import RelayConfig
from consumer.tools.generator import Generator
from consumer.topology import declare_topology
from tests.conftest import Broker, wait_for
from tests.integration.producer_support import RunningRelay, api_client, ndjson, running_relay

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

ROWS = 30
# Parks a refused row at its second refusal, one second after the first: fast on the old code.
CONFIG = RelayConfig(batch_size=10, lanes=2, poll_interval_s=0.2, max_attempts=2)


def failures(relay: RunningRelay) -> float:
    return sum(
        relay.value("bulk_recorder_outbox_publish_failures_total", reason=reason)
        for reason in ("refused", "nacked", "lost", "unroutable")
    )


async def post_job(client: Any, lines: list[dict[str, Any]]) -> dict[str, Any]:
    response = await client.post(
        "/v1/credit-annotation-jobs",
        content=ndjson(lines),
        headers={"content-type": "application/x-ndjson"},
    )
    assert response.status_code == 202, response.text
    return dict(response.json())


async def no_row_charged(conn: Any) -> None:
    charged = await conn.fetch("SELECT id, attempts, parked_at, last_error FROM outbox")
    bad = [dict(r) for r in charged if r["attempts"] or r["parked_at"] is not None]
    assert not bad, f"a return was charged to its row: {bad[:3]}"


async def test_a_deleted_queue_is_redeclared_by_the_relay_and_no_row_is_charged_or_parked(
    make_settings, database_url, db, broker: Broker
) -> None:
    settings = make_settings()
    await migrate(database_url)
    conn = await db()
    gen = Generator.create(1801)
    lines = [gen.credit_annotation() for _ in range(ROWS)]
    async with api_client(settings) as (client, _), running_relay(settings, CONFIG) as relay:
        await wait_for(lambda: relay.relay.ready()[0], timeout=30)
        await broker.channel.queue_delete(broker.topology.queue)
        job = await post_job(client, lines)

        async def drained() -> bool:
            await no_row_charged(conn)  # fails at once on a charged or parked row
            return int(await conn.fetchval("SELECT count(*) FROM outbox")) == 0

        await wait_for(drained, timeout=60)
        assert relay.value("bulk_recorder_outbox_publish_failures_total", reason="unroutable") > 0
        assert relay.value("bulk_recorder_outbox_publish_failures_total", reason="refused") == 0
        assert relay.value("bulk_recorder_outbox_parked_total") == 0
        status = (await client.get(job["status_url"])).json()
        assert (status["published"], status["dead_lettered"]) == (ROWS, 0), status
    messages = await broker.drain(broker.topology.queue)
    assert {json.loads(m.body)["id"] for m in messages} == {line["id"] for line in lines}


async def test_rows_wait_uncharged_while_the_queue_stays_missing_then_all_are_published(
    make_settings, database_url, db, broker: Broker
) -> None:
    """The relay here may only declare the exchange (as a relay whose user may not create the
    queue): the queue stays missing until the operator declares it again."""
    settings = make_settings()
    await migrate(database_url)
    conn = await db()

    async def declare_exchange_only(channel: aio_pika.abc.AbstractChannel) -> None:
        await channel.declare_exchange(
            settings.rabbitmq_exchange, aio_pika.ExchangeType.TOPIC, durable=True
        )

    gen = Generator.create(1802)
    lines = [gen.credit_annotation() for _ in range(ROWS)]
    await broker.channel.queue_delete(broker.topology.queue)
    async with (
        api_client(settings) as (client, _),
        running_relay(settings, CONFIG, declare=declare_exchange_only) as relay,
    ):
        job = await post_job(client, lines)
        # every row returned at least twice: on the old code that parked every one of them
        await wait_for(lambda: failures(relay) >= 2 * ROWS, timeout=60)
        await no_row_charged(conn)
        assert int(await conn.fetchval("SELECT count(*) FROM outbox")) == ROWS
        assert relay.value("bulk_recorder_outbox_publish_failures_total", reason="unroutable") > 0
        status = (await client.get(job["status_url"])).json()
        assert (status["published"], status["dead_lettered"]) == (0, 0), status
        assert status["status"] != "completed", status

        await declare_topology(broker.channel, broker.topology)  # the operator's fix

        async def drained() -> bool:
            await no_row_charged(conn)
            return int(await conn.fetchval("SELECT count(*) FROM outbox")) == 0

        await wait_for(drained, timeout=60)
        assert relay.value("bulk_recorder_outbox_parked_total") == 0
        status = (await client.get(job["status_url"])).json()
        assert (status["published"], status["dead_lettered"]) == (ROWS, 0), status
    messages = await broker.drain(broker.topology.queue)
    assert {json.loads(m.body)["id"] for m in messages} == {line["id"] for line in lines}
