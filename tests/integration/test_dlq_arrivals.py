"""The DLQ commands while the recorder keeps dead-lettering (issue 27): a DLQ of a thousand
messages (3,000 under ``SOAK=1``, `make soak`), larger than the replay window, the give-back chunk
and the replay's limit, and a batch of newcomers of the
same reason dead-lettered in the middle of each pass. A discard or replay acts on exactly the
messages it showed, message by message; `inspect` and a dry run leave the DLQ in its order,
the newcomers behind; two inspects at once finish within their stated bound."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import aiormq
import pytest

from benchmarks.support.cgroups import CpuLimit
from consumer.delivery import ERROR_HEADER
from consumer.tools import dlq_pass
from consumer.tools.dlq import discard_dlq, inspect_dlq, replay_dlq
from tests.conftest import Broker, wait_for
from tests.faults.conftest import scale
from tests.integration.dead_letter_flood import flood_id

pytestmark = [pytest.mark.rabbitmq]

# > REPLAY_WINDOW, > GIVE_BACK_CHUNK; its TARGET share (2/3) > the replay test's limit of 500.
# Each size proves the same: the order and identity checks are id by id whatever the size.
SIZE = scale(1000, 3000)
TARGET = "invalid JSON"
OTHER = "missing type property"
NEWCOMERS = 100


def old_id(n: int) -> str:
    return f"old-{n:04d}"


def reason(n: int) -> str:
    return OTHER if n % 3 == 0 else TARGET


def dead_letter_message(message_id: str, why: str) -> aio_pika.Message:
    return aio_pika.Message(
        message_id.encode(),
        message_id=message_id,
        headers={ERROR_HEADER: why},
        type="transaction",
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
    )


async def fill(broker: Broker, queue: str, size: int = SIZE) -> list[str]:
    """``size`` messages in the DLQ, in a known order (one channel, no confirms, sequential)."""
    connection = await aio_pika.connect(broker.url)
    async with connection:
        channel = await connection.channel(publisher_confirms=False)
        exchange = await channel.get_exchange(broker.topology.dead_letter_exchange)
        for n in range(size):
            await exchange.publish(dead_letter_message(old_id(n), reason(n)), "transaction")
        await wait_for(lambda: ready_is(broker, queue, size), timeout=60)
    return [old_id(n) for n in range(size)]


async def ready_is(broker: Broker, queue: str, count: int) -> bool:
    return await broker.ready_count(queue) == count


def batch(prefix: str, count: int = NEWCOMERS) -> list[str]:
    return [f"{prefix}-{n:04d}" for n in range(count)]


@dataclass
class Arrivals:
    """Dead-letters batches of newcomers (TARGET reason, confirmed) while the command runs:
    one of ``on_read`` when a pass has read ``after`` messages (each pass opens its own queue
    object, and each gets the next batch), one of ``on_give_back`` when a pass starts giving
    its messages back, after ``copies`` (byte for byte copies of old messages, as a crash
    between a dead letter's confirm and its ack makes). Each batch is ``count`` newcomers.
    Deterministic: the pass waits until the DLQ shows them."""

    broker: Broker
    queue: str
    on_read: list[str]
    on_give_back: list[str] = field(default_factory=list)
    copies: list[int] = field(default_factory=list)
    after: int = SIZE // 2
    count: int = NEWCOMERS
    reads: dict[int, int] = field(default_factory=dict)
    queues: dict[int, object] = field(default_factory=dict)
    sent: list[list[str]] = field(default_factory=list)

    async def arrive(self, prefix: str) -> None:
        """One batch, in order on one channel; back once the DLQ shows it (the pass waits)."""
        ready = await self.broker.ready_count(self.queue)
        connection = await aio_pika.connect(self.broker.url)
        async with connection:
            channel = await connection.channel(publisher_confirms=False)
            exchange = await channel.get_exchange(self.broker.topology.dead_letter_exchange)
            for message_id in batch(prefix, self.count):
                await exchange.publish(dead_letter_message(message_id, TARGET), "transaction")
            shown = ready + self.count
            await wait_for(lambda: ready_is(self.broker, self.queue, shown), timeout=60)
        self.sent.append(batch(prefix, self.count))

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        original_get = aio_pika.queue.Queue.get
        original_give_back = dlq_pass.Kept.give_back

        async def get(q: aio_pika.queue.Queue, *args: Any, **kwargs: Any) -> Any:
            if q.name == self.queue:
                # each pass's queue object kept alive, so that no later pass's object gets its
                # id() and goes on with its count (it did: the replay's pass never reached
                # ``after`` and its batch never came)
                self.queues.setdefault(id(q), q)
                self.reads[id(q)] = seen = self.reads.get(id(q), 0) + 1
                if seen == self.after and self.on_read:
                    await self.arrive(self.on_read.pop(0))
            return await original_get(q, *args, **kwargs)

        async def give_back(kept: dlq_pass.Kept) -> None:
            if self.on_give_back:
                exchange = await self.broker.channel.get_exchange(
                    self.broker.topology.dead_letter_exchange
                )
                for n in self.copies:
                    await exchange.publish(dead_letter_message(old_id(n), reason(n)), "x")
                await self.arrive(self.on_give_back.pop(0))
            await original_give_back(kept)

        monkeypatch.setattr(aio_pika.queue.Queue, "get", get)
        monkeypatch.setattr(dlq_pass.Kept, "give_back", give_back)

    def newcomers(self) -> Iterator[str]:
        return (message_id for batch in self.sent for message_id in batch)


async def ids(broker: Broker, queue: str) -> list[str | None]:
    return [m.message_id for m in await broker.drain(queue)]


async def filled_with_arrivals(
    broker: Broker, dlq: str, monkeypatch: pytest.MonkeyPatch, copies: list[int]
) -> tuple[list[str], Arrivals]:
    """A full DLQ; newcomers while each pass reads and as the survey gives back."""
    olds = await fill(broker, dlq)
    arrivals = Arrivals(broker, dlq, ["new-survey", "new-pass"], ["new-give-back"], copies)
    arrivals.install(monkeypatch)
    return olds, arrivals


async def test_discard_removes_exactly_the_messages_it_showed_while_others_arrive(
    make_settings, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings()
    dlq = settings.dead_letter_queue
    copied = 1  # a copy of a shown message dead-lettered again: one of the two goes, not both
    olds, arrivals = await filled_with_arrivals(broker, dlq, monkeypatch, [copied])
    out = io.StringIO()
    assert await discard_dlq(settings, TARGET, lambda question: True, out=out) == 0
    monkeypatch.undo()
    shown = [old_id(n) for n in range(SIZE) if reason(n) == TARGET]
    assert f"would discard {len(shown)} messages of reason {TARGET!r}" in out.getvalue()
    assert f"discarded {len(shown)} of " in out.getvalue()
    assert len(arrivals.sent) == 3  # while the survey reads, gives back; while discard reads
    left = await ids(broker, dlq)
    gone = [i for i in arrivals.newcomers() if i not in set(left)]
    assert not gone, f"{len(gone)} newcomers, never shown, were discarded"
    assert set(shown) & set(left) == {old_id(copied)}, "shown messages were left"
    # exactly the shown ones are gone (one of the two identical copies), the others in their
    # order, behind those dead-lettered as the survey gave back, ahead of those dead-lettered
    # while a pass read
    others = [i for i in olds if i not in set(shown) or i == old_id(copied)]
    assert left == batch("new-give-back") + others + batch("new-survey") + batch("new-pass")


async def test_replay_by_reason_with_a_limit_moves_exactly_the_ones_it_showed(
    make_settings, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = make_settings()
    dlq = settings.dead_letter_queue
    olds, arrivals = await filled_with_arrivals(broker, dlq, monkeypatch, [])
    out = io.StringIO()
    limit = 500
    assert await replay_dlq(settings, limit, out=out, reason=TARGET) == 0
    monkeypatch.undo()
    shown = [old_id(n) for n in range(SIZE) if reason(n) == TARGET][:limit]
    assert f"would replay {limit} messages of reason {TARGET!r}" in out.getvalue()
    assert f"replayed {limit} of " in out.getvalue()
    assert len(arrivals.sent) == 3
    moved = await ids(broker, settings.rabbitmq_queue)
    unseen = set(moved) & set(arrivals.newcomers())
    assert not unseen, f"{len(unseen)} newcomers, never shown, were replayed"
    assert sorted(i or "" for i in moved) == shown  # the first 500 shown, no newcomer
    left = await ids(broker, dlq)
    others = [i for i in olds if i not in set(shown)]
    assert left == batch("new-give-back") + others + batch("new-survey") + batch("new-pass")


@pytest.mark.parametrize("command", ["inspect", "dry-run"])
async def test_inspect_and_dry_run_keep_the_order_while_others_arrive(
    make_settings, broker: Broker, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    settings = make_settings()
    dlq = settings.dead_letter_queue
    olds = await fill(broker, dlq)
    arrivals = Arrivals(broker, dlq, ["new"])
    arrivals.install(monkeypatch)
    out = io.StringIO()
    if command == "inspect":
        assert await inspect_dlq(settings, out=out) == 0
        assert f"dead-letter queue {dlq}: {SIZE} messages" in out.getvalue()
    else:
        assert await replay_dlq(settings, out=out, reason=TARGET, dry_run=True) == 0
        assert "dry run: nothing moved" in out.getvalue()
    monkeypatch.undo()
    assert len(arrivals.sent) == 1
    assert await ids(broker, dlq) == olds + list(arrivals.newcomers())
    assert await broker.ready_count(settings.rabbitmq_queue) == 0


async def test_two_inspects_at_once_finish_within_the_give_back_bound(
    make_settings, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two operators run `dlq inspect` at once: the second starts while the first reads, and
    reads what the first gives back. Each give back waits for the consumer count at most
    GIVE_BACK_WAIT_S in all (docs/operations.md), and polls it with a backoff, not in a loop."""
    settings = make_settings()
    dlq = settings.dead_letter_queue
    await fill(broker, dlq)
    declares = 0
    original_unsettled = dlq_pass.Kept._unsettled

    async def counted(self: dlq_pass.Kept, channel: Any) -> int | None:
        nonlocal declares
        declares += 1
        return await original_unsettled(self, channel)

    monkeypatch.setattr(dlq_pass.Kept, "_unsettled", counted)
    second: list[asyncio.Task[int]] = []
    original_get = aio_pika.queue.Queue.get
    reads = 0

    async def get(q: aio_pika.queue.Queue, *args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        if q.name == dlq and not second:
            reads += 1
            if reads == SIZE // 2:
                second.append(asyncio.create_task(inspect_dlq(settings, out=io.StringIO())))
        return await original_get(q, *args, **kwargs)

    monkeypatch.setattr(aio_pika.queue.Queue, "get", get)
    loop = asyncio.get_running_loop()
    started = loop.time()
    first = await inspect_dlq(settings, out=io.StringIO())
    assert second
    assert (first, await second[0]) == (0, 0)
    took = loop.time() - started
    monkeypatch.undo()
    print(f"two inspects at once over {SIZE} messages: {took:.1f} s, {declares} passive declares")
    # nothing removed: the last chunks' returns, sent unwaited, are applied soon after
    await wait_for(lambda: ready_is(broker, dlq, SIZE), timeout=60)
    # two waits of GIVE_BACK_WAIT_S at most, and the reading and giving back themselves
    assert took < 2 * dlq_pass.GIVE_BACK_WAIT_S + 30
    chunks = 2 * SIZE // dlq_pass.GIVE_BACK_CHUNK + 2
    assert declares < 4 * chunks  # a few polls a chunk, not a tight loop


async def test_inspect_gives_back_within_its_bound_while_another_client_reads_the_dlq(
    make_settings, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another client reads the DLQ (basic.get, no ack) while `dlq inspect` gives its messages
    back, as a second inspect's reading does: the consumer count never shows the nacked messages
    back. The give back waits for it GIVE_BACK_WAIT_S at most in all, not per chunk (minutes
    for thousands of messages), and polls it with a backoff."""
    settings = make_settings()
    dlq = settings.dead_letter_queue
    await fill(broker, dlq)
    declares = 0
    original_unsettled = dlq_pass.Kept._unsettled
    giving_back = asyncio.Event()

    async def counted(self: dlq_pass.Kept, channel: Any) -> int | None:
        nonlocal declares
        declares += 1
        giving_back.set()
        if declares == 2:  # the first poll after the first chunk's nack
            # The other client takes that chunk before the count is read, as a reader faster
            # than the polls does. Left to the race, a loaded machine let the count show the
            # chunks back before the reader took them: the give back never saw a reader, and
            # the reader held 9 messages (`assert 9 > 16`).
            await wait_for(lambda: held >= dlq_pass.GIVE_BACK_CHUNK, timeout=30)
        return await original_unsettled(self, channel)

    monkeypatch.setattr(dlq_pass.Kept, "_unsettled", counted)
    connection = await aio_pika.connect(broker.url)
    held = 0

    async def read_on(stop: asyncio.Event) -> None:
        nonlocal held
        channel = await connection.channel()
        q = await channel.declare_queue(dlq, passive=True)
        await giving_back.wait()
        while not stop.is_set():
            if await q.get(no_ack=False, fail=False) is not None:
                held += 1

    loop = asyncio.get_running_loop()
    bound = dlq_pass.GIVE_BACK_WAIT_S + 30  # its one wait, and the reading and giving back
    async with connection:
        stop = asyncio.Event()
        reader = asyncio.create_task(read_on(stop))
        started = loop.time()
        try:
            async with asyncio.timeout(bound):
                assert await inspect_dlq(settings, out=io.StringIO()) == 0
        finally:
            took = loop.time() - started
            stop.set()
            await reader
            print(f"inspect while another client reads: {took:.1f} s, {declares} declares")
    monkeypatch.undo()
    assert held >= dlq_pass.GIVE_BACK_CHUNK  # the other client did read what was given back
    chunks = SIZE // dlq_pass.GIVE_BACK_CHUNK + 1
    assert declares < 4 * chunks  # a few polls a chunk, not a tight loop
    await wait_for(lambda: ready_is(broker, dlq, SIZE), timeout=60)  # nothing removed


async def test_discard_says_how_many_shown_messages_another_client_took(
    make_settings, broker: Broker
) -> None:
    """Between the question and the discard, another client takes 15 messages (10 of them
    shown): the discard removes the shown ones that are left, and says 10 were not found."""
    settings = make_settings()
    dlq = settings.dead_letter_queue
    olds = await fill(broker, dlq)
    loop = asyncio.get_running_loop()
    taken: list[str | None] = []

    def confirm(question: str) -> bool:
        drained = asyncio.run_coroutine_threadsafe(broker.drain(dlq, limit=15), loop).result()
        taken.extend(m.message_id for m in drained)
        return True

    out = io.StringIO()
    assert await discard_dlq(settings, TARGET, confirm, out=out) == 0
    assert taken == olds[:15]
    shown = [i for n, i in enumerate(olds) if reason(n) == TARGET]
    assert f"discarded {len(shown) - 10} of " in out.getvalue()
    assert "10 of the messages shown were no longer in the DLQ" in out.getvalue()
    assert await ids(broker, dlq) == [i for i in olds[15:] if i not in set(shown)]


# -- a burst larger than the DLQ (issue 38) ------------------------------------------------------

BURST_DLQ, BURST_AFTER, BURST = 200, 20, 2000


async def test_inspect_keeps_a_burst_ten_times_the_dlq_behind_it(
    make_settings,
    broker: Broker,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """200 dead letters; `dlq inspect` has read 20 when 2,000 more arrive (a recorder during a
    bad producer deploy). They were held only up to the DLQ's size: 1,800 went ahead of every
    old message, and a later `replay --limit N` took newcomers instead of the oldest."""
    settings = make_settings()
    dlq = settings.dead_letter_queue
    olds = await fill(broker, dlq, BURST_DLQ)
    arrivals = Arrivals(broker, dlq, ["new"], after=BURST_AFTER, count=BURST)
    arrivals.install(monkeypatch)
    out = io.StringIO()
    assert await inspect_dlq(settings, out=out) == 0
    monkeypatch.undo()
    assert f"dead-letter queue {dlq}: {BURST_DLQ} messages" in out.getvalue()
    assert "order" not in capsys.readouterr().err
    left = await ids(broker, dlq)
    assert len(left) == BURST_DLQ + BURST
    ahead = left.index(olds[0])
    assert ahead == 0, f"{ahead} newcomers ahead of every old message"
    assert left == olds + list(arrivals.newcomers())


async def test_replay_with_a_limit_takes_the_oldest_after_a_burst_larger_than_the_dlq(
    make_settings, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same burst while `replay --limit 10` reads: the 10 oldest are replayed, and the
    others stay ahead of the 2,000 newcomers (each pass holds what arrives, not at most the
    DLQ's size)."""
    settings = make_settings()
    dlq = settings.dead_letter_queue
    olds = await fill(broker, dlq, BURST_DLQ)
    arrivals = Arrivals(broker, dlq, ["new"], after=BURST_AFTER, count=BURST)
    arrivals.install(monkeypatch)
    out = io.StringIO()
    assert await replay_dlq(settings, 10, out=out) == 0
    monkeypatch.undo()
    assert f"replayed 10 of {BURST_DLQ} messages" in out.getvalue()
    assert await ids(broker, settings.rabbitmq_queue) == olds[:10]
    assert await ids(broker, dlq) == olds[10:] + list(arrivals.newcomers())


# The ceiling set small: HOLD_ARRIVALS_MAX newcomers are held, one more is not.
CEILING, CEILING_DLQ, CEILING_AFTER = 40, 20, 5


@pytest.mark.parametrize("command", ["inspect", "dry-run", "replay", "discard"])
@pytest.mark.parametrize("extra", [-1, 0, 1], ids=["ceiling-1", "ceiling", "ceiling+1"])
async def test_the_hold_stops_at_its_ceiling_and_says_so(
    make_settings,
    broker: Broker,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
    extra: int,
) -> None:
    """Up to HOLD_ARRIVALS_MAX newcomers while a pass reads: all held, the DLQ in its order,
    newcomers behind, exit 0. One more: the ceiling's worth is held, what is still ready goes
    ahead of the DLQ, and the command says so on stderr and exits 1 (its work is done). A
    discard's newcomers arrive while its survey reads."""
    monkeypatch.setattr(dlq_pass, "HOLD_ARRIVALS_MAX", CEILING)
    settings = make_settings()
    dlq = settings.dead_letter_queue
    olds = await fill(broker, dlq, CEILING_DLQ)
    count = CEILING + extra
    arrivals = Arrivals(broker, dlq, ["new"], after=CEILING_AFTER, count=count)
    arrivals.install(monkeypatch)
    out = io.StringIO()
    stay = olds
    if command == "inspect":
        code = await inspect_dlq(settings, out=out)
        assert f"dead-letter queue {dlq}: {CEILING_DLQ} messages" in out.getvalue()
    elif command == "dry-run":
        code = await replay_dlq(settings, out=out, reason=TARGET, dry_run=True)
        assert "dry run: nothing moved" in out.getvalue()
    elif command == "replay":
        code = await replay_dlq(settings, 3, out=out)
        assert f"replayed 3 of {CEILING_DLQ} messages" in out.getvalue()
        assert await ids(broker, settings.rabbitmq_queue) == olds[:3]
        stay = olds[3:]
    else:
        code = await discard_dlq(settings, TARGET, lambda question: True, out=out)
        stay = [i for n, i in enumerate(olds) if reason(n) != TARGET]
        assert f"discarded {CEILING_DLQ - len(stay)} of " in out.getvalue()
    monkeypatch.undo()
    err = capsys.readouterr().err
    newcomers = list(arrivals.newcomers())
    left = await ids(broker, dlq)
    if extra <= 0:
        assert code == 0
        assert "order" not in err
        assert left == stay + newcomers
        return
    assert code == 1
    assert f"dead letters kept arriving while it read the DLQ, more than the {CEILING} it " in err
    assert f"it gives {CEILING} of them back behind the DLQ's messages and leaves 1 still" in err
    assert "the order of the DLQ is no longer assured" in err
    assert left == newcomers[CEILING:] + stay + newcomers[:CEILING]


@pytest.mark.parametrize("arriving", [0, 3])
async def test_the_hold_stops_after_its_time_and_says_so(
    make_settings,
    broker: Broker,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    arriving: int,
) -> None:
    """HOLD_ARRIVALS_S bounds the time a pass holds newcomers (a flood faster than its reads
    would hold it until HOLD_ARRIVALS_MAX): set to 0, it holds none. With none arriving, the
    DLQ is in its order, exit 0; with some, they are ahead of it and the command says so."""
    monkeypatch.setattr(dlq_pass, "HOLD_ARRIVALS_S", 0.0)
    settings = make_settings()
    dlq = settings.dead_letter_queue
    olds = await fill(broker, dlq, CEILING_DLQ)
    arrivals = Arrivals(broker, dlq, ["new"], after=CEILING_AFTER, count=arriving)
    arrivals.install(monkeypatch)
    code = await inspect_dlq(settings, out=io.StringIO())
    monkeypatch.undo()
    err = capsys.readouterr().err
    newcomers = list(arrivals.newcomers())
    assert await ids(broker, dlq) == newcomers + olds
    if not arriving:
        assert (code, err) == (0, "")
        return
    assert code == 1
    assert "dead letters kept arriving while it read the DLQ, for longer than 0 s: it " in err
    assert "it gives 0 of them back behind the DLQ's messages and leaves 3 still ready" in err


# -- dead letters during the give back (issue 38) ------------------------------------------------


@pytest.mark.parametrize("each", [1, dlq_pass.GIVE_BACK_CHUNK], ids=["one", "a-chunks-worth"])
async def test_dead_letters_during_the_give_back_never_hurry_it_out_of_order(
    make_settings, broker: Broker, monkeypatch: pytest.MonkeyPatch, each: int
) -> None:
    """A give back waits, before each chunk's nack, until the DLQ's consumer count is down to
    the messages not yet given back: each one read and not settled is a consumer. Dead letters
    arriving raise the ready count, not that one. Here `each` dead letters (confirmed) arrive
    before every chunk's nack: with a chunk's worth, a wait on the ready count, as the give
    back had, ended at its first poll, chunk applied or not (on a broker slow to apply, that
    let chunks pile up and come back reordered: test_dlq_give_back_pace.py).

    The order holds, and nothing is lost or doubled.
    The newcomers go ahead of the chunks not yet given back (docs/guarantees.md, Known limits)."""
    settings = make_settings()
    dlq = settings.dead_letter_queue
    olds = await fill(broker, dlq)
    exchange = await broker.channel.get_exchange(broker.topology.dead_letter_exchange)
    original_nack = aiormq.Channel.basic_nack
    sent: list[list[str]] = []

    async def nack(channel: aiormq.Channel, *args: Any, **kwargs: Any) -> Any:
        ahead = batch(f"give-back-{len(sent):02d}", each)
        for message_id in ahead:
            await exchange.publish(dead_letter_message(message_id, TARGET), "transaction")
        sent.append(ahead)
        return await original_nack(channel, *args, **kwargs)

    monkeypatch.setattr(aiormq.Channel, "basic_nack", nack)
    assert await inspect_dlq(settings, out=io.StringIO()) == 0
    monkeypatch.undo()
    chunk = dlq_pass.GIVE_BACK_CHUNK
    assert len(sent) == -(-SIZE // chunk)  # one batch before each chunk's nack
    expected = [
        i for n, ahead in enumerate(sent) for i in ahead + olds[n * chunk : (n + 1) * chunk]
    ]
    assert await ids(broker, dlq) == expected


FLOODERS = 4


@dataclass
class Flooders:
    """FLOODERS processes of tests/integration/dead_letter_flood.py, connected and waiting: each
    floods once told to go, until told to stop, then says how many the broker confirmed."""

    processes: list[asyncio.subprocess.Process] = field(default_factory=list)

    async def go(self) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.write(b"go\n")
            await process.stdin.drain()

    def stop(self) -> None:
        for process in self.processes:
            assert process.stdin is not None
            process.stdin.close()

    async def counted(self) -> list[int]:
        """What each published, once it has stopped."""
        return [int((await process.communicate())[0]) for process in self.processes]


def flooding(
    broker: Broker, group: CpuLimit | None = None
) -> contextlib.AbstractAsyncContextManager[Flooders]:
    return flooding_at(broker.url, broker.topology.dead_letter_exchange, group)


@contextlib.asynccontextmanager
async def flooding_at(
    url: str, exchange: str, group: CpuLimit | None = None
) -> AsyncIterator[Flooders]:
    """Flooders publishing to ``exchange`` at ``url`` (at full speed: not under
    PYTHONASYNCIODEBUG, which the test itself may run under), in ``group`` if one is given;
    any still running at the end is killed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONASYNCIODEBUG"}
    flooders = Flooders()
    try:
        for k in range(FLOODERS):
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.integration.dead_letter_flood",
                url,
                exchange,
                str(k),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=env,
            )
            flooders.processes.append(process)
            if group is not None:
                group.add(process.pid)
        for process in flooders.processes:
            assert process.stdout is not None
            assert await asyncio.wait_for(process.stdout.readline(), 30) == b"ready\n"
        yield flooders
    finally:
        for process in flooders.processes:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_a_flood_of_dead_letters_during_the_give_back_keeps_the_dlq_in_its_order(
    make_settings, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dead letters published by other processes as fast as they can, without waiting for
    confirms, from the give back's start to its end: the ready count races, and the consumer
    count that the give back waits on does not move. The DLQ's messages come back in their
    order, and every message is in the DLQ once. (With the waits gone this flood reordered them;
    with waits on the ready count it did once in make test, and does on a broker held to its
    CPU quota every time: test_dlq_give_back_pace.py.)"""
    settings = make_settings()
    dlq = settings.dead_letter_queue
    olds = await fill(broker, dlq)
    original_give_back = dlq_pass.Kept.give_back
    async with flooding(broker) as flooders:

        async def give_back(kept: dlq_pass.Kept) -> None:
            await flooders.go()
            try:
                await original_give_back(kept)
            finally:
                flooders.stop()

        monkeypatch.setattr(dlq_pass.Kept, "give_back", give_back)
        assert await inspect_dlq(settings, out=io.StringIO()) == 0
        counts = await flooders.counted()
    monkeypatch.undo()
    print(f"{sum(counts)} dead letters during a give back of {SIZE}")
    # a chunk's worth during each wait or so, many of them on their way as a count is read
    assert sum(counts) > SIZE // 2
    await wait_for(lambda: ready_is(broker, dlq, SIZE + sum(counts)), timeout=60)
    left = await ids(broker, dlq)
    assert [i for i in left if i in set(olds)] == olds
    for k, count in enumerate(counts):
        mine = [flood_id(str(k), n) for n in range(count)]
        assert [i for i in left if i and i.startswith(f"flood-{k}-")] == mine
