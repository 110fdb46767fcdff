"""The API's event-loop lag: how late the loop runs a timer is how long a request that is ready
(its bytes arrived, its query answered) waits before the loop gets to it. A handler that holds
the loop between awaits, or a process starved of CPU, shows here; a slow database does not."""

from __future__ import annotations

import asyncio
from typing import Final

from prometheus_client import Histogram

__all__ = ["LAG_SAMPLE_S", "watch_loop_lag"]

LAG_SAMPLE_S: Final = 0.05


async def watch_loop_lag(lag: Histogram, stop: asyncio.Event) -> None:
    """Observe the loop's lag every ``LAG_SAMPLE_S`` until ``stop`` is set."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + LAG_SAMPLE_S
        await asyncio.sleep(LAG_SAMPLE_S)
        lag.observe(max(0.0, loop.time() - due))
