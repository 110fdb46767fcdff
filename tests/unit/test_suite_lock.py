"""tests/suite_lock.py: tests of the shared services overlap, an exclusive one runs alone, and
one waiting goes before tests that arrive after it. Each holder is a process of its own, as
xdist workers and mutant jobs are."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.suite_lock import DIR_ENV, HELD_ENV, Hold, held, hold_of

pytestmark = pytest.mark.private

ROOT = Path(__file__).resolve().parents[2]
HOLDER = """
import sys
from pathlib import Path
from tests.suite_lock import Hold, held
with held(Hold[sys.argv[1]], Path(sys.argv[2])):
    print("in", flush=True)
    sys.stdin.readline()
print("out", flush=True)
"""
INI = """[pytest]
asyncio_default_fixture_loop_scope = function
markers =
    exclusive: x
    private: y
"""
# How long a holder that should be kept out is watched before the test says it was kept out.
KEPT_OUT_S = 0.5


class Holder:
    def __init__(self, hold: Hold, directory: Path, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, hold.name, str(directory)],
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


def start(holders: list[Holder], hold: Hold, directory: Path, **extra: str) -> Holder:
    env = {k: v for k, v in os.environ.items() if k != HELD_ENV}
    env.update({"PYTHONPATH": str(ROOT), **extra})
    holder = Holder(hold, directory, env)
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
    child = start(holders, Hold.SHARED, tmp_path, **{HELD_ENV: "shared"})
    assert child.entered(10)
    for holder in (private, child, writer):
        holder.leave()


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
