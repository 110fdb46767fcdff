"""Waiting on events with a bound: the sleeps of every retry loop, cut short by a stop."""

from __future__ import annotations

import asyncio
import contextlib


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def wait_any(*events: asyncio.Event, seconds: float | None = None) -> None:
    """Until one of ``events`` is set, or ``seconds`` passed."""
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
