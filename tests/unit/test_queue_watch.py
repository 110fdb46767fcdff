"""The recorder's last-delivery time moves only when deliveries arrived (no broker needed)."""

from __future__ import annotations

import asyncio
import math
import time

from bulk_recorder.infra.metrics import Metrics
from consumer.queue_watch import QueueWatch

LAST = "bulk_recorder_last_delivery_timestamp_seconds"


def _last(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value(LAST) or 0.0


def test_last_delivery_moves_only_when_the_received_counter_moved() -> None:
    metrics = Metrics()
    watch = QueueWatch(metrics, "q", lambda: None)
    metrics.last_delivery.set(5.0)
    watch.note_deliveries()
    assert _last(metrics) == 5.0  # nothing received: an idle recorder keeps its old time
    before = time.time()
    metrics.messages_received.inc(3)
    watch.note_deliveries()
    assert _last(metrics) >= before
    metrics.last_delivery.set(7.0)
    watch.note_deliveries()
    assert _last(metrics) == 7.0  # the same count as at the last look


async def test_no_connection_is_no_look_and_the_queue_gauges_read_unknown_not_stale() -> None:
    """A recorder that lost its connection must not keep exporting its last count: one
    consumer kept from before would hide in max() that no consumer is attached any more."""
    metrics = Metrics()
    metrics.queue_messages.set(42)
    metrics.queue_consumers.set(1)
    assert not await QueueWatch(metrics, "q", lambda: None).look()
    for name in ("bulk_recorder_queue_messages", "bulk_recorder_queue_consumers"):
        assert math.isnan(metrics.registry.get_sample_value(name) or 0.0), name
    assert math.isnan(metrics.registry.get_sample_value("bulk_recorder_dlq_messages") or 0.0)


async def test_before_any_delivery_the_last_delivery_time_is_the_start() -> None:
    """docs/reference.md: ``last_delivery_timestamp_seconds`` is the recorder's start time before
    its first delivery. 0 would read as "no delivery for 56 years": the "nothing consumed"
    alert would fire at every start."""
    metrics = Metrics()
    stop = asyncio.Event()
    before = time.time()
    task = asyncio.create_task(QueueWatch(metrics, "q", lambda: None).run(stop))
    try:
        for _ in range(100):  # the first pass sets it before its first await
            await asyncio.sleep(0)
            if _last(metrics):
                break
        assert before <= _last(metrics) <= time.time()
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
