"""One pass over the dead-letter queue: messages read with basic.get and no ack, some taken
(replayed, discarded), the others nacked back in the order read.

A quorum queue returns a closed channel's unacked messages in an order of its own (RabbitMQ
3.10: read 1..19, close, and they come back 10, 11, 13, ..., 1, 19, 2, ...) and puts returned
messages behind the ready ones; nacks with requeue, paced and sent in the order read after the
whole DLQ was read, put them back in their order. If the process is killed or interrupted, the
broker returns them itself: none lost, their order may change.

A message dead-lettered while a pass reads (a running recorder) is read too, and kept, before
the pass gives back (:func:`hold_arrivals`): it goes back behind the messages that were there,
in its place, however many arrive, up to ``HOLD_ARRIVALS_MAX`` read within ``HOLD_ARRIVALS_S``.
Past those bounds, and while the pass is giving back, a newcomer goes ahead of those not yet
given back.
A pass that takes (discard, replay after a survey) takes by identity, not by count
(:mod:`consumer.tools.dlq_identity`).

The DLQ is a quorum queue: its counts are read through :mod:`consumer.queue_count`, so that a
leader too slow to count (RabbitMQ 3.10 answers 0 and 0 then) is never read as an empty DLQ. A
pass asks again for up to ``DLQ_COUNT_WAIT_S``; with no count by then it reads nothing and says
so (exit 1).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aio_pika
import aiormq
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from bulk_recorder.infra.broker import BrokerNodes, endpoint, split_urls
from bulk_recorder.infra.errors import BROKER_ERRORS
from bulk_recorder.masking import masked
from consumer.queue_count import STAT_TIMEOUT_S, count_within, timed_count
from consumer.tools.dlq_groups import Groups, reason_of
from consumer.tools.dlq_identity import Plan
from settings import Settings

log = logging.getLogger(__name__)

REPLAY_WINDOW = 200  # publishes awaiting their confirm at once
# basic.get without aio-pika's default 5 s timeout: on Python 3.11 that timeout goes through
# asyncio.wait_for, which can swallow a cancellation (Ctrl-C) that arrives as the reply lands.
GET_TIMEOUT = None
# Messages a nack gives back: a return each, one batch unapplied at a time (Kept), under the
# 32 commands a quorum queue's channel keeps unapplied before it reorders what it holds back.
GIVE_BACK_CHUNK = 16
# The longest a give back waits for the consumer count to show a batch back; once one batch is
# not shown back in time, or the count rises (another client reads the DLQ), it waits no more.
GIVE_BACK_WAIT_S = 5.0
POLL_FIRST_S, POLL_MAX_S = 0.001, 0.05  # the consumer count is polled with a backoff
# What a pass holds of the messages dead-lettered while it read, to give them back behind the
# DLQ's (hold_arrivals): not bounded by the DLQ's size, which a burst from a bad deploy passes
# many times over, but by memory (a tag each here, an unacked message each in the broker) and
# time (a basic.get each: 3 ms on a small broker). Past either the order is no longer assured,
# and the command says so. Read when a pass holds, so that a test can set them.
HOLD_ARRIVALS_MAX = 100_000
HOLD_ARRIVALS_S = 60.0
# How long a pass asks the DLQ's count again while its leader answers too late to count.
DLQ_COUNT_WAIT_S = 5.0


async def open_dlq(
    settings: Settings, connection: aio_pika.abc.AbstractConnection
) -> tuple[AbstractQueue, int] | None:
    """The DLQ and the messages ready in it; None (said on stderr) if it does not exist or its
    leader gave no count within ``DLQ_COUNT_WAIT_S``."""
    channel = await connection.channel()
    try:
        queue = await channel.declare_queue(settings.dead_letter_queue, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        print(
            f"bulk-recorder dlq: queue {settings.dead_letter_queue} does not exist",
            file=sys.stderr,
        )
        return None
    count = await count_within(queue.declare, DLQ_COUNT_WAIT_S)
    if not count.counted:
        print(
            f"bulk-recorder dlq: no count of {queue.name} from its leader: for "
            f"{DLQ_COUNT_WAIT_S:g} s it answered 0 and 0 after {STAT_TIMEOUT_S:g} s or more, "
            "RabbitMQ's answer for a leader that does not count in time; nothing was read "
            "(run it again)",
            file=sys.stderr,
        )
        return None
    return queue, count.ready


async def connect(settings: Settings) -> aio_pika.abc.AbstractConnection | None:
    try:
        return await BrokerNodes.from_setting(settings.rabbitmq_url).connect()
    except BROKER_ERRORS as exc:
        where = ", ".join(endpoint(url) for url in split_urls(settings.rabbitmq_url))
        print(
            f"bulk-recorder dlq: cannot reach RabbitMQ at {where}: {masked(str(exc))}",
            file=sys.stderr,
        )
        return None


@dataclass
class Kept:
    """Messages read without ack that stay in the DLQ: nacked back (requeue) in the order they
    were read, so the DLQ keeps its order. Only tags are kept, not bodies.

    By the time they are given back every other message read on the channel is settled, so the
    unacked tags up to a kept one are exactly the kept ones: one ``basic.nack(multiple)`` per
    ``GIVE_BACK_CHUNK`` of them, each once the broker has applied everything sent before it.

    Why the pace: in a quorum queue each basic.get is a consumer of its own, so a nack of a batch
    is a return per message. The channel's client of the queue (RabbitMQ 3.10's
    rabbit_fifo_client) keeps at most 32 commands unapplied; past that it stashes returns and
    sends them together once under, in an order of its own (reversed: 200 nacks sent at once
    came back with the last ones first). So at most one batch of 16 is ever unapplied.

    What shows a batch applied is the queue's consumer count (a passive declare): each message
    read and not yet settled is a consumer, gone once its ack or return is applied. Before each
    nack, and after the last, a give back waits (polls with a backoff) until the count is down
    to the messages not yet given back. Nothing else moves that count: dead letters arriving
    raise the ready count, which a give back waiting on it took for its batch (a flood on a
    broker held to 0.3 of a core reordered 5 runs of 5). Another client reading the DLQ
    (a second ``dlq inspect``) adds consumers, so the count may never come down: the first
    wait not met within ``GIVE_BACK_WAIT_S``, or a count higher than the one before, ends the
    waiting, and the rest go back one batch per round trip (the order is then not assured, and
    a warning says so). So a give back waits ``GIVE_BACK_WAIT_S`` at most in all beyond the
    broker's own pace, not per batch.

    A returned message goes behind the messages ready at that moment, so every pass reads the
    whole DLQ (as it was when the pass started), and then what was dead-lettered while it read
    (:func:`hold_arrivals`), before giving back: the kept messages are then the whole DLQ, back
    in its order, the newcomers last. Only a message dead-lettered during the give back itself
    (or past ``hold_arrivals``' bounds) goes ahead of the batches not yet given back.
    """

    queue: str = ""
    tags: list[tuple[int, int]] = field(default_factory=list)  # (reading order, delivery tag)
    channel: aiormq.abc.AbstractChannel | None = None

    def add(self, index: int, message: AbstractIncomingMessage) -> None:
        self.channel = message.channel
        self.tags.append((index, message.delivery_tag or 0))

    async def _unsettled(self, channel: aiormq.abc.AbstractChannel) -> int | None:
        """The DLQ's consumers (this pass's reads not yet settled, and any other client's); None
        when its leader answered too late to count."""
        count = await timed_count(lambda: channel.queue_declare(self.queue, passive=True))
        return count.consumers if count.counted else None

    async def _settled_to(self, channel: aiormq.abc.AbstractChannel, left: int) -> bool:
        """Wait until the consumer count is ``left`` or fewer: False once ``GIVE_BACK_WAIT_S``
        passed, or if the count rose (another client reads). An answer that is no count is
        neither: it waits on."""
        loop = asyncio.get_running_loop()
        deadline, pause, last = loop.time() + GIVE_BACK_WAIT_S, POLL_FIRST_S, None
        while (count := await self._unsettled(channel)) is None or count > left:
            if (count is not None and last is not None and count > last) or (
                loop.time() > deadline
            ):
                return False
            last = count if count is not None else last
            await asyncio.sleep(pause)
            pause = min(2 * pause, POLL_MAX_S)
        return True

    async def _paced(self, channel: aiormq.abc.AbstractChannel, left: int, waiting: bool) -> bool:
        """Before a batch (and after the last): wait until ``left`` are unsettled, while
        ``waiting``; after that, a round trip only. Whether to wait on."""
        if not waiting:
            await self._unsettled(channel)
            return False
        if await self._settled_to(channel, left):
            return True
        log.warning("another client reads the DLQ; its order is not assured")
        return False

    async def give_back(self) -> None:
        channel, tags = self.channel, [tag for _, tag in sorted(self.tags)]
        self.tags = []
        if channel is None or channel.is_closed:
            return  # the broker has returned them with the channel
        waiting = True
        try:
            for start in range(0, len(tags), GIVE_BACK_CHUNK):
                waiting = await self._paced(channel, len(tags) - start, waiting)
                chunk = tags[start : start + GIVE_BACK_CHUNK]
                await channel.basic_nack(chunk[-1], multiple=True, requeue=True)
            await self._paced(channel, 0, waiting)
        except BROKER_ERRORS:  # the rest come back with the channel
            log.debug("nacking back the kept messages failed", exc_info=True)


async def hold_arrivals(
    queue: AbstractQueue,
    kept: Kept,
    start: int,
    most: int | None = None,
    seconds: float | None = None,
) -> bool:
    """Read and keep what was dead-lettered while the pass read, until none is ready, so that
    it goes back behind the messages the pass read, not ahead of them: however many, up to
    ``most`` messages (``HOLD_ARRIVALS_MAX``) read in ``seconds`` (``HOLD_ARRIVALS_S``). False
    if more were ready then: they go ahead of every message given back, and stderr says so."""
    most = HOLD_ARRIVALS_MAX if most is None else most
    seconds = HOLD_ARRIVALS_S if seconds is None else seconds
    loop = asyncio.get_running_loop()
    deadline, held = loop.time() + seconds, 0
    while held < most and loop.time() < deadline:
        message = await queue.get(no_ack=False, fail=False, timeout=GET_TIMEOUT)
        if message is None:
            return True
        kept.add(start + held, message)
        held += 1
    count = await count_within(queue.declare, DLQ_COUNT_WAIT_S)
    if not count.counted:
        print(
            f"bulk-recorder dlq: dead letters arrived while it read the DLQ, and its leader gave "
            f"no count of what is still ready ({STAT_TIMEOUT_S:g} s or more for 0 and 0, for "
            f"{DLQ_COUNT_WAIT_S:g} s): it gives {held:,} of them back behind the DLQ's messages; "
            "the order of the DLQ is not assured (run it again once dead letters stop arriving)",
            file=sys.stderr,
        )
        return False
    ahead = count.ready
    if ahead:
        why = (
            f"more than the {most:,} it holds" if held == most else f"for longer than {seconds:g} s"
        )
        print(
            f"bulk-recorder dlq: dead letters kept arriving while it read the DLQ, {why}: it "
            f"gives {held:,} of them back behind the DLQ's messages and leaves {ahead:,} still "
            "ready ahead of them all; the order of the DLQ is no longer assured (run it again "
            "once dead letters stop arriving)",
            file=sys.stderr,
        )
    return not ahead


Take = Callable[[AbstractIncomingMessage], Awaitable[None]]


@dataclass
class Pass:
    """One pass that takes messages: the selected ones go to ``take``, which settles them (at
    most ``REPLAY_WINDOW`` at once); the others, and those ``take`` could not settle, are
    nacked back in the order read. After the first failure, or ``limit`` taken, nothing more is
    taken, but the rest is still read (and kept), so that the order survives. With a ``plan``
    (what a survey showed) only the messages of the plan are taken, each at most once.
    ``in_order``: False once more arrived while it read than it holds (:func:`hold_arrivals`)."""

    selected: Callable[[str], bool]
    plan: Plan | None = None
    taken: Groups = field(default_factory=lambda: Groups(0))
    failures: list[str] = field(default_factory=list)
    kept: Kept = field(default_factory=Kept)
    total: int = 0
    in_order: bool = True

    async def _one(self, take: Take, index: int, message: AbstractIncomingMessage) -> None:
        try:
            await take(message)
        except Exception as exc:  # stays in the DLQ: nacked back (or back on channel close)
            self.failures.append(f"{type(exc).__name__}: {exc}")
            self.kept.add(index, message)
            return
        self.taken.add(message.headers, message.timestamp, reason_of(message.headers))

    def _chooses(self, message: AbstractIncomingMessage, chosen: int, limit: int | None) -> bool:
        if self.failures or not self.selected(reason_of(message.headers)):
            return False
        if self.plan is not None:
            return self.plan.spend(message)
        return limit is None or chosen < limit

    async def run(self, queue: AbstractQueue, take: Take, limit: int | None) -> None:
        window = asyncio.Semaphore(REPLAY_WINDOW)
        tasks: set[asyncio.Task[None]] = set()

        def done(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            window.release()

        chosen = 0
        try:
            for index in range(self.total):
                message = await queue.get(no_ack=False, fail=False, timeout=GET_TIMEOUT)
                if message is None:
                    break
                if not self._chooses(message, chosen, limit):
                    # read to the end all the same: returned messages go behind the ready ones
                    self.kept.add(index, message)
                    continue
                chosen += 1
                await window.acquire()
                task = asyncio.create_task(self._one(take, index, message))
                task.add_done_callback(done)
                tasks.add(task)
            self.in_order = await hold_arrivals(queue, self.kept, self.total)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:  # interrupted: unacked messages return to the DLQ on close
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.kept.give_back()

    async def over(
        self,
        settings: Settings,
        make_take: Callable[[aio_pika.abc.AbstractConnection], Awaitable[Take]],
        limit: int | None,
    ) -> bool:
        """Run over the DLQ; False if the broker or the DLQ could not be reached."""
        connection = await connect(settings)
        if connection is None:
            return False
        async with connection:
            opened = await open_dlq(settings, connection)
            if opened is None:
                return False
            queue, self.total = opened
            self.kept.queue = queue.name
            await self.run(queue, await make_take(connection), limit)
        return True
