"""The recorder's intake pause during a long database outage, and the probe that ends it.

A batch released after a long outage pauses intake: the consumer is cancelled, what is held
(buffered or queued) goes back to the broker, and a probe write is tried with :data:`RETRY`'s
growing backoff until it succeeds; then intake resumes. The pause runs as a supervised task
(``intake-pause``): if it raised, it would be started again, never leaving intake paused for
ever. What it needs of the recorder is the small :class:`Intake` protocol, so that it is
tested without a broker (tests/unit/test_intake_pause.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from bulk_recorder.infra.backoff import RETRY, Backoff
from bulk_recorder.infra.broker import broker_failures_suppressed
from bulk_recorder.infra.supervisor import Supervisor
from bulk_recorder.recorder.flusher import Pending

log = logging.getLogger(__name__)

TASK = "intake-pause"


class Intake(Protocol):
    """The recorder's side of a pause."""

    async def stop_consuming(self) -> None: ...

    async def start_consuming(self) -> None: ...

    def take_held(self) -> list[Pending]:
        """Every delivery held and not being written: buffered, or queued for a worker."""
        ...

    async def release(self, held: list[Pending]) -> None:
        """Hand ``held`` back to the broker."""
        ...

    async def probe(self) -> None:
        """A real write, rolled back; raises while the database cannot take it."""
        ...

    def recovered(self) -> None:
        """The database is back (the flusher's outage ends)."""
        ...


class IntakePause:
    """Pauses ``intake`` until the database is back; ``allowed`` is set while it is not."""

    def __init__(self, intake: Intake, supervisor: Supervisor, *, backoff: Backoff = RETRY) -> None:
        self._intake = intake
        self._supervisor = supervisor
        self._backoff = backoff
        self.allowed = asyncio.Event()
        self.allowed.set()
        self._closed = False

    @property
    def paused(self) -> bool:
        return not self.allowed.is_set()

    def pause(self) -> None:
        """Start the pause, unless one runs already or the recorder is stopping."""
        if not self._closed and not self._supervisor.running(TASK):
            self._supervisor.start(TASK, self._until_database_returns, once=True)

    def close(self) -> None:
        """A shutdown: the probe loop ends; nothing resumes consuming."""
        self._closed = True

    async def _until_database_returns(self) -> None:
        intake = self._intake
        self.allowed.clear()
        await intake.stop_consuming()
        log.warning("intake paused until the database is back")
        await intake.release(intake.take_held())
        attempt = 0
        while not self._closed:
            await asyncio.sleep(self._backoff.delay(attempt))
            attempt += 1
            try:
                # a real write, rolled back: `SELECT 1` passes on a database that accepts
                # connections but refuses writes (read-only, disk full, a revoked privilege)
                await intake.probe()
            except Exception as exc:  # any failed probe means "not back yet", whatever its type
                log.debug("database probe failed: %r", exc)
                continue
            break
        intake.recovered()
        log.info("database is back: intake resumed")
        self.allowed.set()
        with broker_failures_suppressed():
            await intake.start_consuming()
