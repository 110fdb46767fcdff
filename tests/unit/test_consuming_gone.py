"""The queue watch's second path to a deleted routed shard (consumer/consuming.py reconcile):
a shard found gone while this recorder holds a consumer on it goes round the loop as a cancel
would, but only when the look went through the connection consuming now. A look through an
older connection (a cancel already replaced it) and a shard we do not hold change nothing.

Pure logic: stand-ins for the connection; the real broker's side is
tests/faults/test_queue_deleted.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bulk_recorder.infra.broker import BrokerNodes
from bulk_recorder.infra.metrics import Metrics
from consumer.consuming import Consuming
from consumer.topology import Topology

QUEUE = "records"


@dataclass
class _Connection:
    is_closed: bool = False


def _consuming(connection: _Connection, held: dict[str, str]) -> tuple[Consuming, list[str]]:
    consuming = Consuming(
        BrokerNodes(["amqp://guest:guest@127.0.0.1:1/"]),
        Topology(exchange="x", queue=QUEUE, delivery_limit=5),
        Metrics(),
        prefetch=10,
        on_message=lambda *_: None,
        paused=lambda: False,
        drop_channel=lambda _: None,
    )
    lost: list[str] = []
    consuming.connection = connection  # type: ignore[assignment]
    consuming.ok = True
    consuming._tags = dict(held)
    consuming._shard_gone = lost.append
    return consuming, lost


async def test_a_held_shard_found_gone_through_the_current_connection_is_taken_as_cancelled() -> (
    None
):
    now = _Connection()
    consuming, lost = _consuming(now, {QUEUE: "ctag-1"})
    await consuming.reconcile({}, frozenset({QUEUE}), now)  # type: ignore[arg-type]
    assert lost == [QUEUE]
    assert QUEUE not in consuming._tags  # a late cancel of that tag finds nothing to do


async def test_a_look_through_an_older_connection_changes_nothing() -> None:
    now, before = _Connection(), _Connection()
    consuming, lost = _consuming(now, {QUEUE: "ctag-2"})
    await consuming.reconcile({}, frozenset({QUEUE}), before)  # type: ignore[arg-type]
    assert lost == []
    assert consuming._tags == {QUEUE: "ctag-2"}


async def test_a_gone_shard_we_hold_no_consumer_on_changes_nothing() -> None:
    now = _Connection()
    consuming, lost = _consuming(now, {})  # intake paused, or its cancel already handled
    await consuming.reconcile({}, frozenset({QUEUE}), now)  # type: ignore[arg-type]
    assert lost == []


async def test_nothing_gone_changes_nothing() -> None:
    now = _Connection()
    held: dict[str, Any] = {QUEUE: "ctag-3"}
    consuming, lost = _consuming(now, held)
    await consuming.reconcile({}, frozenset(), now)  # type: ignore[arg-type]
    assert lost == []
    assert consuming._tags == held


@dataclass
class _Channel:
    is_closed: bool = False
    cancelled: list[str] = field(default_factory=list)

    async def basic_cancel(self, tag: str) -> None:
        self.cancelled.append(tag)


LEFTOVER = f"{QUEUE}.shard-2"


async def test_a_leftover_with_no_count_is_left_as_it_is() -> None:
    """The queue watch reports a leftover shard whose leader answered too late to count as
    None (consumer/queue_count.py): its consumer stays, nothing is let go. The real slow leader
    is tests/integration/test_late_counts.py."""
    now, channel = _Connection(), _Channel()
    consuming, lost = _consuming(now, {LEFTOVER: "ctag-4"})
    consuming.by_queue = {LEFTOVER: channel}  # type: ignore[dict-item]
    started: list[set[str]] = []

    async def start() -> None:  # what basic.consume would skip: the let-go shards
        started.append(set(consuming._let_go))

    consuming.start = start  # type: ignore[method-assign]
    await consuming.reconcile({2: None}, frozenset(), now)  # type: ignore[arg-type]
    assert channel.cancelled == []
    assert consuming._tags == {LEFTOVER: "ctag-4"}
    assert LEFTOVER not in consuming._let_go
    await consuming.reconcile({2: 0}, frozenset(), now)  # type: ignore[arg-type]
    assert channel.cancelled == ["ctag-4"]  # counted empty: let go
    assert LEFTOVER in consuming._let_go
    await consuming.reconcile({2: None}, frozenset(), now)  # type: ignore[arg-type]
    assert LEFTOVER in consuming._let_go  # no count: still let go, not consumed again
    assert started == [set(), {LEFTOVER}, {LEFTOVER}]
    assert lost == []
