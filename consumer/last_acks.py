"""The orderly stop's wait for a quorum queue to apply the last acks (:mod:`consumer.consuming`).

An orderly stop lets the broker apply its last acks before closing. AMQP 0-9-1 has no ack
confirmation, and a quorum queue's channel (RabbitMQ 3.10, rabbit_fifo_client) holds back
settles once 32 of its commands are unapplied, sends them as those are applied (about a
millisecond on a quiet broker), and drops what it still holds when the channel ends: an ack
lost after a release leaves its message twice in the queue. Measured: 217 of 250 acks written
just before a close were lost; none after a round trip and a 0.2 s linger on a quiet machine,
and 217 again with that linger in a make mutants run (a loaded broker). So the close waits for
the sign that they are applied: a quorum queue keeps a cancelled consumer while it holds
unacked deliveries of it, so the queue's consumer count falls below the count the stop read
just before its cancel once the acks are applied. It waits up to LAST_ACKS_WAIT_S (another
recorder starting meanwhile keeps the count up), within the stop budget; a channel whose
count the stop could not read lingers LAST_ACKS_LINGER_S, as before.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Mapping, Sequence

from aiormq.abc import AbstractChannel

from consumer.queue_count import consumers_below, timed_count

log = logging.getLogger(__name__)

LAST_ACKS_WAIT_S = 5.0
LAST_ACKS_LINGER_S = 0.2


async def consumers_with_ours(channel: AbstractChannel, queue: str) -> int | None:
    """``queue``'s consumers, ours among them, read just before the stop's cancel; None when
    there is no count (a leader too slow to count, or none counted)."""
    count = await timed_count(lambda: channel.queue_declare(queue, passive=True))
    return count.consumers if count.counted and count.consumers > 0 else None


async def wait_applied(
    by_queue: Mapping[str, AbstractChannel],
    with_ours: Mapping[str, int],
    consuming: Sequence[AbstractChannel],
) -> None:
    """Until each queue in ``with_ours`` shows our cancelled consumer gone (its acks applied),
    :data:`LAST_ACKS_WAIT_S` at most; :data:`LAST_ACKS_LINGER_S` if a channel of ``consuming``
    has no such count."""
    counted: set[int] = set()
    for queue, before in with_ours.items():
        channel = by_queue.get(queue)
        if channel is None or channel.is_closed:
            continue
        counted.add(id(channel))
        declare = functools.partial(channel.queue_declare, queue, passive=True)
        if not await consumers_below(declare, before, LAST_ACKS_WAIT_S):
            log.warning(
                "%s still counted %d consumers %g s after our cancel and acks: closing; "
                "an ack it had not applied yet comes back as a redelivery",
                queue,
                before,
                LAST_ACKS_WAIT_S,
            )
    if any(id(c) not in counted and not c.is_closed for c in consuming):
        await asyncio.sleep(LAST_ACKS_LINGER_S)
