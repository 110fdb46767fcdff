"""The API's event-loop lag: how late the loop runs a timer is how long a request that is ready
(its bytes arrived, its query answered) waits before the loop gets to it. A handler that holds
the loop between awaits, or a process starved of CPU, shows here; a slow database does not."""

from __future__ import annotations

import asyncio
from typing import Final

from prometheus_client import Histogram

__all__ = ["LAG_SAMPLE_S", "watch_loop_lag"]

LAG_SAMPLE_S: Final = 0.05


async def watch_loop_lag(
    lag: Histogram, stop: asyncio.Event, sample_s: float = LAG_SAMPLE_S
) -> None:
    """Observe the loop's lag every ``sample_s`` until ``stop`` is set: how late the timer ran,
    never the sleep itself (an idle loop observes about 0)."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + sample_s
        await asyncio.sleep(sample_s)
        lag.observe(max(0.0, loop.time() - due))
