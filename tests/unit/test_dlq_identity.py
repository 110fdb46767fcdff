"""The fingerprints by which a DLQ command finds the messages it showed (pure logic)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from consumer.tools.dlq_identity import Plan, fingerprint


@dataclass(frozen=True)
class Seen:
    """The fields of an incoming message the fingerprint reads."""

    body: bytes = b'{"id": 1}'
    headers: dict[str, Any] = field(
        default_factory=lambda: {
            "x-bulk-recorder-error": "invalid JSON",
            "x-death": [{"reason": "rejected", "count": 1, "time": datetime(2026, 12, 1)}],
            "app": {"b": 2, "a": [1, b"x"]},
        }
    )
    content_type: str | None = "application/json"
    content_encoding: str | None = None
    delivery_mode: int = 2
    priority: int | None = 7
    correlation_id: str | None = "c"
    reply_to: str | None = "r"
    expiration: Any = None
    message_id: str | None = "m-1"
    timestamp: datetime | None = datetime(2026, 12, 1, tzinfo=UTC)
    type: str | None = "transaction"
    user_id: str | None = None
    app_id: str | None = None


def test_the_read_count_and_the_order_of_header_keys_do_not_change_a_fingerprint() -> None:
    seen = Seen()
    read_again = replace(seen, headers={"x-delivery-count": 3, **seen.headers})
    reordered = replace(
        seen, headers={**dict(reversed(seen.headers.items())), "app": {"a": [1, b"x"], "b": 2}}
    )
    assert fingerprint(read_again) == fingerprint(seen)  # type: ignore[arg-type]
    assert fingerprint(reordered) == fingerprint(seen)  # type: ignore[arg-type]


def test_the_body_every_property_and_every_header_value_change_a_fingerprint() -> None:
    seen = Seen()
    others = [
        replace(seen, body=b'{"id": 2}'),
        replace(seen, message_id="m-2"),
        replace(seen, priority=0),
        replace(seen, reply_to=None),
        replace(seen, timestamp=None),
        replace(seen, headers={**seen.headers, "x-bulk-recorder-error": "unknown type"}),
        replace(seen, headers={**seen.headers, "app": {"b": 2, "a": [1, "x"]}}),  # str, not bytes
    ]
    prints = {fingerprint(m) for m in [seen, *others]}  # type: ignore[arg-type]
    assert len(prints) == len(others) + 1


def test_a_plan_takes_each_message_shown_once_and_no_other() -> None:
    shown, copy, other = Seen(), Seen(), Seen(message_id="m-3")
    plan = Plan()
    plan.add(shown)  # type: ignore[arg-type]
    plan.add(copy)  # type: ignore[arg-type]
    assert len(plan) == 2
    assert not plan.spend(other)  # type: ignore[arg-type]
    assert [plan.spend(Seen()) for _ in range(3)] == [True, True, False]  # type: ignore[arg-type]
    assert len(plan) == 0
