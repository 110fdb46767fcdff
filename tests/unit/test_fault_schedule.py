"""The all-faults run's schedule (tests/cluster/schedule.py): one seed, one schedule."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.cluster.schedule import KINDS, Plan, draw

SHORT = Plan(30.0, heartbeat_grace=9.0, db_command_timeout=3.0)
LONG = Plan(240.0, heartbeat_grace=9.0, db_command_timeout=3.0, per_minute=1.5)


@pytest.mark.parametrize("plan", [SHORT, LONG], ids=["short", "long"])
def test_a_seed_gives_the_same_schedule_and_another_seed_another(plan: Plan) -> None:
    assert draw(7, plan) == draw(7, plan)
    assert draw(7, plan) != draw(8, plan)


def test_the_short_run_has_each_kind_once() -> None:
    for seed in range(50):
        assert Counter(f.kind for f in draw(seed, SHORT)) == Counter(KINDS)


def test_the_long_run_scales_with_its_length_but_fails_over_once() -> None:
    kinds = Counter(f.kind for f in draw(3, LONG))
    assert kinds["db_failover"] == 1
    assert kinds["broker_kill"] == 4  # 4 minutes x 1.5 a minute x 2/3
    assert kinds["recorder_kill"] == 12  # 4 x 1.5 x 2: there are two recorders
    assert kinds["relay_kill"] == kinds["broker_hold"] == kinds["db_hold"] == 6
    assert set(kinds) == set(KINDS)


@pytest.mark.parametrize("plan", [SHORT, LONG], ids=["short", "long"])
def test_holds_outlast_the_timeouts_they_test_and_every_fault_starts_in_the_window(
    plan: Plan,
) -> None:
    for seed in range(50):
        schedule = draw(seed, plan)
        assert [f.at for f in schedule] == sorted(f.at for f in schedule)
        for fault in schedule:
            assert 1.0 <= fault.at <= plan.seconds, fault
            if fault.kind == "broker_hold":
                assert fault.duration > plan.heartbeat_grace, fault
                assert fault.target in ("recorder-0", "recorder-1", "relay")
            if fault.kind == "db_hold":
                assert fault.duration > plan.db_command_timeout, fault
            if fault.kind == "broker_kill":
                assert fault.target in ("node-0", "node-1", "node-2")
                # early enough that the node is back about when the traffic ends
                assert fault.at <= max(2.0, plan.seconds - plan.node_restart), fault
