"""The partition nemesis's schedule (tests/partitions/nemesis.py): pure, drawn from a seed."""

from __future__ import annotations

from collections import Counter

from tests.partitions.nemesis import KINDS, SHORT_KINDS, Plan, draw
from tests.rigs.hosted import BROKERS, HOSTS, SERVICES


def test_the_same_seed_draws_the_same_schedule_and_another_seed_another() -> None:
    plan = Plan(30.0, 3)
    assert draw(7, plan) == draw(7, plan)
    assert draw(7, plan) != draw(8, plan)


def test_each_kind_once_before_any_repeats_inside_the_window() -> None:
    plan = Plan(180.0, 12)
    schedule = draw(11, plan)
    counts = Counter(f.kind for f in schedule)
    assert set(counts) == set(KINDS)
    assert max(counts.values()) - min(counts.values()) <= 1
    for fault in schedule:
        assert fault.at >= 1.0
        assert fault.at + fault.duration <= plan.seconds
        assert fault.a
        assert fault.b
        assert not set(fault.a) & set(fault.b)
        assert set(fault.a) | set(fault.b) <= set(HOSTS)
    assert [f.at for f in schedule] == sorted(f.at for f in schedule)


def test_a_broker_minority_cuts_one_node_from_the_two_others() -> None:
    for seed in range(20):
        for fault in draw(seed, Plan(60.0, len(KINDS))):
            if fault.kind == "broker_minority":
                assert len(fault.a) == 1
                assert set(fault.a) | set(fault.b) == set(BROKERS)


def test_the_database_kinds_cut_the_primary_from_its_standby_or_one_way_from_a_service() -> None:
    seen = set()
    for seed in range(20):
        for fault in draw(seed, Plan(120.0, len(KINDS))):
            if fault.kind == "primary_standby":
                assert (fault.a, fault.b) == (("pg1",), ("pg2",))
            if fault.kind == "service_database_one_way":
                ends = {fault.a, fault.b}
                assert ("pg1",) in ends
                (service,) = next(iter(ends - {("pg1",)}))
                assert service in SERVICES
                seen.add(fault.a == ("pg1",))
    assert seen == {True, False}, "both directions are drawn"


def test_the_short_run_draws_the_network_kinds_only() -> None:
    for seed in range(20):
        assert {f.kind for f in draw(seed, Plan(30.0, 3), SHORT_KINDS)} <= set(SHORT_KINDS)
    assert set(SHORT_KINDS) < set(KINDS)
