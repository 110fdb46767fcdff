"""The relay's long-lived tasks kept alive: :func:`supervise` runs them until ``stop`` and starts
again any that ends before. :mod:`bulk_recorder.producer.relay` hands it its loops and lanes.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger("bulk_recorder.outbox")  # the name logs have always carried

Starter = Callable[[], Coroutine[Any, Any, None]]

_RESTART_BASE_S = 0.5
_RESTART_CAP_S = 30.0


async def supervise(
    tasks: dict[str, asyncio.Task[None]], starters: dict[str, Starter], stop: asyncio.Event
) -> None:
    """Run every task until ``stop``; one that ends before is logged and started again.

    ``tasks`` is filled here (by name) and kept current, so the caller sees the live tasks.
    None of them should ever end on its own: each handles the failures of what it waits on.
    So an end here is a bug (or an exception nobody foresaw). It is logged with its cause,
    the task counts as down in ``Relay.ready`` meanwhile, and it is restarted after a backoff
    that doubles with each death of the same task (0.5 s up to 30 s), so that a task which
    dies at once every time cannot spin.
    """
    loop = asyncio.get_running_loop()
    deaths: Counter[str] = Counter()
    due: dict[str, float] = {}  # dead task -> when it starts again
    for name, start in starters.items():
        tasks[name] = asyncio.create_task(start(), name=name)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            timeout = max(0.0, min(due.values()) - loop.time()) if due else None
            live = {t for name, t in tasks.items() if name not in due}
            await asyncio.wait(
                {stopped, *live}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if stop.is_set():
                break
            for name, task in tasks.items():
                if task.done() and name not in due:
                    delay = min(_RESTART_CAP_S, _RESTART_BASE_S * 2 ** min(deaths[name], 10))
                    deaths[name] += 1
                    due[name] = loop.time() + delay
                    _log_death(task, delay)
            for name, when in list(due.items()):
                if when <= loop.time():
                    del due[name]
                    log.warning("restarting %s", name)
                    tasks[name] = asyncio.create_task(starters[name](), name=name)
    finally:
        stopped.cancel()


def _log_death(task: asyncio.Task[None], delay: float) -> None:
    name = task.get_name()
    if task.cancelled():
        log.error("%s was cancelled; restarting it in %.1f s", name, delay)
    elif (exc := task.exception()) is not None:
        log.error("%s died (%r); restarting it in %.1f s", name, exc, delay, exc_info=exc)
    else:
        log.error("%s ended on its own; restarting it in %.1f s", name, delay)
