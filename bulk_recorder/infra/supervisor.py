"""One supervisor for every long-lived task of every role, with one restart policy.

None of the tasks should ever end on its own: each handles the failures of what it waits on
(a broker or a database that is away). So a task that ends before the supervisor is stopped is a
bug, or an exception nobody foresaw. It is logged with its cause, counts as down (readiness
names it) and is started again after :data:`RESTART`'s wait, which doubles with each end of the
same task (0.5 s up to 30 s), so that a task which dies at once every time cannot spin.

A task started with ``once=True`` has a natural end (the recorder's intake pause ends when the
database is back): returning is its end; only a raise, or a cancellation nobody asked the
supervisor for, restarts it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from bulk_recorder.infra.backoff import RESTART, Backoff

log = logging.getLogger(__name__)

Starter = Callable[[], Coroutine[Any, Any, None]]


class Supervisor:
    """Runs named tasks and starts again any that ends before :meth:`close` (or ``stop``)."""

    def __init__(self, stop: asyncio.Event | None = None, *, backoff: Backoff = RESTART) -> None:
        self._stop = stop
        self._backoff = backoff
        self._closed = False
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._starters: dict[str, tuple[Starter, bool]] = {}
        self._ends: Counter[str] = Counter()
        self._restarts: Counter[str] = Counter()
        self._due: dict[str, asyncio.TimerHandle] = {}

    def stop_on(self, stop: asyncio.Event) -> None:
        """Once ``stop`` is set nothing is started again (tasks that end on it are not bugs)."""
        self._stop = stop

    @property
    def closing(self) -> bool:
        return self._closed or (self._stop is not None and self._stop.is_set())

    def start(self, name: str, starter: Starter, *, once: bool = False) -> None:
        """Run ``starter()`` as the task ``name``, and again whenever it ends unexpectedly."""
        if self.closing:
            return
        self._starters[name] = (starter, once)
        self._run(name)

    def running(self, name: str) -> bool:
        """True while ``name`` runs or waits to be started again."""
        return name in self._due or (name in self._tasks and not self._tasks[name].done())

    def down(self) -> list[str]:
        """The supervised tasks not running now (ended, waiting for their restart). A ``once``
        task that returned is done, not down, also before its end is handled (the done
        callback runs a loop turn later: readiness must not flicker in between)."""
        return [
            name
            for name, task in self._tasks.items()
            if task.done() and not (self._starters[name][1] and _returned(task))
        ]

    def restarts(self, prefix: str = "") -> int:
        """How many times the tasks whose name starts with ``prefix`` were started again."""
        return sum(n for name, n in self._restarts.items() if name.startswith(prefix))

    def tasks(self, prefix: str = "") -> list[asyncio.Task[None]]:
        return [task for name, task in self._tasks.items() if name.startswith(prefix)]

    def close(self) -> None:
        """From now on nothing is started again (a shutdown)."""
        self._closed = True
        for handle in self._due.values():
            handle.cancel()
        self._due.clear()

    async def cancel(self, prefix: str = "", *, within_s: float | None = None) -> None:
        """Cancel the tasks whose name starts with ``prefix`` and wait for their end (at most
        ``within_s``: a shielded step may outlast it, and a stop must not wait past its budget)."""
        tasks = self.tasks(prefix)
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        done, pending = await asyncio.wait(tasks, timeout=within_s)
        for task in done:  # retrieved, as gather(return_exceptions=True) would
            if not task.cancelled():
                task.exception()
        if pending:
            names = ", ".join(sorted(t.get_name() for t in pending))
            log.warning("still ending after %.1f s, left behind: %s", within_s or 0.0, names)

    def _run(self, name: str) -> None:
        starter, _ = self._starters[name]
        task = asyncio.create_task(starter(), name=name)
        self._tasks[name] = task
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        name = task.get_name()
        if self.closing or self._tasks.get(name) is not task:
            return
        _, once = self._starters[name]
        if once and _returned(task):
            del self._tasks[name]
            return
        delay = self._backoff.ceiling(self._ends[name])
        self._ends[name] += 1
        _log_end(task, delay)
        self._due[name] = asyncio.get_running_loop().call_later(delay, self._restart, name, task)

    def _restart(self, name: str, ended: asyncio.Task[None]) -> None:
        self._due.pop(name, None)
        if self.closing or self._tasks.get(name) is not ended:
            return
        log.warning("restarting %s", name)
        self._restarts[name] += 1
        self._run(name)


def _returned(task: asyncio.Task[None]) -> bool:
    """The task ended by returning: neither cancelled nor raising."""
    return not task.cancelled() and task.exception() is None


def _log_end(task: asyncio.Task[None], delay: float) -> None:
    name = task.get_name()
    if task.cancelled():
        log.error("%s was cancelled; restarting it in %.1f s", name, delay)
    elif (exc := task.exception()) is not None:
        log.error("%s died (%r); restarting it in %.1f s", name, exc, delay, exc_info=exc)
    else:
        log.error("%s ended on its own; restarting it in %.1f s", name, delay)
