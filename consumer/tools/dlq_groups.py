"""The dead-letter queue by reason: why a message is there, when it got there, and the groups
``bulk-recorder dlq inspect`` prints (and ``--json``) and ``--reason R`` selects.

A reason is our ``x-bulk-recorder-error`` header, else the broker's ``x-death`` reason. Reasons
are grouped with their ids (UUIDs) and numbers blanked, so that ``debits 1.00 != credits 2.00`` and
``debits 3.10 != credits 0.01`` are one group; ``--reason`` takes a group as printed (or any
reason of it, whose numbers are blanked the same way).

When a message was seen in the DLQ, from the first of these that it carries:

- ``dead-lettered-at``: our ``x-bulk-recorder-dead-lettered-at`` header, the time the recorder
  dead-lettered it (UTC, milliseconds);
- ``x-death``: the time the broker dead-lettered it (its latest ``x-death`` entry, seconds);
- ``timestamp``: the message's ``timestamp`` property, the time its publisher says it was
  published (not when it was dead-lettered; many publishers do not set it);
- ``none``: no time at all (counted, never guessed).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from consumer.delivery import DEAD_LETTERED_AT_HEADER, ERROR_HEADER

SAMPLE_BYTES = 300
SEEN_SOURCES = ("dead-lettered-at", "x-death", "timestamp", "none")


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else None


def reason_of(headers: dict[str, Any] | None) -> str:
    """Why a message is in the DLQ: our header, else the broker's x-death reason."""
    headers = headers or {}
    ours = _text(headers.get(ERROR_HEADER))
    if ours is not None:
        return ours
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        death = deaths[0]
        cause = _text(death.get("reason")) or "unknown"
        queue = _text(death.get("queue")) or "?"
        return f"broker: {cause} (from {queue})"
    return "unknown (no reason header)"


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


def reason_group(reason: str) -> str:
    """A reason with its ids and numbers blanked and its white space folded, so that
    'debits 1.00 != credits 2.00' and 'debits 3.10 != credits 0.01' count as one line, and so
    do two rows the database refused for the same constraint (the DETAIL names the id)."""
    return re.sub(r"[0-9]+", "#", re.sub(r"\s+", " ", _UUID.sub("<id>", reason)))


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def seen_at(
    headers: dict[str, Any] | None, timestamp: datetime | None
) -> tuple[datetime | None, str]:
    """When the message was seen in the DLQ, and where that time comes from (SEEN_SOURCES)."""
    headers = headers or {}
    stamped = _text(headers.get(DEAD_LETTERED_AT_HEADER))
    if stamped is not None:
        try:
            return _utc(datetime.fromisoformat(stamped)), "dead-lettered-at"
        except ValueError:
            pass  # not ours after all: fall through to the next source
    deaths = headers.get("x-death")
    if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        when = deaths[0].get("time")
        if isinstance(when, datetime):
            return _utc(when), "x-death"
    if isinstance(timestamp, datetime):
        return _utc(timestamp), "timestamp"
    return None, "none"


def stamp(moment: datetime | None) -> str:
    """A time as printed and in --json: UTC, milliseconds, or '-' when unknown."""
    if moment is None:
        return "-"
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def sample(body: bytes) -> str:
    text = body[:SAMPLE_BYTES].decode("utf-8", errors="replace")
    shown = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return shown + (f" ... ({len(body)} bytes)" if len(body) > SAMPLE_BYTES else "")


@dataclass(slots=True)
class Group:
    """The messages of one reason group: how many, first and last seen, samples."""

    reason: str
    count: int = 0
    first_seen: datetime | None = None
    last_seen: datetime | None = None
    seen_from: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)

    def add(self, moment: datetime | None, source: str) -> None:
        self.count += 1
        self.seen_from[source] += 1
        if moment is not None:
            if self.first_seen is None or moment < self.first_seen:
                self.first_seen = moment
            if self.last_seen is None or moment > self.last_seen:
                self.last_seen = moment

    def as_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "count": self.count,
            "first_seen": None if self.first_seen is None else stamp(self.first_seen),
            "last_seen": None if self.last_seen is None else stamp(self.last_seen),
            "seen_from": {s: self.seen_from[s] for s in SEEN_SOURCES if self.seen_from[s]},
            "samples": list(self.samples),
        }


class Groups:
    """Messages grouped by reason, largest group first."""

    def __init__(self, samples: int = 3) -> None:
        self._samples = samples
        self._groups: dict[str, Group] = {}
        self.total = 0

    def add(
        self,
        headers: dict[str, Any] | None,
        timestamp: datetime | None,
        reason: str,
        shown: str | None = None,
    ) -> Group:
        """Count one message of ``reason``; ``shown`` is its sample line (made only if wanted)."""
        key = reason_group(reason)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = Group(key)
        group.add(*seen_at(headers, timestamp))
        self.total += 1
        if shown is not None and len(group.samples) < self._samples:
            group.samples.append(shown)
        return group

    def wants_sample(self, reason: str) -> bool:
        group = self._groups.get(reason_group(reason))
        return len(group.samples) < self._samples if group else self._samples > 0

    def ordered(self) -> list[Group]:
        return sorted(self._groups.values(), key=lambda g: (-g.count, g.reason))

    def as_json(self, queue: str) -> dict[str, Any]:
        return {
            "queue": queue,
            "messages": self.total,
            "seen": "dead-lettered-at header, else x-death time, else timestamp property",
            "groups": [g.as_json() for g in self.ordered()],
        }

    def lines(self, queue: str) -> list[str]:
        """The text of ``dlq inspect``."""
        out = [f"dead-letter queue {queue}: {self.total} messages"]
        groups = self.ordered()
        if not groups:
            return out
        out.append(f"{'count':>8}  reason")
        out += [f"{g.count:>8}  {g.reason}" for g in groups]
        out.append(
            "first and last seen, UTC (from: the dead-lettered-at header, else x-death, "
            "else the timestamp property):"
        )
        for g in groups:
            sources = ", ".join(f"{s} {g.seen_from[s]}" for s in SEEN_SOURCES if g.seen_from[s])
            out.append(
                f"  {stamp(g.first_seen):<24}  {stamp(g.last_seen):<24}  {g.reason}  "
                f"(from {sources})"
            )
        if any(g.samples for g in groups):
            out.append("samples:")
            out += [f"  {line}" for g in groups for line in g.samples]
        return out
