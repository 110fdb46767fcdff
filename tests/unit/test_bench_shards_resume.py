"""When the killed node's shard drains again (benchmarks/bench_shards.py ``wait_resumed``), on
timelines of the shard's ready count as the probe reads it every 0.25 s. Pure logic: the real
drain is tests/cluster/test_bench_shards.py."""

from __future__ import annotations

import time
from collections.abc import Sequence

from benchmarks.bench_shards import Timeline, wait_resumed
from benchmarks.support.quota_cluster import Sample
from consumer.queue_count import answered

EMPTY = Sample(0.0, {}, {}, 0.0)
STEP_S = 0.25


def _timeline(killed_at: float, before: Sequence[int], after: Sequence[int | None]) -> Timeline:
    """Shard 0's counts: ``before`` up to the kill, ``after`` from just after it."""
    timeline = Timeline()
    for k, count in enumerate(before):
        at = killed_at - STEP_S * (len(before) - k)
        timeline.points.append((at, [count, 0, 0], EMPTY))
    for k, after_count in enumerate(after):
        timeline.points.append((killed_at + STEP_S * (k + 1), [after_count, 0, 0], EMPTY))
    return timeline


async def _resumed(before: Sequence[int], after: Sequence[int | None]) -> float | None:
    killed_at = time.monotonic() - 10  # every sample is in the past: nothing is waited for
    timeline = _timeline(killed_at, before, after)
    resumed = await wait_resumed(timeline, 0, killed_at, limit=10.5, window=1.5)
    return None if resumed is None else round((resumed - killed_at) / STEP_S)


async def test_a_shard_that_drains_again_steadily_is_found_at_its_first_decline() -> None:
    before = [6000, 5500, 5000, 4500, 4000, 3500]
    after = [3500, None, 3500, 3500, 3000, 2500, 2000, 1500]
    assert await _resumed(before, after) == 4  # the last 3500: the decline starts there


async def test_a_shard_whose_rest_drains_in_one_probe_is_found_too() -> None:
    """A shard whose leftover goes in one probe's time after the gap (the consumers of other
    recorders were still attached: the quick run in make test once did): before, never found,
    and the gap was NaN."""
    before = [6000, 5500, 5000, 4500, 4000, 3500]
    after = [3500, 3500, 3500, 3500, 0, 0, 0, 0]
    assert await _resumed(before, after) == 4


async def test_a_shard_dry_before_the_kill_is_never_found() -> None:
    assert await _resumed([300, 100, 0, 0], [0, 0, 0, 0, 0]) is None


async def test_a_follower_applying_a_few_entries_is_not_a_drain() -> None:
    """One small drop right after the kill (entries committed before it), then nothing."""
    before = [6000, 5500, 5000, 4500, 4000, 3500]
    assert await _resumed(before, [3500, 3490, 3490, 3490, 3490, 3490]) is None


def test_the_drain_rate_skips_what_is_no_reading() -> None:
    """RabbitMQ 3.10 answers a passive declare whose quorum leader took 250 ms or more with 0
    messages and 0 consumers (rabbit_quorum_queue:stat/2 turns the timeout into {ok, 0, 0}): a
    throttled leader gave such a 0 in the window before the kill, and make test at 30fdbda
    failed on the drain rate it made (-3,312 records/s). The probe reads answers through
    consumer/queue_count.py, so that one is None, and the rate starts at the next real reading:
    a drain, not a rise."""
    timeline = Timeline()
    readings = [(0, 0, 0.3), (4900, 3, 0.01), (4800, 3, 0.3), (4700, 3, 0.01)]
    for k, (messages, consumers, seconds) in enumerate(readings):
        reading = answered(messages, consumers, seconds).reading()
        timeline.points.append((k * STEP_S, [reading, 0, 0], EMPTY))
    assert timeline.points[0][1][0] is None
    assert timeline.rate([0], 0.0, 3 * STEP_S) == 200 / (2 * STEP_S)
