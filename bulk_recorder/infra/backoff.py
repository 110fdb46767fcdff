"""Capped exponential backoff with full jitter, shared by every retry loop of the service.

:data:`RETRY` is the one policy of every loop that waits for a service to come back (a broker
connection, the database, a probe, a lane's failed batch); :data:`RESTART` is the supervisor's
policy for a long-lived task that ended.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(slots=True)
class Backoff:
    """Capped exponential backoff with full jitter."""

    base_s: float = 0.05
    cap_s: float = 5.0

    def ceiling(self, attempt: int) -> float:
        """The longest wait of ``attempt`` (0 is the first): doubles with each, up to the cap."""
        return float(min(self.cap_s, self.base_s * 2.0 ** min(attempt, 30)))

    def delay(self, attempt: int) -> float:
        return random.uniform(0, self.ceiling(attempt))


# Reconnect, reopen, probe again: from 0.2 s, doubling, up to 5 s.
RETRY = Backoff(base_s=0.2, cap_s=5.0)
# A long-lived task that ended is started again after 0.5 s, doubling with each end, up to 30 s
# (no jitter: a task that dies at once every time cannot spin, and readiness shows it meanwhile).
RESTART = Backoff(base_s=0.5, cap_s=30.0)
