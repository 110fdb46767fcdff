"""The dead-letter path breaks while the recorder runs (an operator deletes the dead-letter
exchange): refused messages must not be held unacked; once the topology is back they are
dead-lettered with their reason and nothing else is lost."""

from __future__ import annotations

import json

import pytest

from consumer.tools.generator import Generator
from tests.conftest import Broker, wait_for
from tests.faults.audit import audit_run, report_for

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]


async def test_deleted_dead_letter_exchange_is_redeclared_and_nothing_is_held(
    make_settings, start_recorder, broker, db
) -> None:
    gen = Generator.create(seed=95)
    rec = await start_recorder(make_settings(bulk_recorder_size=10))
    await broker.channel.exchange_delete(broker.topology.dead_letter_exchange)
    messages: list[tuple[bytes, str | None]] = []
    for n in range(40):
        messages.append((json.dumps(gen.transaction()).encode(), "transaction"))
        if n % 8 == 0:
            messages.append((b"{broken %d" % n, "transaction"))
    await broker.publish_many(messages)
    report, expected = report_for(messages)
    # The first dead letter fails (no such exchange, which also closes the publishing channel);
    # the recorder reconnects, declares its topology again and dead-letters what it refused.
    await wait_for(
        lambda: _ready(broker, broker.topology.dead_letter_queue, report.invalid), timeout=60
    )
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") >= report.valid)
    await rec.shutdown()
    audit = await audit_run(await db(), broker, report, faults=1, expected_dlq=expected)
    audit.assert_exact(dlq_surplus_allowed=False)


async def _ready(broker: Broker, queue: str, n: int) -> bool:
    return await broker.ready_count(queue) >= n
