"""How every command runs its coroutine: on uvloop, with SIGTERM/SIGINT as an orderly stop."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on uvloop (asyncio where uvloop is missing)."""
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


async def with_stop_signals(body: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    """Run ``body(stop)`` with SIGTERM and SIGINT setting ``stop`` (a second signal exits)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            raise SystemExit(130)
        log.info("%s received: stopping intake, flushing, closing", signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await body(stop)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
