"""Each test's CPU, recorded in the JUnit report beside its wall time (tests/durations.py).

Two figures per test, from its setup's start to its teardown's end:

- ``machine_cpu_s``: the whole machine's busy CPU seconds (``/proc/stat``: every state but
  idle and iowait), so the servers a test drives (RabbitMQ, PostgreSQL, the roles it starts)
  count. Exact when tests run one at a time; with tests side by side (``-n``) each test's
  figure includes its neighbours', and only the run's total means something.
- ``own_cpu_s``: this pytest process's and its waited-for children's CPU seconds.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pytest

_STAT = Path("/proc/stat")
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_STARTED = pytest.StashKey[tuple[float, float]]()


def machine_busy_seconds() -> float:
    """Busy CPU seconds of every core since boot (0.0 where ``/proc/stat`` is absent)."""
    try:
        first = _STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return 0.0
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    ticks = [int(v) for v in first[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / _TICK


def own_seconds() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_STARTED] = (machine_busy_seconds(), own_seconds())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.when == "teardown" and _STARTED in item.stash:
        machine, own = item.stash[_STARTED]
        report.user_properties.append(("machine_cpu_s", f"{machine_busy_seconds() - machine:.2f}"))
        report.user_properties.append(("own_cpu_s", f"{own_seconds() - own:.2f}"))
    return report
