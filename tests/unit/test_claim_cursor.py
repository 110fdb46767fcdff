"""Where the relay's next claim starts (bulk_recorder/producer/relay_claim.py): from the cursor,
with a rescan from the start at most every RESCAN_EVERY_S seconds, or RESCAN_COST_FACTOR times
as long as the last rescan took."""

from __future__ import annotations

from bulk_recorder.producer.relay_claim import RESCAN_COST_FACTOR, RESCAN_EVERY_S, ClaimCursor


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_relay_starts_with_a_rescan_then_claims_from_where_the_last_claim_started() -> None:
    clock = Clock()
    cursor = ClaimCursor(clock)
    assert cursor.begin() == 0
    cursor.end(0, 1_000, took_s=0.001)
    assert cursor.begin() == 1_000
    cursor.end(1_000, 1_500, took_s=0.001)
    assert cursor.begin() == 1_500
    cursor.end(1_500, None, took_s=0.001)  # nothing there: the cursor stays
    assert cursor.floor == 1_500


def test_a_rescan_comes_every_second_or_ten_times_its_cost() -> None:
    assert (RESCAN_EVERY_S, RESCAN_COST_FACTOR) == (1.0, 10)  # as docs/producer.md says
    clock = Clock()
    cursor = ClaimCursor(clock)
    cursor.end(cursor.begin(), 10, took_s=0.001)
    clock.now += 0.999
    assert cursor.begin() == 10
    clock.now += 0.001
    assert cursor.begin() == 0  # a second after the last rescan
    assert cursor.begin() == 10  # one lane rescans; the others go on from the cursor
    cursor.end(0, 5, took_s=0.5)  # a rescan that found a row committed late, below the cursor
    assert cursor.floor == 5
    clock.now += 4.999
    assert cursor.begin() == 5
    clock.now += 0.001
    assert cursor.begin() == 0  # ten times the 0.5 s the last one took


def test_a_claim_that_began_before_a_rescan_lowered_the_cursor_leaves_it_there() -> None:
    clock = Clock()
    cursor = ClaimCursor(clock)
    cursor.end(cursor.begin(), 2_000, took_s=0.001)
    clock.now += RESCAN_EVERY_S
    other = cursor.begin()  # a lane claims from the rescan ...
    lane = cursor.begin()  # ... another from the cursor, at the same time
    assert (other, lane) == (0, 2_000)
    cursor.end(other, 700, took_s=0.01)
    cursor.end(lane, 2_500, took_s=0.001)
    assert cursor.floor == 700
