"""The flusher measures each delivery it settles: its hold from its receipt (not from the flush's
start) and the attempt it was settled at (x-delivery-count + 1). Pure: a fake writer and fake
deliveries; the figures are what ``bulk-recorder tune`` reads."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from typing import Any, cast

from bulk_recorder.infra.errors import DataRejected
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.recorder.flusher import DeadLetterResult, Flusher, Pending
from bulk_recorder.recorder.writer import WriteResult
from bulk_recorder.records import CreditAnnotation, Record

LIMIT = 3


@dataclass
class FakeDelivery:
    delivery_count: int
    received: float
    settled: str = ""
    open: bool = True

    def alive(self) -> bool:
        return self.open

    async def ack(self) -> bool:
        self.settled = "ack"
        return True

    async def reject(self) -> bool:
        self.settled = "reject"
        return True

    async def release(self) -> bool:
        self.settled = "release"
        return True

    async def dead_letter(self, reason: str) -> DeadLetterResult:
        self.settled = "dead_letter"
        return DeadLetterResult.DEAD_LETTERED


class FakeWriter:
    """Commits every record but those whose id starts with "poison"."""

    async def write(self, records: Sequence[Record]) -> WriteResult:
        if any(r.id.startswith("poison") for r in records):
            raise DataRejected("23514 violates check constraint")
        return WriteResult()

    async def probe(self) -> None:
        return None


def _pending(record_id: str, count: int, age_s: float) -> Pending:
    record = CreditAnnotation(
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
    delivery = FakeDelivery(count, time.monotonic() - age_s)
    return Pending(record, cast(Any, delivery))


def _bucket(metrics: Metrics, name: str, outcome: str, le: str) -> float:
    value = metrics.registry.get_sample_value(f"{name}_bucket", {"outcome": outcome, "le": le})
    return value or 0.0


async def test_holds_count_from_receipt_and_attempts_are_the_delivery_count_plus_one() -> None:
    metrics = Metrics()
    flusher = Flusher(FakeWriter(), metrics, delivery_limit=LIMIT, release_after_s=60.0)
    # received 7 s before the flush starts (a batch that waited behind busy workers)
    batch = [_pending("a", 0, 7.0), _pending("b", 2, 7.0), _pending("poison-1", 0, 7.0)]
    batch.append(_pending("poison-2", LIMIT, 7.0))  # the broker's last delivery (N + 1 of N)
    metrics.buffer_messages.inc(len(batch))
    for p in batch:
        metrics.held.add(cast(FakeDelivery, p.delivery))
    assert 7.0 <= metrics.held.oldest_age() < 60.0
    await flusher.process(batch, "size")
    await flusher.wait_held()
    settled = [cast(FakeDelivery, p.delivery).settled for p in batch]
    assert settled == ["ack", "ack", "reject", "dead_letter"]

    hold = "bulk_recorder_delivery_hold_seconds"
    for outcome, count in (("acked", 2), ("rejected", 1), ("dead_lettered", 1)):
        assert _bucket(metrics, hold, outcome, "5.0") == 0, outcome  # not from the flush start
        assert _bucket(metrics, hold, outcome, "10.0") == count, outcome
    assert _bucket(metrics, hold, "released", "+Inf") == 0

    attempt = "bulk_recorder_delivery_attempt"
    assert _bucket(metrics, attempt, "recorded", "1.0") == 1  # x-delivery-count 0: attempt 1
    assert _bucket(metrics, attempt, "recorded", "2.0") == 1
    assert _bucket(metrics, attempt, "recorded", "3.0") == 2  # x-delivery-count 2: attempt 3
    assert _bucket(metrics, attempt, "dead_lettered", "3.0") == 0
    assert _bucket(metrics, attempt, "dead_lettered", "4.0") == 1  # at the last: limit + 1
    assert metrics.registry.get_sample_value("bulk_recorder_buffer_messages") == 0
    assert metrics.registry.get_sample_value("bulk_recorder_oldest_held_seconds") == 0
    assert len(metrics.held) == 0  # every settle removed its delivery


def test_the_oldest_held_is_the_first_received_whose_channel_is_open() -> None:
    metrics = Metrics()
    now = time.monotonic()
    old_dead = FakeDelivery(0, now - 100.0, open=False)
    old, young = FakeDelivery(0, now - 30.0), FakeDelivery(0, now - 1.0)
    for delivery in (old_dead, old, young):
        metrics.held.add(delivery)
    assert 30.0 <= metrics.held.oldest_age() < 31.0  # the dead one is skipped and forgotten
    assert len(metrics.held) == 2
    metrics.held.settled([old])
    assert 1.0 <= metrics.held.oldest_age() < 2.0
    young.open = False
    assert metrics.held.forget_dead() == 1
    assert metrics.held.oldest_age() == 0.0
