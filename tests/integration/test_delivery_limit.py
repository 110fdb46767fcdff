"""What `x-delivery-limit=N` means on the broker the recorder runs against, measured.

A RabbitMQ 3.10 quorum queue delivers a message that is returned every time N + 1 times: no
`x-delivery-count` on the first delivery (a publisher's is kept), then 1 to N; the return of
the delivery whose count is N dead-letters it (x-death reason `delivery_limit`). So the last
delivery the broker allows is the one whose `x-delivery-count` is N or more, not N - 1: a row
PostgreSQL refuses is rejected on the N deliveries before, and dead-lettered by the recorder,
with its reason, on that last one (attempt N + 1), never one delivery early.
"""

from __future__ import annotations

import json
from typing import Any

import aio_pika
import pytest

from consumer.delivery import ERROR_HEADER
from consumer.tools.generator import Generator
from consumer.topology import Topology
from tests.conftest import Broker, Services, SettingsFactory, wait_for
from tests.faults.audit import DATABASE_REFUSED, settled_count

pytestmark = [pytest.mark.rabbitmq]

DEAD = "bulk_recorder_messages_dead_lettered_total"
ATTEMPT = "bulk_recorder_delivery_attempt"


async def _limited(services: Services, topology: Topology, limit: int) -> Broker:
    broker = Broker(services.rabbitmq_url, Topology(topology.exchange, topology.queue, limit))
    await broker.open()
    return broker


@pytest.mark.parametrize("limit", [1, 2, 3])
async def test_the_broker_delivers_a_returned_message_limit_plus_one_times(
    services: Services, topology: Topology, limit: int
) -> None:
    """Consumed as the recorder consumes (basic.consume; a basic.get sets 0 on the first)."""
    broker = await _limited(services, topology, limit)
    try:
        await broker.publish(b"{}", "transaction")
        counts: list[Any] = []

        async def returned(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            counts.append((message.headers or {}).get("x-delivery-count"))
            await message.nack(requeue=True)

        queue = await broker.channel.get_queue(topology.queue)
        await queue.consume(returned)

        async def dead_lettered() -> bool:
            return await broker.ready_count(broker.topology.dead_letter_queue) == 1

        await wait_for(dead_lettered, timeout=30)
        [dead] = await broker.drain(broker.topology.dead_letter_queue)
    finally:
        await broker.close()
    assert len(counts) == limit + 1, counts
    assert counts == [None, *range(1, limit + 1)], counts
    deaths: Any = dead.headers["x-death"]
    assert deaths[0]["reason"] == "delivery_limit"


@pytest.mark.postgres
@pytest.mark.parametrize("limit", [1, 2])
async def test_a_refused_row_is_dead_lettered_with_its_reason_on_the_brokers_last_delivery(
    services: Services,
    topology: Topology,
    make_settings: SettingsFactory,
    start_recorder: Any,
    limit: int,
) -> None:
    """Rejected on each delivery the broker would give again, dead-lettered by the recorder
    (reason header) on the last: limit + 1 deliveries, limit rejects, one dead letter at
    attempt limit + 1 (as `delivery_attempt{outcome="dead_lettered"}` says)."""
    broker = await _limited(services, topology, limit)
    try:
        rec = await start_recorder(
            make_settings(rabbitmq_delivery_limit=limit, bulk_recorder_size=1)
        )
        gen = Generator.create(seed=2708)
        owner = gen.transaction()
        await broker.publish(json.dumps(owner).encode(), "transaction")
        await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 1)
        stolen = gen.transaction()  # refused (23505): its operation id belongs to `owner`
        stolen["operations"][0]["id"] = owner["operations"][0]["id"]
        await broker.publish(json.dumps(stolen).encode(), "transaction")

        await wait_for(lambda: rec.value(DEAD, reason="database") == 1, timeout=30)
        received = rec.value("bulk_recorder_messages_received_total") - 1
        rejected = rec.value("bulk_recorder_messages_rejected_total")
        at = {
            bound: rec.value(ATTEMPT + "_bucket", outcome="dead_lettered", le=bound)
            for bound in ("1.0", "2.0", "3.0")
        }
        assert (received, rejected) == (limit + 1, limit), (
            f"x-delivery-limit={limit}: {received:g} deliveries, {rejected:g} rejects before "
            f"the recorder dead-lettered the row; the broker delivers it {limit + 1} times"
        )
        assert at[f"{limit}.0"] == 0, at
        assert at[f"{limit + 1}.0"] == 1, at
        [dead] = await broker.drain(broker.topology.dead_letter_queue)
        assert str(dead.headers[ERROR_HEADER]).startswith(DATABASE_REFUSED + ": 23505")
        assert "x-death" not in (dead.headers or {})  # ours, not the broker's
        await rec.shutdown()
        assert await settled_count(broker, topology.queue) == 0
    finally:
        await broker.close()
