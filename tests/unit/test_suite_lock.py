"""tests/suite_lock.py: tests of the shared services overlap, an exclusive one runs alone, one
waiting goes before tests that arrive after it, and two that bind one fixed port never overlap.
Each holder is a process of its own, as xdist workers and mutant jobs are."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.suite_lock import DIR_ENV, HELD_ENV, Hold, held, hold_of, ports_of

pytestmark = pytest.mark.private

ROOT = Path(__file__).resolve().parents[2]
HOLDER = """
import sys
from pathlib import Path
from tests.suite_lock import Hold, holding
ports = tuple(int(p) for p in sys.argv[3].split(",") if p)
with holding(Hold[sys.argv[1]], ports, Path(sys.argv[2])):
    print("in", flush=True)
    sys.stdin.readline()
print("out", flush=True)
"""
INI = """[pytest]
asyncio_default_fixture_loop_scope = function
markers =
    exclusive: x
    private: y
    fixed_ports: z
"""
# How long a holder that should be kept out is watched before the test says it was kept out.
KEPT_OUT_S = 0.5


class Holder:
    def __init__(
        self, hold: Hold, directory: Path, env: dict[str, str], ports: tuple[int, ...] = ()
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, hold.name, str(directory), ",".join(map(str, ports))],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env=env,
        )
        self.said = b""

    def entered(self, within_s: float) -> bool:
        """Whether the holder says it is in within ``within_s`` (a condition, polled)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + within_s
        while b"in" not in self.said.split():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 64)
                assert chunk, f"the holder ended before it entered: {self.said!r}"
                self.said += chunk
        return True

    def leave(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"\n")
        self.proc.stdin.flush()
        assert self.proc.wait(timeout=10) == 0

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


@pytest.fixture
def holders(tmp_path: Path) -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for holder in made:
        holder.close()


def start(
    holders: list[Holder],
    hold: Hold,
    directory: Path,
    ports: tuple[int, ...] = (),
    extra: dict[str, str] | None = None,
) -> Holder:
    env = {k: v for k, v in os.environ.items() if k != HELD_ENV}
    env.update({"PYTHONPATH": str(ROOT), **(extra or {})})
    holder = Holder(hold, directory, env, ports)
    holders.append(holder)
    return holder


def gate_taken(directory: Path) -> bool:
    with open(directory / "gate", "a+b") as gate:
        try:
            fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(gate, fcntl.LOCK_UN)
        return False


def wait_for_gate(directory: Path) -> None:
    deadline = time.monotonic() + 10
    while not gate_taken(directory):
        assert time.monotonic() < deadline, "the exclusive holder never took the gate"
        time.sleep(0.01)


def opened(holder: Holder, lock: Path) -> bool:
    """Whether the holder opened ``lock`` (to wait on it) before saying it is in: then a holder
    that has not entered is kept out by that lock, not merely slow to start."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if holder.entered(0.05):
            return False
        for fd in Path(f"/proc/{holder.proc.pid}/fd").iterdir():
            with contextlib.suppress(OSError):  # closed meanwhile
                if os.readlink(fd) == str(lock):
                    return True
    raise AssertionError(f"the holder neither entered nor opened {lock}")


def test_shared_holders_overlap(tmp_path: Path, holders: list[Holder]) -> None:
    first = start(holders, Hold.SHARED, tmp_path)
    assert first.entered(10)
    second = start(holders, Hold.SHARED, tmp_path)
    assert second.entered(10)
    first.leave()
    second.leave()


def test_an_exclusive_holder_waits_for_the_shared_ones_and_keeps_them_out(
    tmp_path: Path, holders: list[Holder]
) -> None:
    reader = start(holders, Hold.SHARED, tmp_path)
    assert reader.entered(10)
    writer = start(holders, Hold.EXCLUSIVE, tmp_path)
    wait_for_gate(tmp_path)
    assert not writer.entered(KEPT_OUT_S)
    reader.leave()
    assert writer.entered(10)
    late = start(holders, Hold.SHARED, tmp_path)
    assert not late.entered(KEPT_OUT_S)
    writer.leave()
    assert late.entered(10)
    late.leave()


def test_two_exclusive_holders_never_overlap(tmp_path: Path, holders: list[Holder]) -> None:
    first = start(holders, Hold.EXCLUSIVE, tmp_path)
    assert first.entered(10)
    second = start(holders, Hold.EXCLUSIVE, tmp_path)
    assert not second.entered(KEPT_OUT_S)
    first.leave()
    assert second.entered(10)
    second.leave()


def test_a_waiting_exclusive_holder_goes_before_shared_ones_arriving_after_it(
    tmp_path: Path, holders: list[Holder]
) -> None:
    reader = start(holders, Hold.SHARED, tmp_path)
    assert reader.entered(10)
    writer = start(holders, Hold.EXCLUSIVE, tmp_path)
    wait_for_gate(tmp_path)
    arriving = start(holders, Hold.SHARED, tmp_path)
    # Without the gate it would join the running reader at once.
    assert not arriving.entered(KEPT_OUT_S)
    reader.leave()
    assert writer.entered(10)
    assert not arriving.entered(KEPT_OUT_S)
    writer.leave()
    assert arriving.entered(10)
    arriving.leave()


def test_a_private_test_and_a_child_session_hold_nothing(
    tmp_path: Path, holders: list[Holder]
) -> None:
    writer = start(holders, Hold.EXCLUSIVE, tmp_path)
    assert writer.entered(10)
    private = start(holders, Hold.NONE, tmp_path)
    assert private.entered(10)
    child = start(holders, Hold.SHARED, tmp_path, extra={HELD_ENV: "shared"})
    assert child.entered(10)
    for holder in (private, child, writer):
        holder.leave()


def test_two_tests_binding_one_fixed_port_never_overlap(
    tmp_path: Path, holders: list[Holder]
) -> None:
    """Each holds the lock shared (a shared test runs beside both) and the port alone."""
    first = start(holders, Hold.SHARED, tmp_path, ports=(8080, 9464, 9465))
    assert first.entered(10)
    other = start(holders, Hold.SHARED, tmp_path, ports=(4318,))
    assert other.entered(10)
    shared = start(holders, Hold.SHARED, tmp_path)
    assert shared.entered(10)
    second = start(holders, Hold.SHARED, tmp_path, ports=(9465,))
    assert opened(second, tmp_path / "port-9465")
    assert not second.entered(KEPT_OUT_S)
    first.leave()
    assert second.entered(10)
    for holder in (second, other, shared):
        holder.leave()


def test_a_test_waiting_for_a_fixed_port_holds_nothing_meanwhile(
    tmp_path: Path, holders: list[Holder]
) -> None:
    """Had the waiter taken the suite lock before the port, an exclusive test arriving after it
    would wait for it to run: here the exclusive one goes first, as for any late arrival."""
    first = start(holders, Hold.SHARED, tmp_path, ports=(4318,))
    assert first.entered(10)
    waiting = start(holders, Hold.SHARED, tmp_path, ports=(4318,))
    assert opened(waiting, tmp_path / "port-4318")
    assert not waiting.entered(KEPT_OUT_S)
    writer = start(holders, Hold.EXCLUSIVE, tmp_path)
    wait_for_gate(tmp_path)
    first.leave()
    assert writer.entered(10)
    assert not waiting.entered(KEPT_OUT_S)
    writer.leave()
    assert waiting.entered(10)
    waiting.leave()


def test_a_child_session_takes_no_fixed_port(tmp_path: Path, holders: list[Holder]) -> None:
    parent = start(holders, Hold.SHARED, tmp_path, ports=(4318,))
    assert parent.entered(10)
    child = start(holders, Hold.SHARED, tmp_path, ports=(4318,), extra={HELD_ENV: "shared"})
    assert child.entered(10)
    child.leave()
    parent.leave()


def test_the_hold_is_set_for_children_only_while_held(tmp_path: Path) -> None:
    assert HELD_ENV not in os.environ
    with held(Hold.SHARED, tmp_path):
        assert os.environ[HELD_ENV] == "shared"
    assert HELD_ENV not in os.environ


def test_the_lock_lives_where_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.suite_lock import lock_dir

    monkeypatch.setenv(DIR_ENV, str(tmp_path / "locks"))
    assert lock_dir() == tmp_path / "locks"
    monkeypatch.delenv(DIR_ENV)
    assert lock_dir().name == f"bulk-recorder-tests-{os.getuid()}"


@pytest.mark.parametrize(
    ("markers", "hold"),
    [((), Hold.SHARED), (("exclusive",), Hold.EXCLUSIVE), (("private",), Hold.NONE)],
)
def test_a_test_holds_what_its_markers_say(
    pytester: pytest.Pytester, markers: tuple[str, ...], hold: Hold
) -> None:
    decorators = "".join(f"@pytest.mark.{m}\n" for m in markers)
    pytester.makepyfile(f"import pytest\n{decorators}def test_x():\n    pass\n")
    pytester.makeini(INI)
    (item,) = pytester.getitems(pytester.path)
    assert hold_of(item) == hold


def test_a_test_marked_both_ways_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        "import pytest\n@pytest.mark.exclusive\n@pytest.mark.private\ndef test_x():\n    pass\n"
    )
    pytester.makeini(INI)
    (item,) = pytester.getitems(pytester.path)
    with pytest.raises(pytest.UsageError, match="both exclusive and private"):
        hold_of(item)


def test_a_role_started_by_a_test_holding_the_lock_sees_no_unknown_setting(
    tmp_path: Path,
) -> None:
    """What the lock puts in the environment reaches every process a test starts: a name with
    a setting's prefix would be one "unknown setting" warning in every role's log."""
    from bulk_recorder.unknown_settings import unknown_settings

    with held(Hold.SHARED, tmp_path):
        assert unknown_settings(os.environ) == []
    assert unknown_settings({HELD_ENV: "shared", DIR_ENV: str(tmp_path)}) == []


@pytest.mark.parametrize(
    ("marker", "ports"),
    [("", ()), ("@pytest.mark.fixed_ports(9465, 8080, 9464, reason='x')\n", (8080, 9464, 9465))],
)
def test_a_test_locks_the_fixed_ports_its_marker_names_in_order(
    pytester: pytest.Pytester, marker: str, ports: tuple[int, ...]
) -> None:
    pytester.makepyfile(f"import pytest\n{marker}def test_x():\n    pass\n")
    pytester.makeini(INI)
    (item,) = pytester.getitems(pytester.path)
    assert ports_of(item) == ports
    assert hold_of(item) is Hold.SHARED


@pytest.mark.parametrize(
    ("markers", "refused"),
    [
        ("@pytest.mark.fixed_ports(4318)\n@pytest.mark.exclusive\n", "exclusive or private"),
        ("@pytest.mark.fixed_ports(4318)\n@pytest.mark.private\n", "exclusive or private"),
        ("@pytest.mark.fixed_ports(reason='no port')\n", "needs the port numbers"),
        ("@pytest.mark.fixed_ports('4318')\n", "needs the port numbers"),
    ],
)
def test_a_fixed_ports_marker_that_cannot_be_held_is_refused(
    pytester: pytest.Pytester, markers: str, refused: str
) -> None:
    pytester.makepyfile(f"import pytest\n{markers}def test_x():\n    pass\n")
    pytester.makeini(INI)
    (item,) = pytester.getitems(pytester.path)
    with pytest.raises(pytest.UsageError, match=refused):
        ports_of(item)


def test_a_test_marked_fixed_ports_holds_their_locks_while_it_runs(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Through the suite's hook, in a session of its own: the marked test's ports are locked
    while it runs (a flock of another open file fails), an unmarked test's are not."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv(DIR_ENV, str(tmp_path / "lock"))
    monkeypatch.delenv(HELD_ENV, raising=False)
    pytester.makeconftest('pytest_plugins = ["tests.suite_lock"]\n')
    pytester.makeini(INI)
    pytester.makepyfile(
        """
import fcntl, os, pathlib
import pytest

def free(port):
    lock = pathlib.Path(os.environ["PYTEST_SUITE_LOCK_DIR"]) / f"port-{port}"
    with open(lock, "a+b") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    return True

@pytest.mark.fixed_ports(4318, 9464, reason="x")
def test_marked():
    assert not free(4318) and not free(9464)

def test_unmarked():
    assert free(4318) and free(9464)
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=2)
