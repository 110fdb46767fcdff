"""Publishers other than aio-pika (pika; Node's amqplib) and the exact checks of what the
recorder made of their messages: a row equal to the record, or a dead letter with its reason."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pika
import pytest

from tests.conftest import Broker, wait_for
from tests.integration.dlq_support import dlq_contents

NODE_CLIENT = Path(__file__).resolve().parents[1] / "clients" / "node"


@dataclass
class Sent:
    """What one test published: records that must be recorded, bodies that must be
    dead-lettered with a reason that starts with the one given."""

    recorded: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    dead: dict[bytes, str] = field(default_factory=dict)


def pika_publish(url: str, exchange: str, messages: list[tuple[bytes, str, Any]]) -> None:
    """(body, routing key, pika.BasicProperties) each, confirmed and mandatory."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for body, routing_key, properties in messages:
            channel.basic_publish(exchange, routing_key, body, properties, mandatory=True)
    finally:
        connection.close()


def node_ready() -> None:
    """amqplib installed from tests/clients/node (make node-clients); installed here if it
    is missing. No npm or node is a failure, not a skip: the proof would be missing."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are needed for the amqplib publisher (Node >= 18)")
    if not (NODE_CLIENT / "node_modules" / "amqplib").is_dir():
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_CLIENT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"npm ci in {NODE_CLIENT} failed: {done.stderr[-2000:]}")


def node_publish(url: str, messages: list[dict[str, Any]]) -> str:
    """Each {"exchange", "routingKey", "body": bytes, "options": {...}} through amqplib."""
    spec = {
        "url": url,
        "messages": [{**m, "body": base64.b64encode(m["body"]).decode()} for m in messages],
    }
    done = subprocess.run(
        ["node", str(NODE_CLIENT / "publish.js")],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


async def _rows(conn: Any) -> int:
    return int(
        await conn.fetchval(
            "SELECT (SELECT count(*) FROM transactions) + (SELECT count(*) FROM credit_annotations)"
        )
    )


async def settle(broker: Broker, conn: Any, sent: Sent) -> None:
    """Wait until every message is a row or a dead letter; then there must be exactly as many
    rows as records."""
    queue = broker.topology.dead_letter_queue

    async def done() -> bool:
        settled = await _rows(conn) + await broker.ready_count(queue)
        return settled >= len(sent.recorded) + len(sent.dead)

    await wait_for(done, timeout=60)
    rows = await _rows(conn)
    assert rows == len(sent.recorded), f"{rows} rows for {len(sent.recorded)} records"


async def check_exact(broker: Broker, conn: Any, sent: Sent) -> None:
    """Every record's row equals it, digit for digit; every dead letter has its reason; the
    main queue is empty: nothing dropped."""
    await settle(broker, conn, sent)
    for record_type, record in sent.recorded:
        if record_type == "transaction":
            await _check_transaction(conn, record)
        else:
            await _check_annotation(conn, record)
    got = {
        body: reason
        for body, _, reason in await dlq_contents(broker, broker.topology.dead_letter_queue)
    }
    assert set(got) == set(sent.dead)
    for body, reason in sent.dead.items():
        assert got[body].startswith(reason), (body[:60], got[body], reason)
    await wait_for(lambda: _empty(broker))


async def _empty(broker: Broker) -> bool:
    return await broker.ready_count(broker.topology.queue) == 0


async def _check_transaction(conn: Any, tx: dict[str, Any]) -> None:
    row = await conn.fetchrow(
        "SELECT status, asset_code, amount, organization_id::text, ledger_id::text, "
        "description, metadata FROM transactions WHERE id = $1",
        tx["id"],
    )
    assert row is not None, f"transaction {tx['id']} not recorded"
    assert (row["status"], row["asset_code"], row["amount"]) == (
        tx["status"],
        tx["asset_code"],
        Decimal(tx["amount"]),
    )
    assert (row["organization_id"], row["ledger_id"]) == (tx["organization_id"], tx["ledger_id"])
    assert row["description"] == tx.get("description")
    assert json.loads(row["metadata"]) == tx.get("metadata")
    ops = await conn.fetch(
        "SELECT id::text, account_id::text, type, amount, asset_code FROM operations "
        "WHERE transaction_id = $1 ORDER BY id",
        tx["id"],
    )
    want = sorted(tx["operations"], key=lambda op: op["id"])
    assert [(o["id"], o["account_id"], o["type"], o["amount"], o["asset_code"]) for o in ops] == [
        (op["id"], op["account_id"], op["type"], Decimal(str(op["amount"])), op["asset_code"])
        for op in want
    ]


async def _check_annotation(conn: Any, ann: dict[str, Any]) -> None:
    row = await conn.fetchrow(
        "SELECT document, kind, creditor, amount, occurred_on::text, reason "
        "FROM credit_annotations WHERE id = $1",
        ann["id"],
    )
    assert row is not None, f"credit annotation {ann['id']} not recorded"
    digits = "".join(c for c in ann["document"] if c.isalnum()).upper()
    assert (row["document"], row["kind"], row["creditor"]) == (digits, ann["kind"], ann["creditor"])
    assert (row["amount"], row["occurred_on"], row["reason"]) == (
        Decimal(str(ann["amount"])),
        ann["occurred_on"],
        ann.get("reason"),
    )


async def run_in_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)
