"""``bulk-recorder dlq inspect|replay|discard``: the dead-letter queue, by hand, by reason.

inspect
    Reads every message of ``<RABBITMQ_QUEUE>.dlq`` with basic.get and acks none. Prints counts
    by reason group, first and last seen (see :mod:`consumer.tools.dlq_groups`) and a few
    samples (``--json``: the same as one JSON document). Every message is nacked back
    (requeue) in the order read: a quorum queue returns a closed channel's unacked messages in
    an order of its own, so closing the channel would reorder the DLQ. Interrupting it removes
    nothing.

replay [--reason R] [--limit N] [--dry-run]
    Moves messages back to ``RABBITMQ_EXCHANGE`` with routing key = their ``type`` property,
    after a fix (a schema change, a deleted conflicting row, a corrected producer). Body,
    ``message_id`` and every other property are kept, so the recorder's insert (ON CONFLICT on
    the record's id) absorbs a message replayed twice. Each is published with a broker confirm
    BEFORE it is acked from the DLQ: an interruption between the two leaves it in both places
    (the recorder records it once), never in neither. Our error headers and the broker's death
    headers are dropped; ``x-bulk-recorder-replays`` counts the replays. With ``--reason`` (or
    ``--dry-run``) it first shows what it would move, from a pass that moves nothing; then
    (without ``--dry-run``) a second pass moves exactly the messages shown (with ``--limit N``,
    the first N shown), identified by their fingerprints (:mod:`consumer.tools.dlq_identity`),
    whatever was dead-lettered meanwhile. The others are read without ack and nacked back in
    the order read, so they keep their order; if the command is killed, the broker returns them
    itself (none lost, their order may change).

discard --reason R [--yes]
    Shows what it would remove, asks (unless ``--yes``), then acks exactly the messages it
    showed, found by their fingerprints: the only command that removes a message for good. A
    message dead-lettered since, of the same reason, stays; so do the others, as above.

Every pass takes at most the messages the DLQ held when it started, so a message the running
recorder dead-letters again during a replay is not replayed in a loop (and its fingerprint has
changed: a new reason header and time). What was dead-lettered while a pass read is read too,
however much, and given back behind the rest (:func:`consumer.tools.dlq_pass.hold_arrivals`):
past ``HOLD_ARRIVALS_MAX`` newcomers (100,000), or ``HOLD_ARRIVALS_S`` (60 s) of reading them,
the command says on stderr that the DLQ's order is no longer assured, and exits 1 once its work
is done.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from consumer.copy_properties import ORIGINAL_DELIVERY_MODE_HEADER
from consumer.delivery import (
    DEAD_LETTERED_AT_HEADER,
    ERROR_HEADER,
    ORIGINAL_EXCHANGE_HEADER,
    ORIGINAL_ROUTING_KEY_HEADER,
    RETRIES_HEADER,
)
from consumer.tools.dlq_groups import Groups, reason_group, sample
from consumer.tools.dlq_groups import reason_of as reason_of
from consumer.tools.dlq_identity import Plan
from consumer.tools.dlq_pass import (
    GET_TIMEOUT,
    Kept,
    Pass,
    Take,
    connect,
    hold_arrivals,
    open_dlq,
)
from consumer.topology import Topology, declare_topology
from settings import Settings

log = logging.getLogger(__name__)

REPLAY_HEADER = "x-bulk-recorder-replays"
# Headers that describe the message's death, not the message: dropped on replay.
DEATH_HEADERS = frozenset(
    {
        ERROR_HEADER,
        DEAD_LETTERED_AT_HEADER,
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


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else None


def replayed_message(message: AbstractIncomingMessage) -> tuple[aio_pika.Message, str]:
    """The message to publish back, and its routing key (the record type): the body and every
    property of the dead letter, with the delivery mode the publisher chose (the dead letter
    itself is persistent). ``expiration`` and ``user_id`` stay in their headers
    (docs/messages.md, "Message properties")."""
    headers = {k: v for k, v in (message.headers or {}).items() if k not in DEATH_HEADERS}
    previous = headers.get(REPLAY_HEADER)
    headers[REPLAY_HEADER] = (previous if isinstance(previous, int) else 0) + 1
    mode = headers.pop(ORIGINAL_DELIVERY_MODE_HEADER, None)
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
        reply_to=message.reply_to,
        priority=message.priority,
        timestamp=message.timestamp,
        app_id=message.app_id,
        delivery_mode=(
            aio_pika.DeliveryMode.NOT_PERSISTENT
            if mode == aio_pika.DeliveryMode.NOT_PERSISTENT
            else aio_pika.DeliveryMode.PERSISTENT
        ),
    )
    return out, routing_key


def _sample_line(message: AbstractIncomingMessage, reason: str) -> str:
    return f"[{reason}] type={message.type} body: {sample(message.body)}"


async def _survey(
    settings: Settings,
    wanted: Callable[[str], bool],
    samples: int,
    plan: Plan | None = None,
    limit: int | None = None,
) -> tuple[Groups, bool] | None:
    """One pass that moves nothing: the groups of the messages whose reason is ``wanted``;
    the first ``limit`` of them (all by default) go into ``plan``, the messages shown. With
    them, whether the DLQ is back in its order (False: more arrived than the pass holds)."""
    connection = await connect(settings)
    if connection is None:
        return None
    groups = Groups(samples)
    async with connection:
        opened = await open_dlq(settings, connection)
        if opened is None:
            return None
        queue, total = opened
        kept = Kept(queue.name)
        try:
            for index in range(total):
                message = await queue.get(no_ack=False, fail=False, timeout=GET_TIMEOUT)
                if message is None:
                    break
                kept.add(index, message)
                reason = reason_of(message.headers)
                if wanted(reason):
                    shown = _sample_line(message, reason) if groups.wants_sample(reason) else None
                    groups.add(message.headers, message.timestamp, reason, shown)
                    if plan is not None and (limit is None or len(plan) < limit):
                        plan.add(message)
            in_order = await hold_arrivals(queue, kept, total)
        finally:
            await kept.give_back()
    return groups, in_order


def _every(reason: str) -> bool:
    return True


def _of_group(group: str) -> Callable[[str], bool]:
    wanted = reason_group(group)
    return lambda reason: reason_group(reason) == wanted


async def inspect_dlq(
    settings: Settings, samples: int = 3, out: TextIO | None = None, as_json: bool = False
) -> int:
    """Print counts by reason group, first/last seen and samples; remove nothing. Exit 1 also
    when the DLQ could not be left in its order (stderr says why)."""
    out = out or sys.stdout
    surveyed = await _survey(settings, _every, samples)
    if surveyed is None:
        return 1
    groups, in_order = surveyed
    if as_json:
        print(json.dumps(groups.as_json(settings.dead_letter_queue), indent=2), file=out)
    else:
        print("\n".join(groups.lines(settings.dead_letter_queue)), file=out)
    return 0 if in_order else 1


async def _plan(
    settings: Settings,
    action: str,
    reason: str | None,
    samples: int,
    out: TextIO,
    limit: int | None = None,
    as_json: bool = False,
) -> tuple[Plan, bool] | None:
    """Show what ``action`` would take: how many messages (at most ``limit``), of which
    groups (``as_json``: as one JSON document); the messages shown, and whether the DLQ is back
    in its order. None: the broker or the DLQ could not be reached."""
    plan = Plan()
    wanted = _every if reason is None else _of_group(reason)
    surveyed = await _survey(settings, wanted, samples, plan, limit)
    if surveyed is None:
        return None
    groups, in_order = surveyed
    which = "every reason" if reason is None else f"reason {reason_group(reason)!r}"
    count = len(plan)
    if as_json:
        document = {"action": action, "dry_run": True, "would_move": count, "of": groups.total}
        document["reason"] = None if reason is None else reason_group(reason)
        document |= groups.as_json(settings.dead_letter_queue)
        print(json.dumps(document, indent=2), file=out)
        return plan, in_order
    first = "" if count == groups.total else f" (the first {count} of {groups.total})"
    print(f"would {action} {count} messages of {which}{first}", file=out)
    if groups.total:
        print("\n".join(groups.lines(settings.dead_letter_queue)[1:]), file=out)
    return plan, in_order


def _replay_to(settings: Settings) -> Callable[[aio_pika.abc.AbstractConnection], Awaitable[Take]]:
    async def make(connection: aio_pika.abc.AbstractConnection) -> Take:
        # the main exchange on a confirm channel whose returns raise, the topology declared
        target = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await declare_topology(target, Topology.from_settings(settings))
        exchange = await target.get_exchange(settings.rabbitmq_exchange)

        async def move(message: AbstractIncomingMessage) -> None:
            body, routing_key = replayed_message(message)
            # mandatory: a message no queue would take is refused, not silently dropped;
            # confirmed BEFORE the original is acked
            await exchange.publish(body, routing_key=routing_key, mandatory=True)
            await message.ack()

        return move

    return make


async def _discard(connection: aio_pika.abc.AbstractConnection) -> Take:
    async def remove(message: AbstractIncomingMessage) -> None:
        await message.ack()

    return remove


def _report(settings: Settings, done: Pass, verb: str, target: str, out: TextIO) -> int:
    """Print what was taken, by reason group; the exit code (1 if one could not be)."""
    print(
        f"{verb} {done.taken.total} of {done.total} messages from {settings.dead_letter_queue}"
        f"{target}",
        file=out,
    )
    for group in done.taken.ordered():
        print(f"{group.count:>8}  {group.reason}", file=out)
    if done.plan and not done.failures:
        print(f"{len(done.plan)} of the messages shown were no longer in the DLQ", file=out)
    if done.failures:
        print(
            f"bulk-recorder dlq: {len(done.failures)} messages could not be {verb}, they stay "
            f"in the dead-letter queue; first: {done.failures[0]}",
            file=sys.stderr,
        )
        return 1
    return 0


async def replay_dlq(
    settings: Settings,
    limit: int | None = None,
    out: TextIO | None = None,
    *,
    reason: str | None = None,
    dry_run: bool = False,
    samples: int = 3,
    as_json: bool = False,
) -> int:
    """Move up to ``limit`` messages (all by default; with ``reason``, of that group only)
    back to the main exchange. With ``reason`` or ``dry_run``, first show what would move; a
    dry run stops there. Returns the exit code (1 if a publish was refused, or the DLQ could
    not be left in its order)."""
    out = out or sys.stdout
    planned, in_order = None, True
    if reason is not None or dry_run:
        shown = await _plan(settings, "replay", reason, samples, out, limit, as_json and dry_run)
        if shown is None:
            return 1
        planned, in_order = shown
        if dry_run:
            if not as_json:
                print("dry run: nothing moved", file=out)
            return 0 if in_order else 1
    done = Pass(_every if reason is None else _of_group(reason), plan=planned)
    if not await done.over(settings, _replay_to(settings), limit):
        return 1
    code = _report(settings, done, "replayed", f" to exchange {settings.rabbitmq_exchange}", out)
    return code or int(not (in_order and done.in_order))


async def discard_dlq(
    settings: Settings,
    reason: str,
    confirm: Callable[[str], bool],
    out: TextIO | None = None,
    *,
    samples: int = 3,
) -> int:
    """Remove the messages of one reason group for good, after ``confirm`` (asked with the
    count shown): exactly those shown, so a message dead-lettered since is not removed unseen."""
    out = out or sys.stdout
    shown = await _plan(settings, "discard", reason, samples, out)
    if shown is None:
        return 1
    planned, in_order = shown
    if not planned:
        return 0 if in_order else 1
    question = f"discard these {len(planned)} messages for good? [y/N] "
    if not await asyncio.to_thread(confirm, question):
        print("nothing discarded", file=out)
        return 1
    done = Pass(_of_group(reason), plan=planned)
    if not await done.over(settings, _discard, None):
        return 1
    return _report(settings, done, "discarded", "", out) or int(not (in_order and done.in_order))
