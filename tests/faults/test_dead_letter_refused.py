"""The dead-letter queue cannot take a message: it is missing, or full with reject-publish.

A dead letter is acked only once the broker has routed it to a queue and confirmed it. Until
then its delivery is held and retried with backoff, and released (a copy republished to the
queue, then acked, so that no delivery is spent) within ``BULK_RECORDER_RELEASE_AFTER_S``: a
DLQ that refuses never stalls the consumer, never spends the message's delivery budget, and
once it accepts again every invalid message ends in it with its reason.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import aiormq
import pytest

from bulk_recorder.records import RecordError, decode
from consumer.delivery import ERROR_HEADER
from consumer.tools.generator import Generator
from consumer.topology import Topology
from tests.conftest import Broker, RunningRecorder, wait_for
from tests.faults.audit import audit_run, report_for, settled_count
from tests.rigs.rabbitmq_node import RabbitNode, available

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

FILLER_HEADER = "x-test-filler"


def _dead(rec: RunningRecorder) -> float:
    return sum(
        rec.value("bulk_recorder_messages_dead_lettered_total", reason=r)
        for r in ("decode", "type", "validation", "database")
    )


def _settled_once_each(rec: RunningRecorder) -> None:
    value = rec.value
    received = value("bulk_recorder_messages_received_total")
    outcomes = (
        value("bulk_recorder_messages_acked_total")
        + _dead(rec)
        + value("bulk_recorder_messages_rejected_total")
        + value("bulk_recorder_messages_released_total")
        + value("bulk_recorder_messages_dropped_total")
    )
    assert received == outcomes, (received, outcomes)


async def _depth(url: str, queue: str) -> int | None:
    """Ready messages in ``queue``, or None when it does not exist (own connection: a passive
    declare of a missing queue closes its channel)."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel()
        try:
            declared = await channel.declare_queue(queue, passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return None
        return int(declared.declaration_result.message_count or 0)
    finally:
        await connection.close()


async def test_a_dead_letter_is_acked_only_once_a_queue_holds_it(
    make_settings, start_recorder, broker, db, services
) -> None:
    """An operator deleted the DLQ: the dead-letter exchange routes nowhere, so the broker
    confirms the publish and drops the message. The recorder must notice (mandatory: the
    message is returned), keep the delivery, declare its topology again and dead-letter it."""
    topo = broker.topology
    rec = await start_recorder(make_settings(bulk_recorder_size=5))
    await broker.channel.queue_delete(topo.dead_letter_queue)
    gen = Generator.create(seed=81)
    invalid = [(b"{broken", "transaction"), (b"[]", "credit_annotation")]
    good = [(json.dumps(gen.credit_annotation()).encode(), "credit_annotation") for _ in range(5)]
    await broker.publish_many(invalid + good)

    async def dead_lettered_for_real() -> bool:
        return await _depth(services.rabbitmq_url, topo.dead_letter_queue) == len(invalid)

    try:
        await wait_for(dead_lettered_for_real, timeout=30)
    except AssertionError:
        # before the fix: "dead-lettered 2, main queue 0, DLQ missing": acked and gone
        main = await _depth(services.rabbitmq_url, topo.queue)
        dlq = await _depth(services.rabbitmq_url, topo.dead_letter_queue)
        raise AssertionError(
            f"dead-lettered {_dead(rec):.0f}, main queue {main}, "
            f"DLQ {'missing' if dlq is None else dlq}"
        ) from None
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == len(good))
    await rec.shutdown()
    assert _dead(rec) == len(invalid)
    _settled_once_each(rec)
    report, expected = report_for(invalid + good)
    audit = await audit_run(await db(), broker, report, faults=1, expected_dlq=expected)
    audit.assert_exact(dlq_surplus_allowed=False)


# -- a DLQ at its max-length with reject-publish (a policy on a broker node of our own) --------


@pytest.fixture(scope="module")
def own_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    """A throwaway RabbitMQ node: a policy that fills our DLQ must not touch the shared broker."""
    if not available():
        pytest.skip("rabbitmq-server is not installed here")
    folder: Path = tmp_path_factory.mktemp("rabbit-dlq")
    with RabbitNode(f"brdlq{uuid.uuid4().hex[:8]}", folder) as node:
        yield node


@pytest.fixture
async def node_broker(own_node: RabbitNode, topology: Topology) -> AsyncIterator[Broker]:
    b = Broker(own_node.url, dataclasses.replace(topology, delivery_limit=3))
    await b.open()
    yield b
    await b.close()


def _limit_dead_letter_queue(
    node: RabbitNode, policy: str, topo: Topology, max_length: int
) -> None:
    node.ctl(
        "set_policy",
        "--apply-to",
        "queues",
        policy,
        f"^{re.escape(topo.dead_letter_queue)}$",
        json.dumps({"max-length": max_length, "overflow": "reject-publish"}),
    )


async def _fill(broker: Broker) -> int:
    """Publish fillers to the DLQ until it refuses one; returns how many it took."""
    dlx = await broker.channel.get_exchange(broker.topology.dead_letter_exchange)
    for n in range(20):
        try:
            await dlx.publish(
                aio_pika.Message(b"filler", headers={FILLER_HEADER: n}), routing_key="filler"
            )
        except aiormq.exceptions.DeliveryError:
            return n
    raise AssertionError("the DLQ never refused a publish: is the policy applied?")


async def test_a_full_dead_letter_queue_neither_stalls_the_consumer_nor_spends_deliveries(
    make_settings, start_recorder, node_broker, own_node, db
) -> None:
    broker = node_broker
    topo = broker.topology
    policy = f"full-{uuid.uuid4().hex[:8]}"
    _limit_dead_letter_queue(own_node, policy, topo, max_length=1)
    fillers = await _fill(broker)
    # prefetch 2 (one worker, prefetch 1, batches of 1): two held invalid messages would take
    # the whole window; the delivery limit is 3, so three spent deliveries would hand each one
    # to the broker's own dead-lettering, which drops it when the DLQ refuses (at-most-once)
    settings = make_settings(
        rabbitmq_url=own_node.url,
        rabbitmq_delivery_limit=topo.delivery_limit,
        rabbitmq_numbers_of_workers=1,
        rabbitmq_numbers_of_prefetch=1,
        bulk_recorder_size=1,
        bulk_recorder_release_after_s=1.0,
    )
    assert settings.channel_prefetch == 2
    rec = await start_recorder(settings)
    gen = Generator.create(seed=82)
    invalid = [(b"{broken", "transaction"), (b"[]", "credit_annotation")]
    good = [(json.dumps(gen.credit_annotation()).encode(), "credit_annotation") for _ in range(6)]
    await broker.publish_many(invalid + good)

    try:
        await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == len(good))
    except AssertionError:
        # before the fix: "received 2, acked 0, dropped 2": both invalid deliveries stay
        # unacked for ever and take the whole window, so nothing else is delivered
        raise AssertionError(
            f"received {rec.value('bulk_recorder_messages_received_total'):.0f}, "
            f"acked {rec.value('bulk_recorder_messages_acked_total'):.0f}, "
            f"dropped {rec.value('bulk_recorder_messages_dropped_total'):.0f}"
        ) from None
    # each invalid message goes round several times (more than its delivery limit) ...
    await wait_for(
        lambda: (
            rec.value("bulk_recorder_messages_released_total")
            >= len(invalid) * (topo.delivery_limit + 1)
        ),
        timeout=60,
    )
    assert _dead(rec) == 0
    assert await broker.ready_count(topo.dead_letter_queue) == fillers
    # ... and when the DLQ accepts again (the operator raised its limit), both end in it with
    # their reason (clearing the policy is not enough: RabbitMQ 3.10 keeps the quorum queue's
    # limit until a policy sets another)
    _limit_dead_letter_queue(own_node, policy, topo, max_length=1000)
    await wait_for(lambda: _dead(rec) == len(invalid), timeout=30)
    await rec.shutdown()
    _settled_once_each(rec)

    assert await settled_count(broker, topo.queue) == 0
    dead = await broker.drain(topo.dead_letter_queue)
    ours = [m for m in dead if FILLER_HEADER not in (m.headers or {})]
    assert len(dead) - len(ours) == fillers
    assert sorted(_reason(m) for m in ours) == sorted(_expected_reason(b, t) for b, t in invalid)
    for message in ours:
        headers: dict[str, Any] = dict(message.headers or {})
        assert "x-death" not in headers, headers  # never dead-lettered by the broker's limit
        assert headers.get("x-bulk-recorder-original-exchange") == topo.exchange, headers
    conn = await db()
    recorded = {str(r[0]) for r in await conn.fetch("SELECT id FROM credit_annotations")}
    assert recorded == {json.loads(b)["id"] for b, _ in good}


def _reason(message: aio_pika.abc.AbstractIncomingMessage) -> str:
    value = (message.headers or {}).get(ERROR_HEADER)
    assert isinstance(value, str), message.headers
    return value


def _expected_reason(body: bytes, record_type: str | None) -> str:
    try:
        decode(body, record_type)
    except RecordError as exc:
        return exc.reason
    raise AssertionError("valid message")
