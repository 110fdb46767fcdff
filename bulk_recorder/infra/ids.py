"""Record ids: UUIDv7, time-ordered, as the API and the load generator make them."""

from __future__ import annotations

import random
import time
import uuid


def uuid7(rng: random.Random | None = None) -> str:
    """A UUIDv7 (RFC 9562): 48-bit Unix milliseconds, version 7, variant 10, random rest."""
    ms = time.time_ns() // 1_000_000
    rand = (rng or _SYSTEM_RNG).getrandbits(74)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


_SYSTEM_RNG = random.SystemRandom()
