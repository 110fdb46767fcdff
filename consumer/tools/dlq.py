"""``bulk-recorder dlq inspect`` and ``bulk-recorder dlq replay``: the dead-letter queue, by hand.

inspect
    Reads every message of ``<RABBITMQ_QUEUE>.dlq`` with basic.get and acks none: they stay
    unacked until the channel closes, then go back to the queue. Prints counts by reason (our
    ``x-bulk-recorder-error`` header, or the broker's ``x-death`` reason for messages the broker
    dead-lettered itself) and a few sample bodies a reason. Interrupting it changes nothing.

replay
    Moves messages back to ``RABBITMQ_EXCHANGE`` with routing key = their ``type`` property,
    after a fix (a schema change, a deleted conflicting row, a corrected producer). Each message
    is published with a broker confirm BEFORE it is acked from the DLQ, so an interruption can
    at worst publish a message twice (the recorder's idempotent insert absorbs it) and never
    loses one. Our error headers and the broker's death headers are dropped; the
    ``x-bulk-recorder-replays`` header counts how many times a message was replayed.

Both read at most the number of messages the DLQ held when they started, so a message the
running recorder dead-letters again during a replay is not replayed in a loop.
"""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from collections import Counter
from typing import Any, TextIO

import aio_pika
import aiormq
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from bulk_recorder.infra.broker import BrokerNodes, endpoint, split_urls
from bulk_recorder.infra.errors import BROKER_ERRORS
from consumer.delivery import (
    ERROR_HEADER,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
    RETRIES_HEADER,
)
from consumer.topology import Topology, declare_topology
from settings import Settings

log = logging.getLogger(__name__)

REPLAY_HEADER = "x-bulk-recorder-replays"
# Headers that describe the message's death, not the message: dropped on replay.
DEATH_HEADERS = frozenset(
    {
        ERROR_HEADER,
        ORIGINAL_EXCHANGE_HEADER,
        ORIGINAL_ROUTING_KEY_HEADER,
        RETRIES_HEADER,  # releases during an outage: a replayed message starts afresh
        "x-death",
        "x-delivery-count",
        "x-first-death-exchange",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-last-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
    }
)
SAMPLE_BYTES = 300
REPLAY_WINDOW = 200  # publishes awaiting their confirm at once
# basic.get without aio-pika's default 5 s timeout: on Python 3.11 that timeout goes through
# asyncio.wait_for, which can swallow a cancellation (Ctrl-C) that arrives as the reply lands.
GET_TIMEOUT = None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else None


def reason_of(headers: dict[str, Any] | None) -> str:
    """Why a message is in the DLQ: our header, else the broker's x-death reason."""
    headers = headers or {}
    ours = _text(headers.get(ERROR_HEADER))
    if ours is not None:
        return ours
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        death = deaths[0]
        cause = _text(death.get("reason")) or "unknown"
        queue = _text(death.get("queue")) or "?"
        return f"broker: {cause} (from {queue})"
    return "unknown (no reason header)"


def reason_group(reason: str) -> str:
    """A reason with its numbers blanked, so that 'debits 1.00 != credits 2.00' and
    'debits 3.10 != credits 0.01' count as one line."""
    return re.sub(r"[0-9]+", "#", reason)


def replayed_message(message: AbstractIncomingMessage) -> tuple[aio_pika.Message, str]:
    """The message to publish back, and its routing key (the record type)."""
    headers = {k: v for k, v in (message.headers or {}).items() if k not in DEATH_HEADERS}
    previous = headers.get(REPLAY_HEADER)
    headers[REPLAY_HEADER] = (previous if isinstance(previous, int) else 0) + 1
    original_key = _text((message.headers or {}).get(ORIGINAL_ROUTING_KEY_HEADER))
    routing_key = message.type or original_key or "untyped"
    out = aio_pika.Message(
        body=message.body,
        headers=headers,
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        type=message.type,
        message_id=message.message_id,
        correlation_id=message.correlation_id,
        timestamp=message.timestamp,
        app_id=message.app_id,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )
    return out, routing_key


def _sample(body: bytes) -> str:
    text = body[:SAMPLE_BYTES].decode("utf-8", errors="replace")
    shown = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return shown + (f" ... ({len(body)} bytes)" if len(body) > SAMPLE_BYTES else "")


async def _open_dlq(
    settings: Settings, connection: aio_pika.abc.AbstractConnection
) -> AbstractQueue | None:
    channel = await connection.channel()
    try:
        return await channel.declare_queue(settings.dead_letter_queue, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        print(
            f"bulk-recorder dlq: queue {settings.dead_letter_queue} does not exist",
            file=sys.stderr,
        )
        return None


async def _connect(settings: Settings) -> aio_pika.abc.AbstractConnection | None:
    try:
        return await BrokerNodes.from_setting(settings.rabbitmq_url).connect()
    except BROKER_ERRORS as exc:
        where = ", ".join(endpoint(url) for url in split_urls(settings.rabbitmq_url))
        print(f"bulk-recorder dlq: cannot reach RabbitMQ at {where}: {exc}", file=sys.stderr)
        return None


async def inspect_dlq(settings: Settings, samples: int = 3, out: TextIO | None = None) -> int:
    """Print counts by reason and sample bodies; remove nothing. Returns the exit code."""
    out = out or sys.stdout
    connection = await _connect(settings)
    if connection is None:
        return 1
    async with connection:
        queue = await _open_dlq(settings, connection)
        if queue is None:
            return 1
        total = int(queue.declaration_result.message_count or 0)
        counts: Counter[str] = Counter()
        examples: dict[str, list[str]] = {}
        seen = 0
        # Nothing is acked: every message goes back to the queue when the channel closes.
        while seen < total:
            message = await queue.get(no_ack=False, fail=False, timeout=GET_TIMEOUT)
            if message is None:
                break
            seen += 1
            reason = reason_of(message.headers)
            group = reason_group(reason)
            counts[group] += 1
            kept = examples.setdefault(group, [])
            if len(kept) < samples:
                kept.append(f"[{reason}] type={message.type} body: {_sample(message.body)}")
    print(f"dead-letter queue {settings.dead_letter_queue}: {seen} messages", file=out)
    if counts:
        print(f"{'count':>8}  reason", file=out)
        for group, count in counts.most_common():
            print(f"{count:>8}  {group}", file=out)
    if samples and examples:
        print("samples:", file=out)
        for group, _ in counts.most_common():
            for line in examples[group]:
                print(f"  {line}", file=out)
    return 0


async def _replay_exchange(
    settings: Settings, connection: aio_pika.abc.AbstractConnection
) -> aio_pika.abc.AbstractExchange:
    """The main exchange on a confirm channel whose returns raise, the topology declared."""
    target = await connection.channel(publisher_confirms=True, on_return_raises=True)
    await declare_topology(target, Topology.from_settings(settings))
    return await target.get_exchange(settings.rabbitmq_exchange)


def _replay_report(
    settings: Settings, moved: Counter[str], failures: list[str], total: int, out: TextIO
) -> int:
    """Print what was replayed, by reason group; the exit code (1 if a publish was refused)."""
    count = sum(moved.values())
    print(
        f"replayed {count} of {total} messages from {settings.dead_letter_queue} "
        f"to exchange {settings.rabbitmq_exchange}",
        file=out,
    )
    for group, n in moved.most_common():
        print(f"{n:>8}  {group}", file=out)
    if failures:
        print(
            f"bulk-recorder dlq: {len(failures)} publishes refused, those messages stay in the "
            f"dead-letter queue; first: {failures[0]}",
            file=sys.stderr,
        )
        return 1
    return 0


async def replay_dlq(
    settings: Settings, limit: int | None = None, out: TextIO | None = None
) -> int:
    """Move up to ``limit`` messages (all by default) back to the main exchange.

    Publish with confirm first, ack from the DLQ second: interrupting may duplicate a message,
    never lose one. Returns the exit code (1 if a publish was refused).
    """
    out = out or sys.stdout
    connection = await _connect(settings)
    if connection is None:
        return 1
    moved: Counter[str] = Counter()
    failures: list[str] = []
    async with connection:
        queue = await _open_dlq(settings, connection)
        if queue is None:
            return 1
        exchange = await _replay_exchange(settings, connection)
        total = int(queue.declaration_result.message_count or 0)
        todo = total if limit is None else min(limit, total)
        window = asyncio.Semaphore(REPLAY_WINDOW)
        tasks: set[asyncio.Task[None]] = set()

        async def move(message: AbstractIncomingMessage) -> None:
            try:
                body, routing_key = replayed_message(message)
                # mandatory: a message no queue would take is refused, not silently dropped
                await exchange.publish(body, routing_key=routing_key, mandatory=True)
            except Exception as exc:  # stays in the DLQ: not acked, back on channel close
                failures.append(f"{type(exc).__name__}: {exc}")
                return
            finally:
                window.release()
            try:
                await message.ack()
            except BROKER_ERRORS as exc:  # published, not acked: it will be replayed again
                failures.append(f"ack failed after publish: {exc}")
                return
            moved[reason_group(reason_of(message.headers))] += 1

        try:
            for _ in range(todo):
                await window.acquire()
                if failures:
                    window.release()
                    break
                message = await queue.get(no_ack=False, fail=False, timeout=GET_TIMEOUT)
                if message is None:
                    window.release()
                    break
                task = asyncio.create_task(move(message))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:  # interrupted: unacked messages return to the DLQ on close
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return _replay_report(settings, moved, failures, total, out)
