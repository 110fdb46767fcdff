"""The failover tests' stall measure (tests/cluster/failover_support.py), on made-up samples.

Issue 23: the first leader kill of the broker-failover test was read as 11-18 s without a
commit, but the stretch began once every record of the first load was committed and lasted
until the test published its second load: a quiet queue, no stall. These pin the reading.
"""

from __future__ import annotations

from tests.cluster.failover_support import CommitWatch, longest_gap_after, waits_without_commit

KILL = 100.0


def _watch(*samples: tuple[float, int]) -> CommitWatch:
    watch = CommitWatch("postgresql://unused")
    watch.samples.extend(samples)
    return watch


# rows 0 -> 800 by +1 s (a 0.5 s stall at +0.5), then nothing until a second load at +20 s
QUIET_QUEUE = _watch(
    (KILL - 0.1, 0), (KILL + 0.1, 200), (KILL + 0.5, 400), (KILL + 1.0, 800), (KILL + 20.0, 900)
)


def test_without_a_bound_the_quiet_queue_reads_as_a_stall() -> None:
    assert QUIET_QUEUE.longest_stall_after(KILL) == 19.0


def test_bounded_by_the_rows_that_waited_only_the_real_stall_counts() -> None:
    start, length, rows = QUIET_QUEUE.longest_stall_span_after(KILL, until_rows=800)
    assert (round(start, 6), round(length, 6), rows) == (0.5, 0.5, 400)


def test_a_stretch_counts_only_from_when_more_records_were_confirmed_than_committed() -> None:
    # 2 records committed by +1; the third confirmed only at +4 and committed at +5: 1 s waited
    watch = _watch((KILL + 1.0, 2), (KILL + 5.0, 3), (KILL + 9.0, 4))
    ready = [KILL + 0.5, KILL + 0.6, KILL + 4.0, KILL + 5.5]
    stretches = waits_without_commit(watch, KILL, ready, base=0, until_rows=4)
    assert [(round(a - KILL, 6), round(b - KILL, 6)) for a, b in stretches] == [
        (0.5, 1.0),
        (4.0, 5.0),
        (5.5, 9.0),
    ]


def test_the_quiet_time_before_the_next_record_is_confirmed_is_not_counted() -> None:
    watch = _watch((KILL + 1.0, 1), (KILL + 30.0, 2))
    assert waits_without_commit(watch, KILL, [KILL + 0.1, KILL + 29.9], 0, 2) == [
        (KILL + 0.1, KILL + 1.0),
        (KILL + 29.9, KILL + 30.0),
    ]


def test_longest_gap_between_confirms_within_a_window() -> None:
    assert longest_gap_after([1.0, 2.0, 6.0, 7.0], 0.0, 8.0) == 4.0
    assert longest_gap_after([], 3.0, 5.0) == 2.0
