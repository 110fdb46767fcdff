"""The API's event-loop lag (``bulk_recorder_api_event_loop_lag_seconds``) is how late the loop
ran its timer, not the timer's own sleep: an idle loop shows about 0, a held one the hold less
what the sampler had already waited.

Each sample is checked against the time the loop itself took between two samples, less the
interval: a ratio to the interval (injected), not a claim on how fast the machine is. A machine
so busy that the loop really is late shows that lateness in both, and the check still holds.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from bulk_recorder.producer.api.loop_lag import watch_loop_lag

pytestmark = pytest.mark.exclusive(reason="an idle loop's lag must stay under 50 ms")

SAMPLE_S = 0.1  # the interval the tests sample at (the API's is LAG_SAMPLE_S)
SAMPLES = 20
HOLD_S = 4 * SAMPLE_S


class Samples:
    """Stands in for the histogram: every value observed, with the loop's time when it was."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, float]] = []  # (value, loop time)
        self.observed = asyncio.Event()

    def observe(self, value: float) -> None:
        self.seen.append((value, asyncio.get_running_loop().time()))
        self.observed.set()

    async def next(self) -> None:
        """Until the next value is observed (the sampler is back in its sleep then)."""
        self.observed.clear()
        await asyncio.wait_for(self.observed.wait(), timeout=10 * SAMPLE_S + 5)

    def lateness(self) -> list[tuple[float, float]]:
        """(sample, the time between it and the one before less the interval), from the
        second sample on: the lateness the sample should be."""
        return [
            (value, at - before - SAMPLE_S)
            for (_, before), (value, at) in zip(self.seen, self.seen[1:], strict=False)
        ]


async def _sampled(samples: Samples, count: int, hold_after: int | None = None) -> None:
    stop = asyncio.Event()
    watching = asyncio.create_task(watch_loop_lag(samples, stop, SAMPLE_S))  # type: ignore[arg-type]
    try:
        for n in range(count):
            await samples.next()
            if n == hold_after:
                time.sleep(HOLD_S)  # noqa: ASYNC251 - the point: hold the loop
    finally:
        stop.set()
        await watching


async def test_an_idle_loop_shows_no_lag_not_the_samplers_own_sleep() -> None:
    samples = Samples()
    await _sampled(samples, SAMPLES)
    off = [(value, late) for value, late in samples.lateness() if abs(value - late) >= SAMPLE_S / 2]
    assert off == [], f"{len(off)} of {SAMPLES - 1} samples are not the loop's lateness: {off}"
    # idle: most samples are about 0, where the sampler's own sleep would be the whole interval
    assert sorted(value for value, _ in samples.seen)[SAMPLES // 2] < SAMPLE_S / 2, samples.seen


async def test_a_held_loop_shows_the_hold_less_the_time_already_waited() -> None:
    """Held for four intervals just after a sample, the loop runs the next timer at least three
    intervals late: the lag is the hold less the interval the sampler was waiting anyway."""
    samples = Samples()
    await _sampled(samples, 4, hold_after=1)
    lateness = samples.lateness()
    held, late = lateness[1]  # the sample after the hold
    assert held >= HOLD_S - SAMPLE_S, samples.seen
    assert abs(held - late) < SAMPLE_S / 2, (held, late)
    assert all(abs(value - late) < SAMPLE_S / 2 for value, late in lateness), lateness
