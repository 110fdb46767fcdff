"""UUIDv7 (RFC 9562) as ``bulk_recorder.infra.ids.uuid7`` makes it: layout, order, uniqueness."""

from __future__ import annotations

import random
import time
import uuid
from itertools import pairwise

import pytest

from bulk_recorder.infra import ids
from bulk_recorder.infra.ids import uuid7


def _ms(value: str) -> int:
    return uuid.UUID(value).int >> 80


def test_version_and_variant_bits_are_rfc_9562_v7() -> None:
    for _ in range(1_000):
        u = uuid.UUID(uuid7())
        assert u.version == 7
        assert u.variant == uuid.RFC_4122
        assert (u.int >> 62) & 0b11 == 0b10


def test_the_timestamp_is_unix_milliseconds_now() -> None:
    before = time.time_ns() // 1_000_000
    value = uuid7()
    after = time.time_ns() // 1_000_000
    assert before <= _ms(value) <= after


def test_ids_are_strictly_increasing_across_calls() -> None:
    made = [uuid7() for _ in range(20_000)]
    assert made == sorted(made)  # as text, as PostgreSQL's uuid compares: byte order
    assert all(uuid.UUID(a).int < uuid.UUID(b).int for a, b in pairwise(made))


def test_order_holds_within_one_millisecond_and_past_the_counter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ids, "_CLOCK", ids._Clock())  # the process's own order left as it was
    frozen = time.time_ns()
    monkeypatch.setattr(time, "time_ns", lambda: frozen)
    made = [uuid.UUID(uuid7()).int for _ in range(10_000)]  # more than a 12-bit counter holds
    assert all(a < b for a, b in pairwise(made))
    assert made[0] >> 80 == frozen // 1_000_000
    # The counter's overflow borrows the next millisecond rather than breaking the order.
    assert made[-1] >> 80 > frozen // 1_000_000


def test_order_holds_when_the_clock_steps_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ids, "_CLOCK", ids._Clock())
    first = uuid.UUID(uuid7()).int
    monkeypatch.setattr(time, "time_ns", lambda: 0)
    assert uuid.UUID(uuid7()).int > first


def test_unique_over_many_calls_and_the_random_part_varies() -> None:
    rng = random.Random(7)
    made = [uuid7(rng) for _ in range(100_000)]
    assert len(set(made)) == len(made)
    # rand_b is drawn for every id: the low 62 bits differ between neighbours.
    low = {uuid.UUID(v).int & ((1 << 62) - 1) for v in made}
    assert len(low) == len(made)


class _HighestBits(random.Random):
    """Every draw all ones: the counter's highest seed, and rand_b's."""

    def getrandbits(self, k: int) -> int:
        return (1 << k) - 1


def test_2049_ids_fit_in_one_millisecond_even_from_the_highest_seed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The counter is seeded with 11 random bits (at most 2,047) and counts to 4,095: the
    documented "at least 2,048 ids in one millisecond" holds for every seed, here the
    highest, with exactly one more (2,049) before the next millisecond is borrowed."""
    monkeypatch.setattr(ids, "_CLOCK", ids._Clock())
    frozen = time.time_ns()
    monkeypatch.setattr(time, "time_ns", lambda: frozen)
    rng = _HighestBits()
    made = [uuid.UUID(uuid7(rng)).int for _ in range(2_050)]
    now_ms = frozen // 1_000_000
    assert [(value >> 64) & 0xFFF for value in made[:2]] == [2_047, 2_048]
    assert {value >> 80 for value in made[:2_049]} == {now_ms}
    assert made[2_049] >> 80 == now_ms + 1  # the 2,050th borrows the next millisecond
    assert all(a < b for a, b in pairwise(made))
