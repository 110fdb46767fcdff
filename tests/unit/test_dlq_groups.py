"""The DLQ's reason groups and first/last seen (pure logic of `dlq inspect`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from consumer.tools.dlq_groups import Groups, reason_group, seen_at

AT = datetime(2026, 12, 1, 22, 30, 1, 123000, tzinfo=UTC)


def test_reason_groups_blank_ids_numbers_and_fold_white_space() -> None:
    a = (
        'database refused the row: 23505 duplicate key value violates unique constraint "p"\n'
        "DETAIL:  Key (id)=(01a233bd-4606-7d26-b2bf-8a09670bf12f) already exists."
    )
    b = a.replace("01a233bd-4606-7d26-b2bf-8a09670bf12f", "FC1CC07C-64FC-455F-BDBF-11B9083C23D7")
    assert reason_group(a) == reason_group(b)
    assert reason_group(a) == (
        'database refused the row: # duplicate key value violates unique constraint "p" '
        "DETAIL: Key (id)=(<id>) already exists."
    )
    assert reason_group("debits 1.00 != credits 2.00") == "debits #.# != credits #.#"
    assert reason_group("missing type property") != reason_group("missing: ledger_id")


def test_seen_at_prefers_the_recorders_header_then_x_death_then_the_timestamp() -> None:
    header = {"x-bulk-recorder-dead-lettered-at": "2026-12-01T22:30:01.123Z"}
    death = {"x-death": [{"reason": "delivery_limit", "time": datetime(2026, 11, 30)}]}
    published = datetime(2026, 11, 29, 1, 0, tzinfo=timezone(timedelta(hours=-3)))
    assert seen_at({**header, **death}, published) == (AT, "dead-lettered-at")
    assert seen_at(death, published) == (datetime(2026, 11, 30, tzinfo=UTC), "x-death")
    assert seen_at({}, published) == (datetime(2026, 11, 29, 4, 0, tzinfo=UTC), "timestamp")
    assert seen_at(None, None) == (None, "none")
    # a header of that name that is not a time is passed over, not trusted
    assert seen_at({"x-bulk-recorder-dead-lettered-at": b"yesterday"}, None) == (None, "none")


def test_groups_count_first_and_last_seen_and_say_where_the_times_come_from() -> None:
    groups = Groups(samples=1)
    for minutes, reason in [(5, "debits 1.00 != credits 2.00"), (1, "debits 3.10 != credits 0.01")]:
        stamp = (AT + timedelta(minutes=minutes)).isoformat()
        groups.add({"x-bulk-recorder-dead-lettered-at": stamp}, None, reason, f"s{minutes}")
    groups.add({}, None, "invalid JSON")
    report = groups.as_json("q.dlq")
    assert report["messages"] == 3
    assert report["groups"] == [
        {
            "reason": "debits #.# != credits #.#",
            "count": 2,
            "first_seen": "2026-12-01T22:31:01.123Z",
            "last_seen": "2026-12-01T22:35:01.123Z",
            "seen_from": {"dead-lettered-at": 2},
            "samples": ["s5"],
        },
        {
            "reason": "invalid JSON",
            "count": 1,
            "first_seen": None,
            "last_seen": None,
            "seen_from": {"none": 1},
            "samples": [],
        },
    ]
    text = "\n".join(groups.lines("q.dlq"))
    assert "       2  debits #.# != credits #.#" in text
    assert (
        "  2026-12-01T22:31:01.123Z  2026-12-01T22:35:01.123Z  debits #.# != credits #.#  "
        "(from dead-lettered-at 2)"
    ) in text
    assert (
        "  -                         -                         invalid JSON  (from none 1)" in text
    )
