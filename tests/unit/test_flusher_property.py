"""Property: whatever happens, the collector + flusher ack exactly the committed deliveries.

Hypothesis drives a shared BulkCollector and a Flusher through any sequence of adds (valid,
poison, duplicate ids, on several channels), timeouts, transient database failures (before
commit, or after an ambiguous commit), dead channels, passing time and shutdowns. The writer is
a fake; the deliveries are the recorder's own ``AmqpDelivery`` objects and the flusher acks
through ``ack_each``, the ack path production uses: only the AMQP channel under them is fake.
It decodes the frames ``ack_each`` writes to the connection's write queue back into Basic.Ack
frames and records every call per delivery tag, so the test can check each delivery:

- acked only if its record was committed before the ack, never twice, never after another
  outcome, never with ``multiple``; every delivery on a live channel ends in exactly one outcome;
- rejected or dead-lettered only for a row the database refuses (poison), never for an outage;
  dead-lettered exactly on its last allowed delivery (or released, when the DLQ refuses it);
- released only by a flush that met a transient failure, or by a DLQ that refused;
- the counters agree with the calls, the buffer gauge returns to 0.
"""

from __future__ import annotations

import asyncio
import contextvars
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from functools import partial
from typing import Any, cast
from unittest import mock

from aiormq.abc import AbstractChannel, ChannelFrame, DeliveredMessage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands
from pamqp.header import ContentHeader

from bulk_recorder.infra.backoff import Backoff
from bulk_recorder.infra.errors import DataRejected, TransientDbError
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.recorder import flusher as flusher_module
from bulk_recorder.recorder.collector import BulkCollector
from bulk_recorder.recorder.flusher import Flusher, Pending
from bulk_recorder.recorder.writer import (
    PG_MAX_PARAMETERS,
    WriteResult,
    chunked,
    dedupe_sorted,
    rows_per_insert,
)
from bulk_recorder.records import CreditAnnotation, Record
from consumer.copy_publisher import CopyPublisher
from consumer.delivery import AmqpDelivery, DeadLetterer, ack_each
from tests.faults.amqp_tap import FrameReader

DELIVERY_LIMIT = 3
RELEASE_AFTER_S = 2.5  # each retry advances the fake clock by 1 s: released on the 3rd failure

_batch_id: contextvars.ContextVar[int] = contextvars.ContextVar("batch_id", default=-1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now


class StepBackoff(Backoff):
    """No real sleeping: every retry moves the fake clock forward one second."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def delay(self, attempt: int) -> float:
        self.clock.now += 1.0
        return 0.0


@dataclass(eq=False)
class Call:
    action: str
    ok: bool
    committed: bool  # was the record committed when the call was made
    batch_transients: int  # transient failures met by the flush that made the call
    multiple: bool = False


class FakeWriteQueue:
    """The connection's write queue: decodes what ``ack_each`` marshals, one Basic.Ack a tag."""

    def __init__(self, channel: FakeChannel) -> None:
        self.channel = channel

    async def put(self, frame: ChannelFrame) -> None:
        await asyncio.sleep(0)
        for number, value in FrameReader(client_side=False).feed(frame.payload):
            assert number == self.channel.number, (number, self.channel.number)
            assert isinstance(value, commands.Basic.Ack), value
            self.channel.settle(value.delivery_tag, "ack", multiple=bool(value.multiple))


class FakeConnection:
    def __init__(self, channel: FakeChannel) -> None:
        self.write_queue = FakeWriteQueue(channel)
        self.channels = {channel.number: channel}  # aiormq frees the number when it closes


class FakeCloseEvent:
    """aiormq's private close event, which the lean ack path checks: set once closing."""

    def __init__(self, channel: FakeChannel) -> None:
        self.channel = channel

    def is_set(self) -> bool:
        return not self.channel.open


class FakeChannel:
    """What AmqpDelivery and ack_each use of an aiormq channel; records each settle by tag."""

    def __init__(self, number: int, world: World) -> None:
        self.number = number
        self.open = True
        self.world = world
        self.connection = FakeConnection(self)
        self._Channel__close_event = FakeCloseEvent(self)
        self.deliveries: dict[int, Tracked] = {}

    @property
    def is_closed(self) -> bool:
        return not self.open

    def deliver(self, tracked: Tracked) -> int:
        tag = len(self.deliveries) + 1  # tags count from 1 on each channel
        self.deliveries[tag] = tracked
        return tag

    def settle(self, tag: int, action: str, *, multiple: bool = False) -> None:
        tracked = self.deliveries[tag]  # KeyError: a tag this channel never delivered
        if action == "ack" and tracked.settle_as is not None:
            action = tracked.settle_as  # a copy was published (DLQ or queue), then acked
        tracked.calls.append(
            Call(
                action,
                self.open,
                tracked.record_id in self.world.writer.committed,
                self.world.writer.transients_by_batch.get(_batch_id.get(), 0),
                multiple,
            )
        )
        tracked.channel_open_at_settle = self.open

    async def basic_ack(self, tag: int, multiple: bool = False, wait: bool = True) -> None:
        await asyncio.sleep(0)
        self.settle(tag, "ack", multiple=multiple)

    async def basic_reject(self, tag: int, requeue: bool = True) -> None:
        assert requeue
        await asyncio.sleep(0)
        self.settle(tag, "reject")

    async def basic_nack(self, tag: int, multiple: bool = False, requeue: bool = True) -> None:
        assert requeue
        await asyncio.sleep(0)
        self.settle(tag, "release", multiple=multiple)


class FakeDeadLetterer(DeadLetterer):
    """Publishes nowhere, but marks the delivery: AmqpDelivery then acks it on its channel, and
    that ack is recorded as the dead-letter (or release) outcome. While ``world.dlq_refuses``
    the dead-letter copy is refused; with no hold (``hold_s`` 0) the delivery is then released,
    a copy back to the queue, as the recorder does once its hold runs out."""

    def __init__(self, world: World) -> None:
        super().__init__(
            cast(CopyPublisher, None),
            dead_letter_exchange="",
            queue="",
            hold_s=0.0,
            backoff=Backoff(),
        )
        self.world = world

    @staticmethod
    def _tracked(message: DeliveredMessage) -> Tracked:
        channel = cast(FakeChannel, message.channel)
        assert message.delivery_tag is not None
        return channel.deliveries[message.delivery_tag]

    async def dead_letter(
        self, message: DeliveredMessage, reason: str, wanted: Callable[[], bool]
    ) -> str | None:
        assert reason.startswith("database refused the row: ")
        await asyncio.sleep(0)
        tracked = self._tracked(message)
        tracked.dead_letter_tried = True
        if self.world.dlq_refuses:
            return "the DLQ refused the copy (test)"
        tracked.settle_as = "dead_letter"
        return None

    async def requeue(self, message: DeliveredMessage, wanted: Callable[[], bool]) -> str | None:
        await asyncio.sleep(0)
        tracked = self._tracked(message)
        tracked.settle_as = "dead_letter_released" if tracked.dead_letter_tried else "release"
        return None

    async def pause(self, seconds: float) -> bool:
        return False


class Tracked:
    """What the test remembers of one delivery: its record, its channel, the calls made."""

    def __init__(self, n: int, record_id: str, count: int, channel: FakeChannel) -> None:
        self.n = n
        self.record_id = record_id
        self.delivery_count = count
        self.channel = channel
        self.calls: list[Call] = []
        self.channel_open_at_settle: bool | None = None
        self.settle_as: str | None = None  # what the next ack on its channel stands for
        self.dead_letter_tried = False


def amqp_delivery(tracked: Tracked, dead_letterer: FakeDeadLetterer) -> AmqpDelivery:
    channel = tracked.channel
    tag = channel.deliver(tracked)
    message = DeliveredMessage(
        delivery=commands.Basic.Deliver(consumer_tag="ctag", delivery_tag=tag),
        header=ContentHeader(
            properties=commands.Basic.Properties(
                headers={"x-delivery-count": tracked.delivery_count}
            )
        ),
        body=b"",
        channel=cast(AbstractChannel, channel),
    )
    return AmqpDelivery(cast(AbstractChannel, channel), message, dead_letterer)


class FakeWriter:
    """Commits unless told to fail; a batch holding a poison record is refused as a whole."""

    def __init__(self) -> None:
        self.committed: set[str] = set()
        self.poison: set[str] = set()
        self.transient_budget = 0
        self.ambiguous_next = False
        self.transients_by_batch: dict[int, int] = {}
        self.channel_to_kill: FakeChannel | None = None

    async def write(self, records: Sequence[Record]) -> WriteResult:
        await asyncio.sleep(0)  # let concurrent flushes interleave
        if self.channel_to_kill is not None:  # the broker connection dies mid-flush
            self.channel_to_kill.open = False
            self.channel_to_kill = None
        ids = [r.id for r in records]
        if self.transient_budget > 0:
            self.transient_budget -= 1
            self._transient()
            raise TransientDbError("connection refused")
        if self.poison.intersection(ids):
            raise DataRejected("23505 duplicate key value violates unique constraint")
        fresh = set(ids) - self.committed
        self.committed.update(ids)
        if self.ambiguous_next:  # COMMIT went through, its answer did not
            self.ambiguous_next = False
            self._transient()
            raise TransientDbError("connection lost during COMMIT")
        result = WriteResult()
        counts = result.table("credit_annotations")
        counts.attempted = len(ids)
        counts.inserted = len(fresh)
        counts.ignored = len(ids) - len(fresh)
        return result

    def _transient(self) -> None:
        batch = _batch_id.get()
        self.transients_by_batch[batch] = self.transients_by_batch.get(batch, 0) + 1


@dataclass
class World:
    clock: Clock = field(default_factory=Clock)
    writer: FakeWriter = field(default_factory=FakeWriter)
    metrics: Metrics = field(default_factory=Metrics)
    dead_letterer: FakeDeadLetterer = field(init=False)
    deliveries: list[Tracked] = field(default_factory=list)
    channels: list[FakeChannel] = field(default_factory=list)
    batches: list[tuple[list[Pending], str]] = field(default_factory=list)
    releases_signalled: int = 0
    dlq_refuses: bool = False
    next_batch: int = 0
    dropped_from_buffer: int = 0

    def __post_init__(self) -> None:
        self.channels = [FakeChannel(1, self), FakeChannel(2, self)]
        self.dead_letterer = FakeDeadLetterer(self)


def _record(record_id: str) -> CreditAnnotation:
    return CreditAnnotation(
        record_id,
        None,
        "52998224725",
        "CPF",
        "RESTRICTION",
        "c",
        Decimal(1),
        date(2026, 1, 1),
        None,
    )


def _on_channel(channel: FakeChannel, pending: Pending) -> bool:
    return getattr(pending.delivery, "channel", None) is channel  # as the recorder drops them


# -- steps ----------------------------------------------------------------------------------

add = st.tuples(
    st.just("add"),
    st.booleans(),  # poison
    st.integers(0, 1),  # channel slot
    st.integers(0, DELIVERY_LIMIT),  # x-delivery-count
    st.one_of(st.none(), st.integers(0, 30)),  # duplicate of an earlier delivery's record
)
steps = st.lists(
    st.one_of(
        add,
        add,
        add,
        st.tuples(st.just("timeout")),
        st.tuples(st.just("shutdown")),
        st.tuples(st.just("transient"), st.integers(1, 6)),
        st.tuples(st.just("ambiguous")),
        st.tuples(st.just("kill_channel"), st.integers(0, 1), st.booleans()),
        st.tuples(st.just("kill_during_write"), st.integers(0, 1)),
        st.tuples(st.just("tick"), st.floats(0, 5)),
        st.tuples(st.just("probe")),
        st.tuples(st.just("dlq_refuses"), st.booleans()),
    ),
    max_size=60,
)


def _delivered(world: World, step: tuple[Any, ...]) -> Pending:
    """An "add" step: a new delivery on a channel (poison, or a duplicate of an earlier id)."""
    _, poison, slot, count, dup = step
    n = len(world.deliveries)
    if dup is not None and dup < n and not poison:
        record_id = world.deliveries[dup].record_id  # same id, another message
    else:
        record_id = f"r{n:04d}"
        if poison:
            world.writer.poison.add(record_id)
    tracked = Tracked(n, record_id, count, world.channels[slot])
    world.deliveries.append(tracked)
    world.metrics.messages_received.inc()
    world.metrics.buffer_messages.inc()
    return Pending(_record(record_id), amqp_delivery(tracked, world.dead_letterer))


def _kill_channel(world: World, collector: BulkCollector[Pending], step: tuple[Any, ...]) -> None:
    """The broker connection died: a new channel takes the slot; the recorder drops (or, if it
    has not noticed yet, keeps) the dead channel's buffered deliveries."""
    _, slot, drop = step
    dead = world.channels[slot]
    dead.open = False
    # the new connection's channel has the same number, and tags count from 1 again
    world.channels[slot] = FakeChannel(dead.number, world)
    if drop:
        gone = collector.drop(partial(_on_channel, dead))
        world.metrics.messages_dropped.inc(len(gone))
        world.metrics.buffer_messages.dec(len(gone))
        world.dropped_from_buffer += len(gone)


def _apply(
    world: World, flusher: Flusher, collector: BulkCollector[Pending], step: tuple[Any, ...]
) -> None:
    """One step of the plan, before the batches it made are processed."""
    kind = step[0]
    if kind == "add":
        collector.add(_delivered(world, step))
    elif kind in ("timeout", "shutdown"):
        collector.flush(kind)
    elif kind == "transient":
        world.writer.transient_budget += step[1]
    elif kind == "ambiguous":
        world.writer.ambiguous_next = True
    elif kind == "kill_channel":
        _kill_channel(world, collector, step)
    elif kind == "kill_during_write":
        world.writer.channel_to_kill = world.channels[step[1]]
    elif kind == "tick":
        world.clock.now += step[1]
    elif kind == "probe" and world.writer.transient_budget == 0:
        flusher.recovered()  # the recorder's database probe succeeded
    elif kind == "dlq_refuses":
        world.dlq_refuses = step[1]


async def run(world: World, size: int, plan: list[tuple[Any, ...]]) -> Flusher:
    metrics = world.metrics

    async def on_release() -> None:
        world.releases_signalled += 1

    flusher = Flusher(
        world.writer,
        metrics,
        delivery_limit=DELIVERY_LIMIT,
        release_after_s=RELEASE_AFTER_S,
        backoff=StepBackoff(world.clock),
        on_release=on_release,
        ack_many=ack_each,  # as the recorder builds it (consumer/app.py)
    )
    collector: BulkCollector[Pending] = BulkCollector(
        size, 3600, lambda batch, reason: world.batches.append((batch, reason))
    )

    async def process(batch: list[Pending], reason: str) -> None:
        _batch_id.set(world.next_batch)
        world.next_batch += 1
        await flusher.process(batch, reason)

    async def drain() -> None:
        while world.batches:
            todo, world.batches[:] = list(world.batches), []
            await asyncio.gather(*(process(b, r) for b, r in todo))

    with mock.patch.object(
        flusher_module,
        "time",
        types.SimpleNamespace(
            monotonic=world.clock.monotonic, perf_counter=world.clock.perf_counter
        ),
    ):
        for step in plan:
            _apply(world, flusher, collector, step)
            await drain()
        world.writer.transient_budget = 0  # the database is back for the final shutdown flush
        world.writer.channel_to_kill = None
        collector.flush("shutdown")
        await drain()
        await flusher.wait_held()  # dead letters settle in tasks of their own
        collector.close()
    return flusher


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(1, 8), plan=steps)
def test_flusher_acks_exactly_the_committed_deliveries(
    size: int, plan: list[tuple[Any, ...]]
) -> None:
    world = World()
    flusher = asyncio.run(run(world, size, plan))
    writer = world.writer
    registry = world.metrics.registry

    def value(name: str, labels: dict[str, str] | None = None) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    outcomes: dict[str, int] = {
        "ack": 0,
        "reject": 0,
        "release": 0,
        "dead_letter": 0,
        "dead_letter_released": 0,
    }
    failed_calls = 0

    for d in world.deliveries:
        assert len(d.calls) <= 1, (d.n, d.calls)  # one outcome at most, never two
        poison = d.record_id in writer.poison
        if not d.calls:
            # only a delivery of a dead channel may be left without a call
            assert not d.channel.open, d.n
            continue
        call = d.calls[0]
        assert not call.multiple, f"delivery {d.n} settled with multiple=True"
        if not call.ok:
            failed_calls += 1
            assert not d.channel_open_at_settle
            continue
        outcomes[call.action] += 1
        if call.action == "ack":
            assert call.committed, f"delivery {d.n} acked before its record was committed"
            assert not poison
        elif call.action in ("reject", "dead_letter", "dead_letter_released"):
            assert poison, f"delivery {d.n} judged for an outage"
            last = d.delivery_count >= DELIVERY_LIMIT  # the broker delivers N + 1 times
            assert (call.action != "reject") == last, (d.n, d.delivery_count)
        else:
            assert call.action == "release"
            assert call.batch_transients > 0, f"delivery {d.n} released without an outage"
        if not poison and call.action != "release":
            assert call.action == "ack"

    # every delivery on a live channel got its one outcome: nothing left unsettled
    for d in world.deliveries:
        if d.channel.open:
            assert len(d.calls) == 1, d.n
            assert d.calls[0].ok, d.n
    assert outcomes["release"] == 0 or world.releases_signalled > 0

    assert value("bulk_recorder_messages_acked_total") == outcomes["ack"]
    assert value("bulk_recorder_messages_rejected_total") == outcomes["reject"]
    assert (
        value("bulk_recorder_messages_released_total")
        == outcomes["release"] + outcomes["dead_letter_released"]
    )
    assert (
        value("bulk_recorder_messages_dead_lettered_total", {"reason": "database"})
        == outcomes["dead_letter"]
    )

    # every settle is measured once, under its outcome (its hold; `bulk-recorder tune`)
    def held(outcome: str) -> float:
        return value("bulk_recorder_delivery_hold_seconds_count", {"outcome": outcome})

    assert held("acked") == outcomes["ack"]
    assert held("rejected") == outcomes["reject"]
    assert held("released") == outcomes["release"] + outcomes["dead_letter_released"]
    assert held("dead_lettered") == outcomes["dead_letter"]
    assert held("dropped") <= value("bulk_recorder_messages_dropped_total")
    attempts = value("bulk_recorder_delivery_attempt_count", {"outcome": "dead_lettered"})
    assert attempts == outcomes["dead_letter"]
    recorded = value("bulk_recorder_delivery_attempt_count", {"outcome": "recorded"})
    assert recorded == outcomes["ack"]
    received = value("bulk_recorder_messages_received_total")
    dropped = value("bulk_recorder_messages_dropped_total")
    assert received == len(world.deliveries)
    assert received == sum(outcomes.values()) + dropped
    assert dropped >= failed_calls + world.dropped_from_buffer
    assert value("bulk_recorder_buffer_messages") == 0
    assert value("bulk_recorder_paused") == (1 if flusher.in_outage else 0)


@given(
    items=st.lists(st.integers(), max_size=3000),
    columns=st.integers(1, 70_000),
    setting=st.integers(1, 1000),
)
def test_chunks_cover_every_item_once_within_both_limits(
    items: list[int], columns: int, setting: int
) -> None:
    size = rows_per_insert(columns, setting)
    chunks = list(chunked(items, size))
    assert [x for c in chunks for x in c] == items
    assert all(0 < len(c) <= size for c in chunks)
    assert size <= setting
    assert size * columns <= PG_MAX_PARAMETERS or size == 1


@given(ids=st.lists(st.sampled_from([f"r{i}" for i in range(40)]), max_size=200))
def test_dedupe_keeps_the_first_of_each_id_in_sorted_order(ids: list[str]) -> None:
    records = [_record(i) for i in ids]
    unique, repeats = dedupe_sorted(records)
    assert [r.id for r in unique] == sorted(set(ids))
    assert repeats == len(ids) - len(set(ids))
    first: dict[str, CreditAnnotation] = {}
    for r in records:
        first.setdefault(r.id, r)
    assert all(r is first[r.id] for r in unique)
