"""A queue's messages ready and consumers from a passive declare, and whether that is a count.

RabbitMQ 3.10 gives a quorum queue's leader :data:`STAT_TIMEOUT_S` to count for a passive
declare (``rabbit_quorum_queue:stat/2``) and, when the leader is late (a busy or suspended
process, a node held to its CPU quota), answers 0 messages and 0 consumers: the answer of an
empty queue that nobody consumes. So an answer of 0 and 0 that took :data:`STAT_TIMEOUT_S` or
longer is no count (the queue may hold records); every other answer is one. The rule is
one-sided: the broker's timeout answer cannot come sooner, and a genuine 0 and 0 that came
late is only asked again. The classic queues (the route lock) answer from their own process
and are never late in this way; the rule costs them nothing.

Every reader of a queue's count goes through :func:`timed_count`: ``shards prune`` (a shard it
took for drained is deleted), ``shards status``, the queue watch (its gauges and the leftover
shards it lets go of), the ``dlq`` commands (how many dead letters a pass reads) and
``benchmarks/bench_shards.py``'s probe.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

STAT_TIMEOUT_S = 0.25


class DeclareAnswer(Protocol):
    """Queue.DeclareOk, as aiormq and aio-pika give it."""

    @property
    def message_count(self) -> int | None: ...

    @property
    def consumer_count(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class QueueCount:
    ready: int
    consumers: int
    counted: bool  # False: 0 and 0 answered too late to be a count (STAT_TIMEOUT_S)

    @property
    def empty(self) -> bool:
        """Counted, and nothing ready in it."""
        return self.counted and self.ready == 0

    @property
    def drained(self) -> bool:
        """Counted, nothing ready and no consumer (so nothing unacked: a quorum queue keeps a
        consumer while it holds a delivery unacked)."""
        return self.empty and self.consumers == 0

    def reading(self) -> int | None:
        """The ready count, or None when there is none."""
        return self.ready if self.counted else None


def answered(ready: int | None, consumers: int | None, seconds: float) -> QueueCount:
    """A passive declare's answer of ``ready`` and ``consumers``, ``seconds`` after it was asked."""
    ready, consumers = int(ready or 0), int(consumers or 0)
    counted = ready > 0 or consumers > 0 or seconds < STAT_TIMEOUT_S
    return QueueCount(ready, consumers, counted)


async def timed_count(declare: Callable[[], Awaitable[DeclareAnswer]]) -> QueueCount:
    """Run the passive declare ``declare`` and read its answer with the time it took (measured
    around the await: a busy event loop can only make it longer, so only ask again)."""
    asked = time.monotonic()
    declared = await declare()
    return answered(declared.message_count, declared.consumer_count, time.monotonic() - asked)


async def count_within(
    declare: Callable[[], Awaitable[DeclareAnswer]], seconds: float, pause_s: float = 0.1
) -> QueueCount:
    """:func:`timed_count` again every ``pause_s`` until it is a count or ``seconds`` passed;
    the last answer (``counted`` False if none was a count)."""
    import asyncio  # here: `bulk-recorder --help` imports this module (shards) and no asyncio

    deadline = time.monotonic() + seconds
    while True:
        count = await timed_count(declare)
        if count.counted or time.monotonic() >= deadline:
            return count
        await asyncio.sleep(pause_s)


async def consumers_below(
    declare: Callable[[], Awaitable[DeclareAnswer]],
    bound: int,
    seconds: float,
    pause_s: float = 0.005,
    most_pause_s: float = 0.05,
) -> bool:
    """Ask again until a count shows fewer than ``bound`` consumers: True; False once ``seconds``
    passed without one. The pause between asks doubles from ``pause_s`` to ``most_pause_s``."""
    import asyncio

    deadline = time.monotonic() + seconds
    while True:
        count = await timed_count(declare)
        if count.counted and count.consumers < bound:
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(pause_s)
        pause_s = min(2 * pause_s, most_pause_s)
