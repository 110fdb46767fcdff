"""Each role's stop budget: the longest a SIGTERM may take to become an exit, from the settings.

A stop is a sequence of steps. The first one has its own bound from the settings
(``BULK_RECORDER_SHUTDOWN_TIMEOUT_S``: the recorder's final flush, the relay's batches in flight,
the API's requests in flight); the recorder adds the wait for copies already published
(min(``BULK_RECORDER_CONFIRM_TIMEOUT_S``, :data:`FINAL_COPIES_S`)); every role ends with
:data:`CLOSE_S` to close its connections and its pool. The steps after the first take what
is left of the budget through one :class:`Deadline` passed down, never a bound of their own, so
a stop while the broker or the database is held still ends inside it. The grace periods of the
manifests are this total plus a margin (``tests/ops/test_stop_budget.py``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from settings import Settings

Role = Literal["consume", "relay", "api"]

# At shutdown, the longest wait for copies already published (each within its confirm timeout)
# after the bounded final flush.
FINAL_COPIES_S: Final = 8.0
# What every role's last steps share: the consuming channel's round trip and linger, the
# connections' close, the pool's close (terminated when the rest is spent).
CLOSE_S: Final = 5.0
# How long a broker connection's close may still take once its time is up: aiormq's writer
# waits this long for the broker's Close-Ok (``READER_CLOSE_TIMEOUT``), cancellation or not.
# A step that closes a connection is given its time less this.
CLOSE_OK_S: Final = 2.0
# A grace period is the budget plus this (the exit itself, the signal's delivery, a busy node).
GRACE_MARGIN_S: Final = 5.0


@dataclass(frozen=True, slots=True)
class StopBudget:
    """The named steps of one role's stop and their seconds, in order."""

    role: Role
    steps: tuple[tuple[str, float], ...]

    @property
    def total_s(self) -> float:
        return sum(seconds for _, seconds in self.steps)

    def step(self, name: str) -> float:
        return dict(self.steps)[name]

    def describe(self) -> str:
        parts = " + ".join(f"{name} {seconds:g} s" for name, seconds in self.steps)
        return f"stop budget ({self.role}): {parts} = {self.total_s:g} s from SIGTERM to exit"

    def deadline(self, clock: Callable[[], float] = time.monotonic) -> Deadline:
        return Deadline(self, clock)

    def grace_period_s(self, pre_stop_s: float = 0.0) -> int:
        """The shortest grace period (whole seconds) for this budget after a ``preStop`` wait."""
        return math.ceil(pre_stop_s + self.total_s + GRACE_MARGIN_S)


def stop_budget(role: Role, settings: Settings) -> StopBudget:
    """The stop budget of ``role`` (``consume``, ``relay`` or ``api``) with these settings."""
    first = settings.bulk_recorder_shutdown_timeout_s
    steps: tuple[tuple[str, float], ...]
    if role == "consume":
        copies = min(settings.bulk_recorder_confirm_timeout_s, FINAL_COPIES_S)
        steps = (("flush", first), ("copies", copies), ("close", CLOSE_S))
    elif role == "relay":
        steps = (("batches", first), ("close", CLOSE_S))
    else:  # uvicorn takes whole seconds for its graceful wait
        steps = (("requests", float(max(1, int(first)))), ("close", CLOSE_S))
    return StopBudget(role, steps)


class Deadline:
    """One stop's clock: started by :meth:`start` (the signal), or at the first question."""

    def __init__(self, budget: StopBudget, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self._clock = clock
        self._started: float | None = None

    def start(self) -> None:
        if self._started is None:
            self._started = self._clock()

    @property
    def started(self) -> bool:
        return self._started is not None

    def elapsed(self) -> float:
        self.start()
        assert self._started is not None
        return self._clock() - self._started

    def left(self, reserve_s: float = 0.0) -> float:
        """Seconds left of the whole budget, less ``reserve_s`` kept for later steps (>= 0)."""
        return max(0.0, self.budget.total_s - self.elapsed() - reserve_s)

    def left_for(self, step: str) -> float:
        """Seconds left until the end of ``step``'s share (unused earlier time included)."""
        end = 0.0
        for name, seconds in self.budget.steps:
            end += seconds
            if name == step:
                return max(0.0, end - self.elapsed())
        raise KeyError(step)
