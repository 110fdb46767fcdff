"""BulkCollector: size and timeout triggers, shutdown flush, dropping a dead channel's items."""

from __future__ import annotations

import asyncio

import pytest

from bulk_recorder.recorder.collector import BulkCollector

Batches = list[tuple[list[int], str]]


def make(size: int, timeout_s: float = 10.0) -> tuple[BulkCollector[int], Batches]:
    out: Batches = []
    collector: BulkCollector[int] = BulkCollector(size, timeout_s, lambda b, r: out.append((b, r)))
    return collector, out


async def test_flushes_when_size_is_reached() -> None:
    collector, out = make(3)
    for i in range(7):
        collector.add(i)
    assert out == [([0, 1, 2], "size"), ([3, 4, 5], "size")]
    assert len(collector) == 1
    collector.close()


async def test_flushes_a_partial_batch_after_the_timeout() -> None:
    collector, out = make(100, timeout_s=0.05)
    collector.add(1)
    collector.add(2)
    assert out == []
    await asyncio.sleep(0.15)
    assert out == [([1, 2], "timeout")]
    assert len(collector) == 0


async def test_timer_starts_with_the_first_item_of_each_batch() -> None:
    collector, out = make(2, timeout_s=0.05)
    collector.add(1)
    collector.add(2)  # size flush cancels the timer
    await asyncio.sleep(0.1)
    assert out == [([1, 2], "size")]
    collector.add(3)
    await asyncio.sleep(0.1)
    assert out == [([1, 2], "size"), ([3], "timeout")]


async def test_shutdown_flush_emits_the_partial_batch_once() -> None:
    collector, out = make(10)
    collector.add(1)
    collector.flush("shutdown")
    collector.flush("shutdown")
    assert out == [([1], "shutdown")]
    await asyncio.sleep(0)
    collector.close()


async def test_size_one_is_per_message_mode() -> None:
    collector, out = make(1)
    for i in range(3):
        collector.add(i)
    assert out == [([0], "size"), ([1], "size"), ([2], "size")]


async def test_drop_removes_matching_items_and_stops_the_timer_when_empty() -> None:
    collector, out = make(10, timeout_s=0.05)
    for i in range(4):
        collector.add(i)
    assert collector.drop(lambda x: x % 2 == 0) == [0, 2]
    assert len(collector) == 2
    assert collector.drop(lambda x: True) == [1, 3]
    await asyncio.sleep(0.1)
    assert out == []


@pytest.mark.parametrize(("size", "timeout"), [(0, 1.0), (1, 0.0), (-1, 1.0)])
def test_rejects_nonsense_configuration(size: int, timeout: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        BulkCollector(size, timeout, lambda b, r: None)
