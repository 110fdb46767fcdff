"""Tests side by side without disturbing each other: a reader-writer lock on the shared services.

`make test` runs the suite on several pytest workers (pytest-xdist). Most tests only wait on
the machine's RabbitMQ and PostgreSQL, each with its own database and queue names, and may
overlap. A few fault what every test shares (a broker alarm blocks every publisher, a server
held or restarted fails whoever uses it) or time themselves: those are marked ``exclusive`` and
run with no other test of the shared services at the same time. A test that binds a fixed port
(a role's default) needs only that no other test binds it meanwhile: ``fixed_ports``.

- A test marked ``exclusive`` holds the lock exclusively, from before its setup to after its
  teardown. Run alone on workers (``-n 2 --dist loadgroup -m exclusive``, `make test`'s second
  phase), the run's main process holds it exclusively for the whole run instead, and the tests
  go in lanes: each rig's on one worker, the rest on one more.
- A test marked ``private`` touches nothing shared (pure logic, files, its own servers on ports
  of their own) and holds nothing.
- Every other test holds the lock shared.
- A test marked ``fixed_ports(port, ...)`` binds those fixed ports (a role's default, OTLP's):
  it holds the lock shared, and also one lock file per port, exclusively, so no other test
  binding the same port runs beside it, in this pytest run or another (xdist workers, the
  mutants' jobs, two shells). Nothing else in the suite may bind these ports (the roles are
  started with ``METRICS_PORT=0`` or a free port and a free ``API_PORT``). The port locks are
  taken before the suite lock, so a test waiting for a port holds nothing meanwhile.

The lock is two files (and one per fixed port) in the temporary directory, per user
(``flock``), so it also orders pytest processes that are not workers of one run: the mutants'
jobs, two shells. An exclusive test waiting for the lock goes first: it holds the gate every
test passes on its way in, so no new test starts while it waits for the running ones to end. A
pytest started by a test (a child session) holds nothing: its parent's hold covers it, and
taking the gate again could wait on a writer that waits on the parent.

The lock is taken in ``pytest_runtest_protocol``, outside the test's setup, so the wait does
not count against the test's own timeout (pytest-timeout).

With ``--dist loadgroup`` the tests of a group (``XDIST_GROUPS``) run on one worker, one after
the other, and every other test goes to whichever worker is free.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Generator, Iterator
from enum import Enum
from pathlib import Path

import pytest
from xdist.scheduler import LoadGroupScheduling

# Set while a test holds the lock, so that a pytest it starts holds nothing.
HELD_ENV = "PYTEST_SUITE_LOCK_HELD"
# Where the lock files live; a test of this module points it elsewhere.
DIR_ENV = "PYTEST_SUITE_LOCK_DIR"


class Hold(Enum):
    NONE = "none"
    SHARED = "shared"
    EXCLUSIVE = "exclusive"


def lock_dir() -> Path:
    configured = os.environ.get(DIR_ENV)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"bulk-recorder-tests-{os.getuid()}"


def ports_of(item: pytest.Item) -> tuple[int, ...]:
    """The fixed ports the test binds (its ``fixed_ports`` marker), in the order they are
    locked: ascending, so that two tests never wait on each other's ports in a circle."""
    marker = item.get_closest_marker("fixed_ports")
    if marker is None:
        return ()
    if hold_of(item) is not Hold.SHARED:
        raise pytest.UsageError(
            f"{item.nodeid}: marked fixed_ports and exclusive or private (an exclusive test"
            " has every port to itself; a private one touches nothing shared)"
        )
    ports = marker.args
    if not ports or not all(isinstance(p, int) and 0 < p < 65_536 for p in ports):
        raise pytest.UsageError(f"{item.nodeid}: fixed_ports needs the port numbers: {ports!r}")
    return tuple(sorted(set(ports)))


def hold_of(item: pytest.Item) -> Hold:
    exclusive = item.get_closest_marker("exclusive") is not None
    private = item.get_closest_marker("private") is not None
    if exclusive and private:
        raise pytest.UsageError(f"{item.nodeid}: marked both exclusive and private")
    if exclusive:
        return Hold.EXCLUSIVE
    if private:
        return Hold.NONE
    return Hold.SHARED


@contextlib.contextmanager
def held(hold: Hold, directory: Path | None = None) -> Iterator[None]:
    """Hold the suite lock as ``hold`` says, for the body of the ``with``."""
    if hold is Hold.NONE or os.environ.get(HELD_ENV):
        yield
        return
    where = directory or lock_dir()
    where.mkdir(parents=True, exist_ok=True)
    with open(where / "gate", "a+b") as gate, open(where / "suite", "a+b") as suite:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            if hold is Hold.EXCLUSIVE:
                # Holding the gate while waiting: tests arriving now wait behind this one.
                fcntl.flock(suite, fcntl.LOCK_EX)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        if hold is Hold.SHARED:
            fcntl.flock(suite, fcntl.LOCK_SH)
        os.environ[HELD_ENV] = hold.value
        try:
            yield
        finally:
            del os.environ[HELD_ENV]
            fcntl.flock(suite, fcntl.LOCK_UN)


@contextlib.contextmanager
def ports_held(ports: tuple[int, ...], directory: Path | None = None) -> Iterator[None]:
    """Each of ``ports`` to this process alone among the tests, for the body of the ``with``.
    A pytest started by a test holding the suite lock takes nothing: its parent's hold
    covers it."""
    if not ports or os.environ.get(HELD_ENV):
        yield
        return
    where = directory or lock_dir()
    where.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        for port in sorted(ports):
            lock = stack.enter_context(open(where / f"port-{port}", "a+b"))
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


@contextlib.contextmanager
def holding(
    hold: Hold, ports: tuple[int, ...] = (), directory: Path | None = None
) -> Iterator[None]:
    """What a test holds: its fixed ports first, then the suite lock (a test waiting for a port
    holds no part of the suite lock meanwhile, so an exclusive test is not kept waiting)."""
    with ports_held(ports, directory), held(hold, directory):
        yield


# Tests that share something only one process at a time may have: the cluster rig and the
# namespace rig (one session's rig each: their tests on one worker each, not one rig per
# worker), and modules whose private node is costly to boot per worker. The two rigs run side
# by side, six RabbitMQ nodes on two cores: one after the other they were the side-by-side
# phase's longest chain (875 s of its 897), and their tests that time a stall run in the
# exclusive phase.
XDIST_GROUPS = {
    "tests/cluster/": "cluster-rig",
    "tests/partitions/": "namespace-rig",
    "tests/faults/test_tls.py": "tls-node",
    "tests/faults/test_relay_poison.py": "poison-node",
    "tests/faults/test_dead_letter_refused.py": "dead-letter-node",
}


def xdist_group_of(nodeid: str) -> str | None:
    for prefix, group in XDIST_GROUPS.items():
        if nodeid.startswith(prefix):
            return group
    return None


# The exclusive phase (``-m exclusive``) in lanes: each rig's tests on one worker, every other
# test on one more, one after the other. The tests time themselves; a lane's test has only the
# other lanes' tests beside it (a rig's failover next to one stop, say), never the whole
# suite's load. Two lanes took the phase from 200 s to 126-143 s; a third lane (two of the
# other tests at once beside the rig's) failed a stop budget by its margin.
EXCLUSIVE_LANE = "exclusive-lane"
# Exclusive tests whose bounds are seconds, not milliseconds, in the cluster rig's lane, so that
# the two lanes take about as long (84 s and 138 s with every other test in the second lane).
RIG_LANE_TOO = (
    "tests/ops/test_prometheus_live.py",
    "tests/integration/test_queue_watch.py",
    "tests/integration/test_db_hosts.py",
    "tests/integration/test_relay_wakes.py",
)


def exclusive_lane_of(nodeid: str) -> str:
    """The lane of an exclusive test in the exclusive phase."""
    if nodeid.startswith(RIG_LANE_TOO):
        return XDIST_GROUPS["tests/cluster/"]
    return xdist_group_of(nodeid) or EXCLUSIVE_LANE


def exclusive_phase(config: pytest.Config) -> bool:
    """The run selects the tests marked exclusive and no other."""
    return str(config.getoption("markexpr")).strip() == "exclusive"


class SuiteGroups(LoadGroupScheduling):  # type: ignore[misc]  # xdist has no types
    """xdist's ``loadgroup`` with the groups taken from the test's path. (xdist reads an
    ``xdist_group`` mark by renaming the item, which pytest 9 no longer lets it do: a marked
    test would run on any worker.) In the exclusive phase every test is in a group: its rig's,
    or the one lane of the others."""

    def _split_scope(self, nodeid: str) -> str:
        if exclusive_phase(self.config):
            return exclusive_lane_of(nodeid)
        return xdist_group_of(nodeid) or super()._split_scope(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> SuiteGroups | None:
    if config.getoption("dist") != "loadgroup":
        return None
    return SuiteGroups(config, log)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "exclusive(reason): faults a shared service or times itself: runs with no other test of "
        "the shared services beside it (tests/suite_lock.py)",
    )
    config.addinivalue_line(
        "markers",
        "fixed_ports(port, ..., reason): binds these fixed ports (a default): runs beside any "
        "test but another that binds one of them (tests/suite_lock.py)",
    )
    config.addinivalue_line(
        "markers",
        "private: touches no shared service (pure logic, files, servers of its own): holds "
        "nothing, runs beside anything (tests/suite_lock.py)",
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """The exclusive phase on workers: the controller holds the lock exclusively for the whole
    run, before its workers start (they inherit the hold, so their tests take nothing)."""
    config = session.config
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    if config.getoption("dist") != "loadgroup" or not exclusive_phase(config):
        return  # without the lanes each test takes the lock exclusively, one at a time
    phase = contextlib.ExitStack()
    phase.enter_context(held(Hold.EXCLUSIVE))
    config.add_cleanup(phase.close)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    with holding(hold_of(item), ports_of(item)):
        return (yield)
