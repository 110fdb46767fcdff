"""`bulk-recorder dlq inspect|replay` against the real broker: counts and reasons, replay after a
fix, header hygiene, --limit, and interruption that can duplicate but never lose."""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import subprocess
import sys
from typing import Any

import aio_pika
import pytest

from consumer.delivery import ERROR_HEADER
from consumer.tools import dlq as dlq_module
from consumer.tools.dlq import REPLAY_HEADER, inspect_dlq, replay_dlq
from consumer.tools.generator import Generator
from tests.conftest import Broker, wait_for
from tests.faults.audit import settled_count
from tests.faults.conftest import REPO, settings_env
from tests.integration.dlq_support import dlq_contents

pytestmark = [pytest.mark.rabbitmq]


async def dead_letter(
    broker: Broker, body: bytes, record_type: str | None, headers: dict[str, Any]
) -> None:
    """Put a message in the DLQ as the recorder (or the broker) would have."""
    exchange = await broker.channel.get_exchange(broker.topology.dead_letter_exchange)
    await exchange.publish(
        aio_pika.Message(
            body,
            headers=headers,
            type=record_type,
            content_type="application/json",
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        ),
        routing_key=record_type or "untyped",
    )


def ours(reason: str, record_type: str | None = "transaction") -> dict[str, Any]:
    return {
        ERROR_HEADER: reason,
        "x-bulk-recorder-original-exchange": "bulk_recorder",
        "x-bulk-recorder-original-routing-key": record_type or "untyped",
        "x-delivery-count": 4,
        "app-header": "kept",
    }


BROKER_DEATH = {
    "x-death": [
        {
            "count": 1,
            "reason": "delivery_limit",
            "queue": "bulk_recorder.records",
            "exchange": "bulk_recorder",
            "routing-keys": ["transaction"],
            "time": datetime.datetime(2026, 11, 30, tzinfo=datetime.UTC),
        }
    ],
    "x-first-death-reason": "delivery_limit",
    "x-first-death-queue": "bulk_recorder.records",
    "x-first-death-exchange": "bulk_recorder",
}


async def test_inspect_counts_by_reason_shows_samples_and_removes_nothing(
    make_settings, broker: Broker
) -> None:
    gen = Generator.create(seed=71)
    settings = make_settings()
    for n in range(3):
        await dead_letter(broker, b"{nope%d" % n, "transaction", ours("invalid JSON"))
    for amount in ("1.00", "2.50"):
        tx = gen.transaction()
        await dead_letter(
            broker, json.dumps(tx).encode(), "transaction", ours(f"debits {amount} != credits 0.01")
        )
    await dead_letter(broker, b'{"id": 1}', "transaction", BROKER_DEATH)
    await dead_letter(broker, b"\x00\xffbinary", None, {})

    out = io.StringIO()
    assert await inspect_dlq(settings, samples=1, out=out) == 0
    text = out.getvalue()
    assert f"dead-letter queue {settings.dead_letter_queue}: 7 messages" in text
    assert "       3  invalid JSON" in text
    assert "       2  debits #.# != credits #.#" in text  # numbers blanked: one line a kind
    assert "       1  broker: delivery_limit (from bulk_recorder.records)" in text
    assert "       1  unknown (no reason header)" in text
    assert "[invalid JSON] type=transaction body: {nope0" in text
    assert "\\x00" in text  # control bytes are escaped, not printed raw
    assert await settled_count(broker, settings.dead_letter_queue) == 7  # nothing removed


async def test_replay_moves_back_with_routing_key_type_and_clean_headers(
    make_settings, broker: Broker
) -> None:
    settings = make_settings()
    dlq = settings.dead_letter_queue
    # released twice during an outage (republished with a retry count), then refused for good
    released = {**ours("database refused the row: 23505"), "x-bulk-recorder-retries": 2}
    await dead_letter(broker, b'{"a": 1}', "transaction", released)
    await dead_letter(
        broker, b'{"b": 2}', "credit_annotation", {**BROKER_DEATH, REPLAY_HEADER: 2, "k": "v"}
    )
    await dead_letter(broker, b'{"c": 3}', None, ours("missing type property", None))
    ids = {body: message_id for body, message_id, _ in await dlq_contents(broker, dlq)}
    assert all(ids.values())  # aio-pika gives every message an id

    out = io.StringIO()
    assert await replay_dlq(settings, out=out) == 0
    assert "replayed 3 of 3 messages" in out.getvalue()
    assert await settled_count(broker, settings.dead_letter_queue) == 0
    back = {m.body: m for m in await broker.drain(settings.rabbitmq_queue)}
    assert set(back) == {b'{"a": 1}', b'{"b": 2}', b'{"c": 3}'}
    a, b, c = back[b'{"a": 1}'], back[b'{"b": 2}'], back[b'{"c": 3}']
    assert (a.routing_key, a.type) == ("transaction", "transaction")
    assert (b.routing_key, b.type) == ("credit_annotation", "credit_annotation")
    assert c.routing_key == "untyped"  # no type: its original routing key
    assert a.headers[REPLAY_HEADER] == 1
    assert b.headers[REPLAY_HEADER] == 3
    assert a.headers["app-header"] == "kept"
    assert b.headers["k"] == "v"
    for message in (a, b, c):
        assert message.message_id == ids[message.body]  # the same message: its id kept
        assert ERROR_HEADER not in message.headers
        assert "x-death" not in message.headers
        assert not any(k.startswith("x-first-death") for k in message.headers)
        assert "x-bulk-recorder-original-routing-key" not in message.headers
        assert "x-bulk-recorder-retries" not in message.headers  # a replay starts afresh
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT


async def test_replay_limit_moves_only_that_many(make_settings, broker: Broker) -> None:
    settings = make_settings()
    for n in range(10):
        await dead_letter(broker, b"%d" % n, "transaction", ours("invalid JSON"))
    assert await replay_dlq(settings, limit=4, out=io.StringIO()) == 0
    assert await settled_count(broker, settings.dead_letter_queue) == 6
    assert await broker.ready_count(settings.rabbitmq_queue) == 4


async def test_interrupted_replay_may_duplicate_but_never_loses(
    make_settings, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings()
    bodies = {b"m%05d" % n for n in range(3000)}
    exchange = await broker.channel.get_exchange(broker.topology.dead_letter_exchange)
    headers = ours("invalid JSON")
    for chunk in range(0, len(bodies), 500):
        await asyncio.gather(
            *(
                exchange.publish(
                    aio_pika.Message(b, headers=headers, type="transaction"), "transaction"
                )
                for b in sorted(bodies)[chunk : chunk + 500]
            )
        )
    # Interrupt deterministically in the middle: cancel the replay while it builds message 700.
    built = 0
    original = dlq_module.replayed_message

    def counting(message: Any) -> Any:
        nonlocal built
        built += 1
        if built == 700:
            replay.cancel()
        return original(message)

    monkeypatch.setattr(dlq_module, "replayed_message", counting)
    replay = asyncio.create_task(replay_dlq(settings, out=io.StringIO()))
    with pytest.raises(asyncio.CancelledError):
        await replay
    await settled_count(broker, settings.dead_letter_queue)  # the unacked are back in the DLQ
    main = [m.body for m in await broker.drain(settings.rabbitmq_queue)]
    dlq = [m.body for m in await broker.drain(settings.dead_letter_queue)]
    assert 0 < len(main) < len(bodies)
    assert set(main) | set(dlq) == bodies  # nothing lost
    print(
        f"interrupted replay: moved {len(main)}, left {len(dlq)}, duplicated "
        f"{len(main) + len(dlq) - len(bodies)}, lost 0"
    )


async def test_interrupted_inspect_leaves_every_message_in_place(
    make_settings, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings()
    exchange = await broker.channel.get_exchange(broker.topology.dead_letter_exchange)
    headers = ours("invalid JSON")
    await asyncio.gather(
        *(
            exchange.publish(aio_pika.Message(b"%d" % n, headers=headers), "transaction")
            for n in range(1000)
        )
    )
    seen = 0
    original = dlq_module.reason_of

    def counting(headers: Any) -> str:
        nonlocal seen
        seen += 1
        if seen == 500:
            inspect.cancel()
        return original(headers)

    monkeypatch.setattr(dlq_module, "reason_of", counting)
    inspect = asyncio.create_task(inspect_dlq(settings, out=io.StringIO()))
    with pytest.raises(asyncio.CancelledError):
        await inspect
    assert await settled_count(broker, settings.dead_letter_queue) == 1000


@pytest.mark.postgres
async def test_refused_rows_recorded_after_the_fix_and_a_replay(
    make_settings, start_recorder, broker: Broker, db
) -> None:
    gen = Generator.create(seed=72)
    settings = make_settings(bulk_recorder_flush_timeout_ms=50)
    rec = await start_recorder(settings)
    earlier = gen.transaction()
    await broker.publish(json.dumps(earlier).encode(), "transaction")
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 1)
    refused = gen.transaction()
    refused["operations"][0]["id"] = earlier["operations"][0]["id"]
    await broker.publish(json.dumps(refused).encode(), "transaction")
    await wait_for(
        lambda: rec.value("bulk_recorder_messages_dead_lettered_total", reason="database") == 1
    )
    out = io.StringIO()
    assert await inspect_dlq(settings, out=out) == 0
    assert "database refused the row: #" in out.getvalue()

    # the fix: the conflicting transaction was a mistake and is removed
    conn = await db()
    await conn.execute("DELETE FROM operations WHERE transaction_id = $1", earlier["id"])
    await conn.execute("DELETE FROM transactions WHERE id = $1", earlier["id"])
    assert await replay_dlq(settings, out=io.StringIO()) == 0
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 2)
    assert (
        await conn.fetchval("SELECT count(*) FROM transactions WHERE id = $1", refused["id"]) == 1
    )
    assert await settled_count(broker, settings.dead_letter_queue) == 0


async def test_cli_dlq_inspect_and_replay(make_settings, broker: Broker) -> None:
    settings = make_settings()
    await dead_letter(broker, b"{nope", "transaction", ours("invalid JSON"))
    env = settings_env(settings)
    inspect = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "consumer.cli", "dlq", "inspect"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert inspect.returncode == 0, inspect.stderr
    assert "1  invalid JSON" in inspect.stdout
    replay = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "consumer.cli", "dlq", "replay", "--limit", "5"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert replay.returncode == 0, replay.stderr
    assert "replayed 1 of 1 messages" in replay.stdout
    assert await broker.ready_count(settings.rabbitmq_queue) == 1


async def test_missing_dlq_is_an_error(make_settings) -> None:
    settings = make_settings(rabbitmq_queue="brtest.no-such-queue")
    assert await inspect_dlq(settings, out=io.StringIO()) == 1
    assert await replay_dlq(settings, out=io.StringIO()) == 1


async def test_inspect_leaves_the_dlq_in_its_order(make_settings, broker: Broker) -> None:
    settings = make_settings()
    # 600: 38 batches of nacks, so that batches sent without their pacing are reordered for sure
    for n in range(600):
        await dead_letter(broker, b"%03d" % n, "transaction", ours(f"reason {n % 3}"))
    before = await dlq_contents(broker, settings.dead_letter_queue)
    assert [body for body, _, _ in before] == [b"%03d" % n for n in range(600)]
    assert await inspect_dlq(settings, out=io.StringIO()) == 0
    assert await dlq_contents(broker, settings.dead_letter_queue) == before
