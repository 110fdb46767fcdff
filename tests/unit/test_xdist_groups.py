"""Each rig's tests, and each module with a fixed-name private node, run on one xdist worker
(tests/suite_lock.py XDIST_GROUPS), whatever the number of workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.suite_lock import (
    DIR_ENV,
    EXCLUSIVE_LANE,
    RIG_LANE_TOO,
    XDIST_GROUPS,
    exclusive_lane_of,
    xdist_group_of,
)

pytestmark = pytest.mark.private

ROOT = Path(__file__).resolve().parents[2]
TEST = """
import json, os, pathlib, time
import pytest

@pytest.mark.parametrize("n", range(4))
def test_where(n):
    out = pathlib.Path(os.environ["WHERE_OUT"])
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    # written whole under another name, then renamed: a worker reading the folder meanwhile
    # found a file created and not yet written (JSONDecodeError, make test-random)
    name = f"{os.getpid()}-{__name__}-{n}"
    (out / f".{name}").write_text(json.dumps([worker, __name__]))
    os.replace(out / f".{name}", out / name)
    if __name__ != "test_integration":
        return
    # Wait until an ungrouped test has run on another worker as well. xdist hands a worker its
    # next unit only when it has two or fewer left, so a worker that holds one rig's four tests
    # takes an ungrouped one only after two of them: without the wait, the worker that holds
    # no rig can run every ungrouped test first (it did, on a loaded machine).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seen = [json.loads(p.read_text()) for p in out.iterdir() if not p.name.startswith(".")]
        if len({w for w, m in seen if m == __name__}) > 1:
            return
        time.sleep(0.05)
    raise AssertionError("no other worker ran an ungrouped test in 30 s")
"""


def _session_of_modules(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    folders: tuple[str, ...],
    text: str,
) -> Path:
    """A pytester session with the suite's lock and scheduler, and one module ``text`` in each
    of ``tests/<folder>/``; the folder where the modules write what they saw."""
    out = tmp_path / "where"
    out.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("WHERE_OUT", str(out))
    monkeypatch.setenv(DIR_ENV, str(tmp_path / "lock"))
    pytester.makeconftest('pytest_plugins = ["tests.suite_lock"]\n')
    pytester.makeini(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
        "markers =\n    exclusive: x\n    private: y\n"
    )
    for folder in folders:
        package = pytester.path / "tests" / folder
        package.mkdir(parents=True)
        (package / f"test_{folder}.py").write_text(text)
    return out


def test_a_group_is_found_by_its_folder_or_module() -> None:
    assert xdist_group_of("tests/cluster/test_rigs.py::test_x") == "cluster-rig"
    assert xdist_group_of("tests/partitions/test_rig.py::test_y[1]") == "namespace-rig"
    assert xdist_group_of("tests/faults/test_tls.py::test_z") == "tls-node"
    assert xdist_group_of("tests/faults/test_crash.py::test_z") is None
    assert xdist_group_of("tests/unit/test_x.py::test_cluster") is None
    assert len(set(XDIST_GROUPS.values())) == 5


def test_grouped_tests_share_one_worker_and_the_rest_spread(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A real run on three workers, with the suite's scheduler."""
    out = _session_of_modules(
        pytester, monkeypatch, tmp_path, ("cluster", "partitions", "integration"), TEST
    )
    result = pytester.runpytest_subprocess("-n", "3", "--dist", "loadgroup", "-p", "no:randomly")
    result.assert_outcomes(passed=12)
    seen = [json.loads(p.read_text()) for p in out.iterdir()]
    workers = {module: {w for w, m in seen if m == module} for _, module in seen}
    for rig in ("test_cluster", "test_partitions"):
        assert len(workers[rig]) == 1, f"{rig}'s tests ran on {sorted(workers[rig])}"
    assert len(workers["test_integration"]) > 1, "ungrouped tests should spread"


LANE_TEST = """
import fcntl, json, os, pathlib, time
import pytest

@pytest.mark.exclusive
@pytest.mark.parametrize("n", range(3))
def test_where(n):
    out = pathlib.Path(os.environ["WHERE_OUT"])
    # the lanes overlap: wait until a test of the other lane has started (one after the other,
    # as each test holding the lock itself would make them, the first would wait in vain)
    rig = __name__ == "test_cluster"
    (out.parent / f"started-{__name__}-{n}").touch()
    deadline = time.monotonic() + 60  # workers start slowly beside the whole suite
    while not any(("test_cluster" in p.name) != rig for p in out.parent.glob("started-*")):
        assert time.monotonic() < deadline, "the other lane never ran beside this one"
        time.sleep(0.05)
    # another process asking for the suite lock, shared, is refused while the phase runs
    with open(pathlib.Path(os.environ["PYTEST_SUITE_LOCK_DIR"]) / "suite", "a+b") as suite:
        try:
            fcntl.flock(suite, fcntl.LOCK_SH | fcntl.LOCK_NB)
            refused = False
        except BlockingIOError:
            refused = True
    seen = [os.environ.get("PYTEST_XDIST_WORKER"), __name__, refused,
            os.environ.get("PYTEST_SUITE_LOCK_HELD")]
    (out / f"{__name__}-{n}").write_text(json.dumps(seen))

def test_not_exclusive():
    pass
"""


@pytest.mark.parametrize("workers", [2, 3])
def test_the_exclusive_phase_runs_a_lane_per_rig_and_one_for_the_rest_under_one_hold(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, workers: int
) -> None:
    """``-m exclusive`` on workers: the cluster rig's tests on one worker, every other test on
    one other worker (never two of them at once, even with a worker spare), and the suite lock
    held exclusively for the whole run by the controller, so that no other pytest's test comes
    in (a shared hold is refused inside every test)."""
    out = _session_of_modules(
        pytester, monkeypatch, tmp_path, ("cluster", "faults", "integration"), LANE_TEST
    )
    result = pytester.runpytest_subprocess(
        "-n", str(workers), "--dist", "loadgroup", "-m", "exclusive", "-p", "no:randomly"
    )
    result.assert_outcomes(passed=9)  # test_not_exclusive deselected
    seen = [json.loads(p.read_text()) for p in out.iterdir()]
    assert len(seen) == 9
    assert all(refused and held == "exclusive" for _, _, refused, held in seen), seen
    rig = {w for w, m, _, _ in seen if m == "test_cluster"}
    rest = {w for w, m, _, _ in seen if m != "test_cluster"}
    assert len(rig) == 1, f"the rig's tests ran on {sorted(rig)}"
    assert len(rest) == 1, f"the other exclusive tests ran on {sorted(rest)}"
    assert rig != rest, "the rig's lane and the others' ran on one worker"


def test_an_exclusive_test_goes_to_its_rigs_lane_or_the_one_of_the_rest() -> None:
    assert exclusive_lane_of("tests/cluster/test_broker_failover.py::test_x") == "cluster-rig"
    assert exclusive_lane_of("tests/faults/test_stop_budget.py::test_y") == EXCLUSIVE_LANE
    assert exclusive_lane_of("tests/unit/test_loop_lag.py::test_z") == EXCLUSIVE_LANE
    assert exclusive_lane_of("tests/partitions/test_rig.py::test_z") == "namespace-rig"
    for module in RIG_LANE_TOO:
        assert exclusive_lane_of(f"{module}::test_w") == "cluster-rig"
        # the module is there and holds a test marked exclusive (a rename would drop it from
        # the rig's lane without a word)
        assert "exclusive(" in (ROOT / module).read_text(), module


def test_the_docs_give_the_number_of_workers_the_makefile_runs() -> None:
    """README.md and CONTRIBUTING.md state make test's workers; the Makefile's default is what
    runs."""
    (line,) = [
        line
        for line in (ROOT / "Makefile").read_text().splitlines()
        if line.startswith("TEST_JOBS ?=")
    ]
    jobs = int(line.split("?=")[1])
    words = {4: "four", 5: "five", 6: "six"}
    assert (
        f"tests on {words[jobs]} workers side by side (`TEST_JOBS`)"
        in (ROOT / "README.md").read_text()
    )
    assert f"`TEST_JOBS` ({jobs}) pytest-xdist workers" in (ROOT / "CONTRIBUTING.md").read_text()
