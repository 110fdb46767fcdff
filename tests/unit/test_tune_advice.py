"""``bulk-recorder tune``'s conclusions (pure): histograms read as Prometheus writes them, and the
recommendations and warnings drawn from them; plus the cheap histogram the recorder exports."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bulk_recorder.infra.histograms import SettleHistogram
from bulk_recorder.infra.metrics import ATTEMPT_BUCKETS, HOLD_BUCKETS
from consumer.tools.tune_advice import (
    Histogram,
    Measured,
    advise,
    as_json,
    recommend_consumer_timeout,
    render,
    safe_release_after,
)

INF = math.inf


def histogram(bounds: tuple[float, ...], values: list[float]) -> Histogram:
    """What a recorder would export after observing ``values``."""
    counts = {b: float(sum(v <= b for v in values)) for b in (*bounds, INF)}
    return Histogram.from_counts(counts)


def measured(
    holds: list[float],
    attempts: list[int],
    *,
    limit: int | None = 5,
    release: float | None = 60.0,
    timeout: float | None = None,
    dead: list[int] | None = None,
) -> Measured:
    return Measured(
        hold=histogram(HOLD_BUCKETS, holds),
        recorded_attempts=histogram(ATTEMPT_BUCKETS, [float(a) for a in attempts]),
        dead_lettered_attempts=histogram(ATTEMPT_BUCKETS, [float(a) for a in dead or []]),
        delivery_limit=limit,
        release_after_s=release,
        consumer_timeout_s=timeout or 1800.0,
        consumer_timeout_assumed=timeout is None,
    )


def test_worst_is_the_bound_of_the_highest_bucket_that_holds_anything() -> None:
    h = histogram(HOLD_BUCKETS, [0.003, 0.2, 4.2, 0.2])
    assert h.worst() == 5.0
    assert histogram(HOLD_BUCKETS, [5.0]).worst() == 5.0  # le: a value on a bound is in it
    assert histogram(HOLD_BUCKETS, [5.0001]).worst() == 10.0
    assert histogram(HOLD_BUCKETS, [4000.0]).worst() == INF
    assert histogram(HOLD_BUCKETS, []).worst() is None


def test_quantile_interpolates_within_its_bucket_as_histogram_quantile_does() -> None:
    h = Histogram.from_counts({1.0: 0.0, 2.0: 1000.0, INF: 1000.0})
    assert h.quantile(0.5) == pytest.approx(1.5)
    assert h.quantile(0.999) == pytest.approx(1.999)
    beyond = Histogram.from_counts({1.0: 10.0, INF: 20.0})
    assert beyond.quantile(0.999) == 1.0  # in +Inf: the highest finite bound
    assert Histogram(()).quantile(0.999) is None


def test_consumer_timeout_is_twice_the_longer_of_worst_hold_and_release_plus_a_minute() -> None:
    assert recommend_consumer_timeout(5.0, 60.0) == 180.0  # 2 x 60 + 60
    assert recommend_consumer_timeout(300.0, 60.0) == 660.0  # 2 x 300 + 60
    assert recommend_consumer_timeout(301.0, 60.0) == 720.0  # 662 s -> up to 12 min
    assert recommend_consumer_timeout(2.5, None) == 120.0
    assert safe_release_after(1800.0) == 870.0
    assert safe_release_after(180.0) == 60.0


def test_defaults_with_quick_flushes_and_no_redelivery_warn_of_nothing() -> None:
    advice = advise(measured([0.05] * 1000 + [0.4], [1] * 1001))
    assert advice.worst_hold_s == 1.0  # 0.4 s is in the bucket (0.25, 1]
    assert advice.attempts_needed == 1
    assert advice.consumer_timeout_s == 180.0
    assert advice.release_after_s == 60.0
    assert advice.delivery_limit == 3
    assert advice.warnings == []


def test_a_limit_reached_by_valid_records_warns_and_recommends_two_more() -> None:
    """x-delivery-limit=5 lets the broker deliver 6 times (tests/integration/
    test_delivery_limit.py): a record recorded at attempt 6 had no redelivery to spare; one
    at attempt 5 still had one."""
    advice = advise(measured([0.1], [1, 1, 3, 6], limit=5))
    assert advice.attempts_needed == 6
    assert advice.delivery_limit == 8
    assert any("RABBITMQ_DELIVERY_LIMIT=5 has been reached" in w for w in advice.warnings)
    assert advise(measured([0.1], [1, 5], limit=5)).warnings == []


def test_a_release_time_not_well_below_the_timeout_warns_and_is_capped() -> None:
    advice = advise(measured([1.0], [1], release=600.0, timeout=900.0))
    assert advice.release_after_s == 420.0  # (900 - 60) / 2
    assert any("is not well below the consumer timeout" in w for w in advice.warnings)
    assert advice.consumer_timeout_s == 900.0  # 2 x 420 + 60, already a whole minute


def test_holds_beyond_the_timeout_in_force_are_named() -> None:
    advice = advise(measured([700.0], [1], release=60.0, timeout=600.0))
    assert advice.worst_hold_s == 1200.0
    assert advice.consumer_timeout_s == 2460.0  # 2 x 1200 + 60 s, a whole minute (41 min)
    assert any("shorter than the longest hold" in w for w in advice.warnings)
    short = advise(measured([200.0], [1], release=60.0, timeout=400.0))
    assert any("does not cover twice the longest hold" in w for w in short.warnings)


def test_nothing_measured_recommends_nothing_but_still_checks_the_release_time() -> None:
    advice = advise(measured([], [], release=1000.0))
    assert advice.worst_hold_s is None
    assert advice.attempts_needed is None
    assert advice.consumer_timeout_s is None
    assert advice.delivery_limit is None
    assert len(advice.warnings) == 1
    text = render(advice, measured([], [], release=1000.0), 1)
    assert "nothing settled yet" in text
    assert "measure first" in text
    assert "assumed: RabbitMQ's default" in text


def test_json_carries_every_figure() -> None:
    m = measured([4000.0], [2], timeout=7200.0, dead=[1, 5])
    out = as_json(advise(m), m, 2)
    assert out["measured"] == {
        "settled": 1.0,
        "worst_hold_seconds_at_most": "+Inf",
        "p999_hold_seconds": 3600.0,
        "recorded": 1.0,
        "attempts_needed": 2,
        "dead_lettered_attempt_at_most": 5,
    }
    assert out["recommended"] == {
        "consumer_timeout_ms": 7_260_000,  # beyond the last bucket: 2 x 3600 + 60
        "release_after_s": 60.0,
        "delivery_limit": 4,
    }
    assert out["in_force"] == {
        "consumer_timeout_ms": 7_200_000,
        "consumer_timeout_assumed": False,
        "release_after_s": 60.0,
        "delivery_limit": 5,
    }


def test_the_settle_histogram_exports_what_prometheus_client_would() -> None:
    registry = CollectorRegistry()
    h = SettleHistogram("x_seconds", "doc", "outcome", ("a", "b"), (1.0, 2.5), registry)
    h.observe_many([0.5, 1.0, 2.0, 9.0], "a")
    h.observe_many([], "b")
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in families[0].samples}
    assert samples[("x_seconds_bucket", (("le", "1.0"), ("outcome", "a")))] == 2
    assert samples[("x_seconds_bucket", (("le", "2.5"), ("outcome", "a")))] == 3
    assert samples[("x_seconds_bucket", (("le", "+Inf"), ("outcome", "a")))] == 4
    assert samples[("x_seconds_count", (("outcome", "a"),))] == 4
    assert samples[("x_seconds_sum", (("outcome", "a"),))] == 12.5
    assert samples[("x_seconds_count", (("outcome", "b"),))] == 0
    with pytest.raises(ValueError, match="increasing"):
        SettleHistogram("y", "doc", "o", ("a",), (2.0, 1.0), registry)


@pytest.mark.parametrize("timeout", [400.0, 620.0, 659.0])
def test_a_consumer_timeout_below_twice_the_worst_hold_plus_the_headroom_warns(
    timeout: float,
) -> None:
    """docs/operations.md: the timeout must cover twice the longest hold plus a minute. Holds
    of up to 300 s need 660 s, which tune recommends: 620 s in force is a WARNING, not silence."""
    advice = advise(measured([200.0], [1], release=60.0, timeout=timeout))
    assert advice.worst_hold_s == 300.0
    assert advice.consumer_timeout_s == 660.0
    warned = [w for w in advice.warnings if "does not cover twice the longest hold" in w]
    assert warned, f"timeout {timeout:g} s, recommended 660 s: {advice.warnings}"
    assert f"({timeout:g} s)" in warned[0]
    assert "WARNING: " + warned[0] in render(advice, measured([200.0], [1], timeout=timeout), 1)


def test_a_consumer_timeout_that_covers_twice_the_worst_hold_plus_the_headroom_is_quiet() -> None:
    assert advise(measured([200.0], [1], release=60.0, timeout=660.0)).warnings == []
