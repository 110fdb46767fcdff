"""A broker memory alarm: RabbitMQ blocks every connection that publishes and stops reading it.

Acks that share a connection with dead-letter publishes stop with it, so intake stalls exactly
when the queue needs draining. The alarm is raised for real, on a RabbitMQ node of the test's
own (an alarm on the machine's shared broker would stop every other test).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from consumer.tools.generator import Generator
from consumer.topology import Topology
from tests.conftest import Broker, wait_for
from tests.faults.audit import LIST_QUEUE_MESSAGES, audit_run, queue_messages, report_for
from tests.rigs.rabbitmq_node import RabbitNode, available

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


@pytest.fixture
def alarm_node(tmp_path: Path) -> Iterator[RabbitNode]:
    if not available():
        pytest.skip("rabbitmq-server is not installed here")
    with RabbitNode(f"bralarm{uuid.uuid4().hex[:8]}", tmp_path / "rabbit") as node:
        yield node


@pytest.fixture
async def node_broker(alarm_node: RabbitNode, topology: Topology) -> AsyncIterator[Broker]:
    b = Broker(alarm_node.url, topology)
    await b.open()
    yield b
    await b.close()


async def _ctl(node: RabbitNode, *args: str) -> str:
    result = await asyncio.to_thread(node.ctl, *args)
    return result.stdout


async def _messages(node: RabbitNode, queue: str) -> int:
    """Ready + unacked, as the broker counts them (an ack the broker never read still counts)."""
    return queue_messages(await _ctl(node, *LIST_QUEUE_MESSAGES), queue)


async def test_a_memory_alarm_does_not_stop_the_acks(
    make_settings, start_recorder, node_broker, alarm_node, db
) -> None:
    broker, node = node_broker, alarm_node
    topo = broker.topology
    gen = Generator.create(seed=87)
    invalid = [(b"{broken", "transaction")]
    good = [(json.dumps(gen.credit_annotation()).encode(), "credit_annotation") for _ in range(20)]
    await broker.publish_many(invalid + good)  # during the alarm our own publishes would block

    await _ctl(node, "set_vm_memory_high_watermark", "absolute", "1")

    async def alarm_raised() -> bool:
        return "memory" in await _ctl(node, "eval", "rabbit_alarm:get_alarms().")

    await wait_for(alarm_raised, timeout=30)
    settings = make_settings(
        rabbitmq_url=node.url,
        bulk_recorder_size=5,
        bulk_recorder_confirm_timeout_s=1.0,
        bulk_recorder_release_after_s=60.0,
    )
    rec = await start_recorder(settings)
    # the invalid message comes first: its dead letter is published during the alarm, and the
    # broker blocks the connection that published it
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == len(good))

    async def broker_took_the_acks() -> bool:
        return await _messages(node, topo.queue) == len(invalid)

    try:
        await wait_for(broker_took_the_acks, timeout=30)
    except AssertionError:
        # before the fix: "recorder acked 20, broker holds 21": the acks never left the
        # blocked connection
        held = await _messages(node, topo.queue)
        raise AssertionError(
            f"recorder acked {rec.value('bulk_recorder_messages_acked_total'):.0f}, "
            f"broker holds {held}"
        ) from None

    await _ctl(node, "set_vm_memory_high_watermark", "0.4")
    await wait_for(
        lambda: rec.value("bulk_recorder_messages_dead_lettered_total", reason="decode") == 1
    )
    await rec.shutdown()
    report, expected = report_for(invalid + good)
    audit = await audit_run(await db(), broker, report, faults=1, expected_dlq=expected)
    # the publish the broker blocked is read once the alarm clears, after the recorder's retry
    # timed out and published it again: the DLQ is at-least-once
    audit.assert_exact(dlq_surplus_allowed=True)
    assert audit.dlq_total <= 2 * len(invalid)
