"""BulkCollector: one shared buffer that cuts a batch on size or on timeout, whichever is first.

Every worker feeds the same collector, so it fills at ``size`` under load (Midaz gives each
worker its own collector of size workers x prefetch, which can never fill). The timer starts
with the first buffered item, so a partial batch waits at most ``timeout_s``. The collector is
pure logic: it hands finished batches to a sink and never touches the network.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

Sink = Callable[[list[T], str], None]


class BulkCollector(Generic[T]):
    """Buffer items; emit ``(batch, reason)`` to ``sink`` with reason size, timeout or shutdown."""

    def __init__(
        self,
        size: int,
        timeout_s: float,
        sink: Sink[T],
        *,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        if timeout_s <= 0:
            raise ValueError("timeout_s must be > 0")
        self.size = size
        self.timeout_s = timeout_s
        self._sink = sink
        self._loop = loop
        self._buffer: list[T] = []
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        return len(self._buffer)

    def add(self, item: T) -> None:
        """Buffer one item; emit a batch when the buffer reaches ``size``."""
        buffer = self._buffer
        buffer.append(item)
        if len(buffer) >= self.size:
            self._cut("size")
        elif len(buffer) == 1:
            loop = self._loop or asyncio.get_running_loop()
            self._timer = loop.call_later(self.timeout_s, self._cut, "timeout")

    def flush(self, reason: str = "shutdown") -> None:
        """Emit whatever is buffered (nothing when empty)."""
        if self._buffer:
            self._cut(reason)

    def drop(self, predicate: Callable[[T], bool]) -> list[T]:
        """Remove and return the buffered items that match (e.g. those of a dead channel)."""
        dropped = [item for item in self._buffer if predicate(item)]
        if dropped:
            self._buffer = [item for item in self._buffer if not predicate(item)]
            if not self._buffer:
                self._cancel_timer()
        return dropped

    def close(self) -> None:
        self._cancel_timer()

    def _cut(self, reason: str) -> None:
        self._cancel_timer()
        batch, self._buffer = self._buffer, []
        if batch:
            self._sink(batch, reason)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
