"""Record ids: UUIDv7 (RFC 9562), time-ordered, as the API and the load generator make them.

Python 3.11 has no ``uuid.uuid7``. Layout (RFC 9562 §5.7): 48-bit Unix milliseconds, version 7,
12-bit ``rand_a``, variant ``10``, 62-bit ``rand_b``. Ids made in one process are strictly
increasing, by RFC 9562 §6.2 method 1 (fixed-length dedicated counter): ``rand_a`` is a counter,
seeded with 11 random bits at each new millisecond (its top bit left 0, so that at least 2,048
ids fit in one millisecond) and raised by one for each further id in it; ``rand_b`` is random for
every id. When the counter would pass 12 bits, or the clock steps back, the id takes the last
millisecond used (plus one on overflow), so the order never breaks. Nothing in the recorder
relies on that order: it only makes inserts land at one edge of each index.
"""

from __future__ import annotations

import random
import threading
import time
import uuid

_MS_MASK = (1 << 48) - 1
_COUNTER_MAX = 0xFFF
_RAND_B_MASK = (1 << 62) - 1


class _Clock:
    """The last (millisecond, counter) handed out in this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ms = -1
        self.counter = 0

    def next(self, now_ms: int, rng: random.Random) -> tuple[int, int]:
        with self.lock:
            if now_ms > self.ms:
                self.ms, self.counter = now_ms, rng.getrandbits(11)
            elif self.counter < _COUNTER_MAX:
                self.counter += 1
            else:
                self.ms, self.counter = self.ms + 1, rng.getrandbits(11)
            return self.ms, self.counter


def uuid7(rng: random.Random | None = None) -> str:
    """A UUIDv7 (RFC 9562), greater than every one made before it in this process."""
    rng = rng or _SYSTEM_RNG
    ms, counter = _CLOCK.next(time.time_ns() // 1_000_000, rng)
    value = (ms & _MS_MASK) << 80
    value |= 0x7 << 76
    value |= counter << 64
    value |= 0b10 << 62
    value |= rng.getrandbits(62) & _RAND_B_MASK
    return str(uuid.UUID(int=value))


_SYSTEM_RNG = random.SystemRandom()
_CLOCK = _Clock()
