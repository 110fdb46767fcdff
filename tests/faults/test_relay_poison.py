"""An outbox row the broker refuses by closing the channel never blocks the outbox (issue 8).

RabbitMQ answers a message larger than its ``max_message_size`` by closing the channel with
``406 PRECONDITION_FAILED``, which fails every publish in flight on it, not only the oversized
one. Such a row must count as refused (attempts grow, parked after ``max_attempts``, its job's
``dead_lettered`` grows) and the rows in flight with it, and behind it, must be published.

The machine's broker is shared and keeps the default limit (128 MiB), so this runs against a
throwaway node of its own with ``max_message_size = 1024`` (tests/rigs/rabbitmq_node.py): a
valid credit annotation with a 1,000-character reason is larger than that.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bulk_recorder.producer.relay import RelayConfig
from consumer.tools.generator import Generator
from consumer.topology import Topology
from tests.conftest import Broker, wait_for
from tests.integration.producer_support import api_client, ndjson, running_relay
from tests.rigs.rabbitmq_node import RabbitNode, available

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

MAX_MESSAGE_SIZE = 1024


@pytest.fixture(scope="module")
def small_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    if not available():
        pytest.skip("rabbitmq-server is not installed here: no throwaway node")
    node = RabbitNode(
        f"brpoison{uuid.uuid4().hex[:8]}",  # a name of its own: another pytest may run one
        Path(tmp_path_factory.mktemp("rabbit")),
        config=f"max_message_size = {MAX_MESSAGE_SIZE}\n",
    )
    with node:
        yield node


async def test_a_row_the_broker_closes_the_channel_for_is_parked_and_the_rest_flow(
    make_settings, db, small_broker: RabbitNode
) -> None:
    settings = make_settings(rabbitmq_url=small_broker.url)
    gen = Generator.create(83)
    lines = [gen.credit_annotation() for _ in range(40)]
    poison = lines[5]
    poison["reason"] = "x" * 1000  # valid (at most 1,000 characters), but over the broker's limit
    assert len(json.dumps(poison)) > MAX_MESSAGE_SIZE
    assert all(len(json.dumps(line)) < MAX_MESSAGE_SIZE for line in lines if line is not poison)

    queue = Broker(small_broker.url, Topology.from_settings(settings))
    await queue.open()
    try:
        async with api_client(settings) as (client, _):
            response = await client.post(
                "/v1/credit-annotation-jobs",
                content=ndjson(lines),
                headers={"content-type": "application/x-ndjson"},
            )
            assert response.status_code == 202, response.text
            job = response.json()
            assert job["accepted"] == 40

            # Two lanes of 10: the poison row shares the channel with whole batches in flight.
            config = RelayConfig(batch_size=10, lanes=2, poll_interval_s=0.2, max_attempts=2)
            async with running_relay(settings, config) as relay:
                conn = await db()
                await wait_for(lambda: _only_the_poison_left_parked(conn), timeout=60)
                assert relay.published >= 39
                assert (
                    relay.value("bulk_recorder_outbox_publish_failures_total", reason="refused")
                    == 2
                )
                assert relay.value("bulk_recorder_outbox_parked_total") == 1
                assert relay.relay.ready() == (True, "broker up, database up")

            row = await conn.fetchrow("SELECT record_id::text, attempts, last_error FROM outbox")
            assert row["record_id"] == poison["id"]
            assert row["attempts"] == 2
            assert "PRECONDITION_FAILED - message size" in row["last_error"]
            status = (await client.get(job["status_url"])).json()
            assert status["published"] == 39
            assert status["dead_lettered"] == 1
        # Every other row reached the queue (rows confirmed by nobody when the channel closed
        # are published again: a duplicate the recorder absorbs).
        messages = await queue.drain(queue.topology.queue)
        assert {json.loads(m.body)["id"] for m in messages} == {
            line["id"] for line in lines if line is not poison
        }
    finally:
        await queue.close()


async def _only_the_poison_left_parked(conn) -> bool:
    rows = await conn.fetch("SELECT parked_at FROM outbox")
    return len(rows) == 1 and rows[0]["parked_at"] is not None
