"""What ``bulk-recorder tune`` concludes from the measured figures: pure logic, no I/O.

Two numbers must be the ones measured for the item, never copied defaults:

- **The broker's consumer timeout** (RabbitMQ's ``consumer_timeout``, 30 min by default) must
  cover the longest a delivery is held, receipt to settle, with a margin. In this recorder a
  delivery is held by its flush, and during a database outage (or while the DLQ refuses it) for
  up to ``BULK_RECORDER_RELEASE_AFTER_S`` before it is released. So the timeout recommended is
  twice the longer of the measured worst hold and the release time, plus a minute, rounded up
  to a whole minute; and the release time must stay well below the timeout in force (at most
  half of it, less that minute).
- **The delivery limit** (``RABBITMQ_DELIVERY_LIMIT``) must let every valid record through: the
  attempts valid records were measured to need, plus two (the broker delivers a message limit + 1
  times, so a valid record has three redeliveries to spare). Poison still reaches the DLQ in a few
  deliveries, and a valid record is never dead-lettered for being redelivered after a crash.

Histograms are read as Prometheus writes them: cumulative counts per upper bound (``le``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

RABBITMQ_DEFAULT_CONSUMER_TIMEOUT_S = 1800.0
HEADROOM_S = 60.0  # added to twice the worst hold, and left below the timeout by a release
# Added to the most attempts a valid record was measured to need. The broker delivers a message
# x-delivery-limit + 1 times, so this leaves LIMIT_MARGIN + 1 redeliveries to spare.
LIMIT_MARGIN = 2


@dataclass(frozen=True, slots=True)
class Histogram:
    """Cumulative counts by upper bound, ascending; the last bound is +Inf."""

    buckets: tuple[tuple[float, float], ...]

    @staticmethod
    def from_counts(cumulative: dict[float, float]) -> Histogram:
        return Histogram(tuple(sorted(cumulative.items())))

    @property
    def count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0

    def worst(self) -> float | None:
        """The upper bound of the highest bucket that holds anything: every value observed is
        at most this (+Inf: beyond the last finite bound). None when nothing was observed."""
        previous = 0.0
        highest: float | None = None
        for bound, cumulative in self.buckets:
            if cumulative - previous > 1e-9:
                highest = bound
            previous = cumulative
        return highest

    def quantile(self, q: float) -> float | None:
        """As PromQL's ``histogram_quantile``: linear within the bucket that holds the rank;
        a rank in the +Inf bucket gives the highest finite bound."""
        total = self.count
        if total <= 0:
            return None
        rank = q * total
        lower, below = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower
                if cumulative == below:
                    return bound
                return lower + (bound - lower) * (rank - below) / (cumulative - below)
            lower, below = bound, cumulative
        return lower


@dataclass(frozen=True, slots=True)
class Measured:
    """What the recorders measured, and the values in force (None: unknown)."""

    hold: Histogram
    recorded_attempts: Histogram
    dead_lettered_attempts: Histogram
    delivery_limit: int | None
    release_after_s: float | None
    consumer_timeout_s: float
    consumer_timeout_assumed: bool  # not given: RabbitMQ's default assumed


@dataclass(slots=True)
class Advice:
    worst_hold_s: float | None
    p999_hold_s: float | None
    settled: float
    attempts_needed: int | None  # the most attempts a valid record needed (None: none recorded)
    recorded: float
    dead_lettered_at_most: int | None
    consumer_timeout_s: float | None  # recommended
    release_after_s: float | None
    delivery_limit: int | None
    warnings: list[str] = field(default_factory=list)


def _attempts(histogram: Histogram) -> int | None:
    """The highest attempt observed (beyond the last finite bucket: that bound + 1)."""
    worst = histogram.worst()
    if worst is None:
        return None
    if math.isinf(worst):
        finite = [bound for bound, _ in histogram.buckets if not math.isinf(bound)]
        return int(finite[-1]) + 1 if finite else None
    return int(worst)


def recommend_consumer_timeout(worst_hold_s: float, release_after_s: float | None) -> float:
    """2 x the longer of the worst hold and the release time, + HEADROOM_S, up to a minute."""
    longest = max(worst_hold_s, release_after_s or 0.0)
    return math.ceil((2 * longest + HEADROOM_S) / 60.0) * 60.0


def safe_release_after(consumer_timeout_s: float) -> float:
    """The longest release time well below ``consumer_timeout_s``: (timeout - HEADROOM_S) / 2."""
    return max(1.0, math.floor((consumer_timeout_s - HEADROOM_S) / 2))


def advise(m: Measured) -> Advice:
    worst = m.hold.worst()
    needed = _attempts(m.recorded_attempts)
    advice = Advice(
        worst_hold_s=worst,
        p999_hold_s=m.hold.quantile(0.999),
        settled=m.hold.count,
        attempts_needed=needed,
        recorded=m.recorded_attempts.count,
        dead_lettered_at_most=_attempts(m.dead_lettered_attempts),
        consumer_timeout_s=None,
        release_after_s=None,
        delivery_limit=None,
    )
    timeout = m.consumer_timeout_s
    release = m.release_after_s
    if release is not None:
        advice.release_after_s = min(release, safe_release_after(timeout))
        if release > safe_release_after(timeout):
            advice.warnings.append(
                f"BULK_RECORDER_RELEASE_AFTER_S={release:g} is not well below the consumer "
                f"timeout ({timeout:g} s): a delivery held through an outage may outlive the "
                f"timeout before it is released; keep it at most {safe_release_after(timeout):g}"
            )
    if worst is not None:
        basis = worst
        if math.isinf(worst):  # beyond the last bucket: what it says is a lower bound
            basis = max(bound for bound, _ in m.hold.buckets if not math.isinf(bound))
            advice.warnings.append(
                f"deliveries were held longer than the last bucket ({basis:g} s): the consumer "
                "timeout recommended is a lower bound; find what held them"
            )
        advice.consumer_timeout_s = recommend_consumer_timeout(basis, advice.release_after_s)
        if worst > timeout:
            advice.warnings.append(
                f"the consumer timeout ({timeout:g} s) is shorter than the longest hold measured "
                f"(at most {_seconds(worst)}): the broker has closed, or will close, channels "
                "whose deliveries were still being written"
            )
        elif 2 * worst + HEADROOM_S > timeout:
            advice.warnings.append(
                f"the consumer timeout ({timeout:g} s) does not cover twice the longest hold "
                f"measured (at most {_seconds(worst)}) plus {HEADROOM_S:g} s"
            )
    if needed is not None:
        advice.delivery_limit = needed + LIMIT_MARGIN
        # x-delivery-limit=N: the broker delivers N + 1 times, the last at attempt N + 1
        if m.delivery_limit is not None and needed > m.delivery_limit:
            advice.warnings.append(
                f"RABBITMQ_DELIVERY_LIMIT={m.delivery_limit} has been reached by valid records "
                f"(recorded at attempt {needed}): one more redelivery (a crash, a consumer "
                "timeout) and a valid record goes to the DLQ"
            )
    return advice


def _seconds(value: float) -> str:
    return "more than the last bucket (3600 s)" if math.isinf(value) else f"{value:g} s"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def render(advice: Advice, m: Measured, sources: int) -> str:
    """The report an operator reads (see docs/operations.md, "Tuning the two numbers")."""

    def opt(value: float | None, fmt: str = "{:g}") -> str:
        return "unknown" if value is None else fmt.format(value)

    worst = advice.worst_hold_s
    lines = [
        f"measured on {sources} source(s): {advice.settled:.0f} deliveries settled, "
        f"{advice.recorded:.0f} records recorded",
        "  hold, receipt to settle:   "
        + (
            "nothing settled yet"
            if worst is None
            else f"worst at most {_seconds(worst)}, p99.9 {advice.p999_hold_s:.3g} s"
        ),
        "  attempts valid records needed: "
        + ("none recorded yet" if advice.attempts_needed is None else f"{advice.attempts_needed}"),
        "  attempt at which poison was dead-lettered: "
        + (
            "none dead-lettered"
            if advice.dead_lettered_at_most is None
            else f"at most {advice.dead_lettered_at_most}"
        ),
        "",
        f"{'setting':<32}{'recommended':<24}in force now",
    ]
    ct_now = f"{m.consumer_timeout_s * 1000:.0f} ms ({_minutes(m.consumer_timeout_s)})"
    if m.consumer_timeout_assumed:
        ct_now += ", assumed: RabbitMQ's default (give --consumer-timeout)"
    ct_rec = advice.consumer_timeout_s
    rows = [
        (
            "consumer_timeout (RabbitMQ)",
            "measure first" if ct_rec is None else f"{ct_rec * 1000:.0f} ms ({_minutes(ct_rec)})",
            ct_now,
        ),
        ("BULK_RECORDER_RELEASE_AFTER_S", opt(advice.release_after_s), opt(m.release_after_s)),
        (
            "RABBITMQ_DELIVERY_LIMIT",
            "measure first" if advice.delivery_limit is None else str(advice.delivery_limit),
            opt(m.delivery_limit, "{}"),
        ),
    ]
    lines += [f"{name:<32}{rec:<24}{now}" for name, rec, now in rows]
    lines += [
        "",
        f"consumer_timeout = 2 x max(worst hold, release time) + {HEADROOM_S:g} s, rounded up to "
        f"a minute; release time <= (consumer timeout - {HEADROOM_S:g} s) / 2; "
        f"delivery limit = attempts valid records needed + {LIMIT_MARGIN}.",
    ]
    lines += [f"WARNING: {w}" for w in advice.warnings]
    return "\n".join(lines)


def as_json(advice: Advice, m: Measured, sources: int) -> dict[str, object]:
    def finite(value: float | None) -> float | str | None:
        return "+Inf" if value is not None and math.isinf(value) else value

    return {
        "sources": sources,
        "measured": {
            "settled": advice.settled,
            "worst_hold_seconds_at_most": finite(advice.worst_hold_s),
            "p999_hold_seconds": advice.p999_hold_s,
            "recorded": advice.recorded,
            "attempts_needed": advice.attempts_needed,
            "dead_lettered_attempt_at_most": advice.dead_lettered_at_most,
        },
        "recommended": {
            "consumer_timeout_ms": None
            if advice.consumer_timeout_s is None
            else int(advice.consumer_timeout_s * 1000),
            "release_after_s": advice.release_after_s,
            "delivery_limit": advice.delivery_limit,
        },
        "in_force": {
            "consumer_timeout_ms": int(m.consumer_timeout_s * 1000),
            "consumer_timeout_assumed": m.consumer_timeout_assumed,
            "release_after_s": m.release_after_s,
            "delivery_limit": m.delivery_limit,
        },
        "warnings": advice.warnings,
    }
