"""The DLQ worked by reason, on the real broker with a real recorder (issue 23): a mixed DLQ
made by the recorder from bad messages; inspect groups it; a dry run changes nothing; one
reason is replayed after its cause is fixed, another discarded, the rest stay in order; a
replayed message keeps its ids, so a second copy of it is recorded once."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from decimal import Decimal
from functools import partial
from typing import Any

import aio_pika
import pytest

from consumer.tools.dlq import discard_dlq, inspect_dlq, replay_dlq
from consumer.tools.dlq_groups import reason_group
from consumer.tools.generator import Generator, dump
from tests.conftest import Broker, run_cli_on_terminal, wait_for
from tests.faults.conftest import REPO, settings_env
from tests.integration.dlq_support import dlq_contents

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]

DB_REASON = "database refused the row"
NO_TYPE = "missing type property"


async def publish(broker: Broker, record: dict[str, Any] | bytes, record_type: str | None) -> None:
    """As a producer would: persistent, with the record's id as message_id."""
    body = record if isinstance(record, bytes) else dump(record)
    exchange = await broker.channel.get_exchange(broker.topology.exchange)
    await exchange.publish(
        aio_pika.Message(
            body,
            content_type="application/json",
            type=record_type,
            message_id=None if isinstance(record, bytes) else record["id"],
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        ),
        routing_key=record_type or "untyped",
    )


async def mixed_dlq(broker: Broker, rec: Any, db: Any, gen: Generator) -> list[dict[str, Any]]:
    """The recorder dead-letters, one at a time (so the DLQ's order is known): 3 transactions
    the database refuses (an operation id already taken by a PENDING transaction), 2 without a
    type, 2 of invalid JSON, 1 unbalanced. Returns the refused transactions."""
    earlier = []
    for _ in range(3):
        tx = gen.transaction()
        tx["status"] = "PENDING"  # moves no balance: deleting it later is the whole fix
        earlier.append(tx)
        await publish(broker, tx, "transaction")
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 3)
    refused = []
    for tx in earlier:
        clash = gen.transaction()
        clash["operations"][0]["id"] = tx["operations"][0]["id"]
        refused.append(clash)
    unbalanced = gen.transaction()
    unbalanced["operations"][1]["amount"] = "0.01"
    sequence: list[tuple[dict[str, Any] | bytes, str | None]] = [
        (b"{nope 1", "transaction"),
        (refused[0], "transaction"),
        (gen.transaction(), None),
        (unbalanced, "transaction"),
        (refused[1], "transaction"),
        (gen.transaction(), None),
        (b"{nope 2", "transaction"),
        (refused[2], "transaction"),
    ]
    queue = broker.topology.dead_letter_queue
    for n, (record, record_type) in enumerate(sequence, start=1):
        await publish(broker, record, record_type)
        await wait_for(partial(broker_ready, broker, queue, n))
    return refused


async def broker_ready(broker: Broker, queue: str, count: int) -> bool:
    return await broker.ready_count(queue) == count


def without(contents: list[tuple[bytes, str | None, str]], prefix: str) -> list[Any]:
    return [c for c in contents if not c[2].startswith(prefix)]


async def recorded(conn: Any, txs: list[dict[str, Any]]) -> dict[str, tuple[Decimal, str, int]]:
    rows = await conn.fetch(
        "SELECT t.id::text, t.amount, t.status, count(o.id) AS ops FROM transactions t "
        "JOIN operations o ON o.transaction_id = t.id WHERE t.id = ANY($1::uuid[]) "
        "GROUP BY t.id",
        [tx["id"] for tx in txs],
    )
    return {r["id"]: (r["amount"], r["status"], r["ops"]) for r in rows}


async def test_mixed_dlq_worked_by_reason(
    make_settings, start_recorder, broker: Broker, db, monkeypatch: pytest.MonkeyPatch
) -> None:
    gen = Generator.create(seed=2301)
    settings = make_settings(bulk_recorder_flush_timeout_ms=50)
    rec = await start_recorder(settings)
    conn = await db()
    started = datetime.now(UTC)
    refused = await mixed_dlq(broker, rec, conn, gen)
    queue = settings.dead_letter_queue
    before = await dlq_contents(broker, queue)
    assert next(c[0] for c in before) == b"{nope 1"
    assert len(before) == 8
    assert [c[1] for c in before if c[2].startswith(DB_REASON)] == [t["id"] for t in refused]

    # inspect --json: groups, counts, first/last seen from the recorder's header
    out = io.StringIO()
    assert await inspect_dlq(settings, out=out, as_json=True) == 0
    report = json.loads(out.getvalue())
    counts = {g["reason"]: g["count"] for g in report["groups"]}
    assert report["messages"] == 8
    assert sum(counts.values()) == 8
    db_group = next(r for r in counts if r.startswith(DB_REASON))
    assert counts[db_group] == 3
    assert counts[NO_TYPE] == 2
    assert Counter(reason_group(c[2]) for c in before) == counts
    for group in report["groups"]:
        assert group["seen_from"] == {"dead-lettered-at": group["count"]}
        first = datetime.fromisoformat(group["first_seen"])
        last = datetime.fromisoformat(group["last_seen"])
        assert started.replace(microsecond=0) <= first <= last <= datetime.now(UTC)
    assert await dlq_contents(broker, queue) == before

    # a dry run shows what would move and moves nothing
    acked = rec.value("bulk_recorder_messages_acked_total")
    out = io.StringIO()
    assert await replay_dlq(settings, reason=db_group, dry_run=True, out=out) == 0
    assert f"would replay 3 messages of reason {db_group!r}" in out.getvalue()
    assert "dry run: nothing moved" in out.getvalue()
    assert await dlq_contents(broker, queue) == before
    assert await broker.ready_count(settings.rabbitmq_queue) == 0
    assert rec.value("bulk_recorder_messages_acked_total") == acked

    # the fix: the PENDING transactions whose operation ids were taken by mistake are removed
    for tx in refused:
        op_id = tx["operations"][0]["id"]
        owner = await conn.fetchval("SELECT transaction_id FROM operations WHERE id = $1", op_id)
        await conn.execute("DELETE FROM operations WHERE transaction_id = $1", owner)
        await conn.execute("DELETE FROM transactions WHERE id = $1", owner)

    # replay that reason, killed between a confirmed publish and its ack: the first ack is
    # lost, so that message is now both back in the queue and still in the DLQ
    lost = 0
    original_ack = aio_pika.IncomingMessage.ack

    async def ack_lost_once(self: aio_pika.IncomingMessage, multiple: bool = False) -> None:
        nonlocal lost
        if not lost:
            lost += 1
            raise aio_pika.exceptions.ChannelInvalidStateError("killed before the ack")
        await original_ack(self, multiple)

    monkeypatch.setattr(aio_pika.IncomingMessage, "ack", ack_lost_once)
    assert await replay_dlq(settings, reason=db_group, out=io.StringIO()) == 1
    monkeypatch.undo()
    assert lost == 1
    after_first = await dlq_contents(broker, queue)
    assert without(after_first, DB_REASON) == without(before, DB_REASON)  # others untouched
    assert 1 <= sum(c[2].startswith(DB_REASON) for c in after_first) <= 3

    out = io.StringIO()
    assert await replay_dlq(settings, reason=db_group, out=out) == 0
    after = await dlq_contents(broker, queue)
    assert after == without(before, DB_REASON)  # exactly the others, in their order
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") >= acked + 4)
    rows = await recorded(conn, refused)
    assert rows == {tx["id"]: (Decimal(tx["amount"]), "APPROVED", 2) for tx in refused}
    moved: dict[str, Decimal] = {}
    for tx in refused:
        for op in tx["operations"]:
            sign = 1 if op["type"] == "CREDIT" else -1
            account = op["account_id"]
            moved[account] = moved.get(account, Decimal(0)) + sign * Decimal(op["amount"])
    balances = await conn.fetch("SELECT account_id::text, available FROM balances")
    assert {r["account_id"]: r["available"] for r in balances} == dict(moved)  # once each

    # discard the messages that can never be valid: asked first; "no" changes nothing
    out = io.StringIO()
    assert await discard_dlq(settings, NO_TYPE, lambda question: False, out=out) == 1
    assert "would discard 2 messages" in out.getvalue()
    assert "nothing discarded" in out.getvalue()
    assert await dlq_contents(broker, queue) == after
    asked: list[str] = []

    def yes(question: str) -> bool:
        asked.append(question)
        return True

    assert await discard_dlq(settings, NO_TYPE, yes) == 0
    assert asked == ["discard these 2 messages for good? [y/N] "]
    assert await dlq_contents(broker, queue) == without(after, NO_TYPE)

    # replaying the replayed reason again finds nothing and changes nothing
    out = io.StringIO()
    assert await replay_dlq(settings, reason=db_group, out=out) == 0
    assert "replayed 0 of 3 messages" in out.getvalue()
    assert await dlq_contents(broker, queue) == without(after, NO_TYPE)
    assert await recorded(conn, refused) == rows


async def test_cli_dlq_by_reason(make_settings, broker: Broker) -> None:
    settings = make_settings()
    exchange = await broker.channel.get_exchange(broker.topology.dead_letter_exchange)
    for n, reason in enumerate(["invalid JSON", "missing type property", "invalid JSON"]):
        await exchange.publish(
            aio_pika.Message(b"%d" % n, headers={"x-bulk-recorder-error": reason}), "x"
        )
    env = settings_env(settings)

    def cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "consumer.cli", "dlq", *args],
            cwd=REPO,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    inspect = await asyncio.to_thread(cli, "inspect", "--json")
    assert inspect.returncode == 0, inspect.stderr
    groups = {g["reason"]: g["count"] for g in json.loads(inspect.stdout)["groups"]}
    assert groups == {"invalid JSON": 2, "missing type property": 1}
    dry = await asyncio.to_thread(cli, "replay", "--reason", "invalid JSON", "--dry-run")
    assert dry.returncode == 0, dry
    assert "would replay 2 messages" in dry.stdout
    limited = await asyncio.to_thread(cli, "replay", "--dry-run", "--limit", "1")
    assert limited.returncode == 0, limited
    assert "would replay 1 messages of every reason (the first 1 of 3)" in limited.stdout
    as_json = await asyncio.to_thread(
        cli, "replay", "--reason", "invalid JSON", "--dry-run", "--json"
    )
    assert as_json.returncode == 0, as_json
    plan = json.loads(as_json.stdout)  # one document, nothing else on stdout
    assert (plan["action"], plan["dry_run"], plan["would_move"]) == ("replay", True, 2)
    assert (plan["reason"], plan["of"]) == ("invalid JSON", 2)
    assert {g["reason"]: g["count"] for g in plan["groups"]} == {"invalid JSON": 2}
    refused = await asyncio.to_thread(cli, "replay", "--json")
    assert refused.returncode == 2, refused  # --json only shows a plan: it needs --dry-run
    assert "--json needs --dry-run" in refused.stderr
    discard = ["dlq", "discard", "--reason", "invalid JSON"]
    declined = await asyncio.to_thread(run_cli_on_terminal, discard, env, "n\n")
    assert declined.returncode == 1, declined
    assert "nothing discarded" in declined.stdout
    no_answer = await asyncio.to_thread(cli, "discard", "--reason", "invalid JSON", stdin="y\n")
    assert no_answer.returncode == 2, no_answer  # no terminal, no --yes: nothing read or removed
    assert "pass --yes" in no_answer.stderr
    assert [c[0] for c in await dlq_contents(broker, settings.dead_letter_queue)] == [
        b"0",
        b"1",
        b"2",
    ]
    confirmed = await asyncio.to_thread(run_cli_on_terminal, discard, env, "y\n")
    assert confirmed.returncode == 0, confirmed
    assert "discarded 2 of 3" in confirmed.stdout
    assert [c[0] for c in await dlq_contents(broker, settings.dead_letter_queue)] == [b"1"]
    yes = await asyncio.to_thread(cli, "discard", "--reason", "missing type property", "--yes")
    assert yes.returncode == 0, yes
    assert "discarded 1 of 1" in yes.stdout
    assert await broker.ready_count(settings.dead_letter_queue) == 0
