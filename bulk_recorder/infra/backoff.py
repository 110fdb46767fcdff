"""Capped exponential backoff with full jitter, shared by every retry loop of the service."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(slots=True)
class Backoff:
    """Capped exponential backoff with full jitter."""

    base_s: float = 0.05
    cap_s: float = 5.0

    def delay(self, attempt: int) -> float:
        return random.uniform(0, min(self.cap_s, self.base_s * (2 ** min(attempt, 30))))
