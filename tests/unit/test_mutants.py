"""The mutant list stays runnable: every snippet occurs exactly once, every named test exists.

Other changes move code under the mutants; this fails (in `make test`, in a second) as soon as
one of them no longer applies, instead of `make mutants` discovering it later.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mutants import MUTANT_RUN_ENV, forked, run
from tests.mutants.mutants import MUTANTS, Mutant
from tests.mutants.run import REPO, SnippetError, check_snippets, mutate, subset


def test_every_snippet_applies_once_and_changes_something() -> None:
    assert check_snippets(MUTANTS) == []


def test_names_are_unique_and_some_are_fast_enough_for_make_test() -> None:
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names))
    assert any(m.fast for m in MUTANTS)


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_named_tests_exist(mutant: Mutant) -> None:
    for node_id in mutant.tests:
        file, _, name = node_id.partition("::")
        assert name in _test_functions(REPO / file), node_id


def test_a_mutated_file_still_parses() -> None:
    for mutant in MUTANTS:
        if mutant.path.endswith(".py"):
            ast.parse(mutate((REPO / mutant.path).read_text(), mutant), mutant.path)


def test_a_snippet_that_is_missing_or_repeated_is_refused() -> None:
    mutant = Mutant("m", "x.py", "a = 1\n", "a = 2\n", "p", ("t",))
    assert mutate("a = 1\n", mutant) == "a = 2\n"
    with pytest.raises(SnippetError, match="0 times"):
        mutate("b = 1\n", mutant)
    with pytest.raises(SnippetError, match="2 times"):
        mutate("a = 1\na = 1\n", mutant)


def test_the_rotating_subset_visits_every_fast_mutant() -> None:
    fast = {m.name for m in MUTANTS if m.fast}
    seen = {m.name for day in range(len(fast)) for m in subset(2, day)}
    assert seen == fast
    assert len(subset(2, 0)) == min(2, len(fast))


def test_side_by_side_the_rigs_take_one_lane_and_the_locking_ones_come_last(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--jobs``: a mutant whose tests start a cluster or a namespace rig runs beside the
    shared ones, never beside another rig's; the slow shared ones start before the fast; a
    mutant whose named test is marked exclusive (it holds back every other test while it
    waits: tests/unit/test_suite_lock.py) runs after all the others, so that it never waits
    for a rig's test."""
    import threading

    running: set[str] = set()
    beside: dict[str, set[str]] = {}
    started: list[str] = []
    a_shared_one_started = threading.Event()
    lock = threading.Lock()
    rigs = {"fault", "ports", "rigtimed"}
    locking = {"timed", "rigtimed"}

    def fake(mutant: Mutant, logs: Path, baseline: bool = False) -> run.Outcome:
        with lock:
            beside.setdefault(mutant.name, set()).update(running)
            for other in running:
                beside.setdefault(other, set()).add(mutant.name)
            running.add(mutant.name)
            started.append(mutant.name)
        if mutant.name in rigs - locking:  # a failure unless a shared one runs meanwhile
            assert a_shared_one_started.wait(timeout=30)
        elif mutant.name not in locking:
            a_shared_one_started.set()
        with lock:
            running.discard(mutant.name)
        return run.Outcome(mutant, "killed", 0.05, "")

    monkeypatch.setattr(run, "run_mutant", fake)
    tests = {
        "quick": ("tests/unit/test_x.py::test_q",),
        "a": ("tests/unit/test_x.py::test_a",),
        "fault": ("tests/unit/test_x.py::test_b", "tests/cluster/test_y.py::test_c"),
        "timed": ("tests/unit/test_t.py::test_t",),
        "b": ("tests/integration/test_z.py::test_d",),
        "ports": ("tests/partitions/test_e.py::test_e",),
        "c": ("tests/faults/test_w.py::test_f",),
        "rigtimed": ("tests/cluster/test_v.py::test_g",),
    }
    chosen = [Mutant(n, "p", "o", "n", "promise", t, fast=n == "quick") for n, t in tests.items()]
    outcomes = run.run_all(chosen, tmp_path, jobs=3, locking=frozenset(locking))
    assert [o.mutant.name for o in outcomes] == list(tests)  # in the chosen order
    assert "ports" not in beside["fault"]
    assert "fault" not in beside["ports"]
    assert beside["fault"] & {"quick", "a", "b", "c"}  # a rig beside the shared ones
    assert beside["timed"] <= {"rigtimed"}  # the locking ones after every other
    assert beside["rigtimed"] <= {"timed"}
    assert set(started[-2:]) == locking
    shared_order = [n for n in started if n in {"quick", "a", "b", "c"}]
    assert shared_order[-1] == "quick", shared_order  # the fast one last
    assert {n for n in tests if run.exclusive(chosen[list(tests).index(n)])} == rigs


def test_one_job_runs_every_mutant_in_the_chosen_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    started: list[str] = []

    def fake(mutant: Mutant, logs: Path, baseline: bool = False) -> run.Outcome:
        started.append(mutant.name)
        return run.Outcome(mutant, "killed", 0.05, "")

    monkeypatch.setattr(run, "run_mutant", fake)
    names = ["x", "rig", "y"]
    tests = {"rig": ("tests/cluster/test_y.py::test_c",)}
    chosen = [Mutant(n, "p", "o", "n", "promise", tests.get(n, ("t",))) for n in names]
    run.run_all(chosen, tmp_path, jobs=1, locking=frozenset({"x"}))
    assert started == names


def test_the_locking_mutants_are_found_by_their_tests_marks() -> None:
    """A named test marked exclusive, by itself or by its module, makes its mutant locking;
    parametrized ids count for the function named."""
    by_name = {m.name: m for m in MUTANTS}
    locking = run.marked_exclusive(
        [
            by_name["queue-watch-not-every-5-s"],  # a test marked exclusive itself
            by_name["loop-lag-counts-its-own-sleep"],  # a module marked exclusive
            by_name["ack-before-commit"],  # neither
        ]
    )
    assert locking == {"queue-watch-not-every-5-s", "loop-lag-counts-its-own-sleep"}


@pytest.mark.parametrize(
    ("side_by_side", "alone", "expected", "phases"),
    [
        (0, 0, 0, 2),
        (0, 5, 0, 2),  # nothing exclusive among the tests
        (5, 0, 0, 2),  # only exclusive tests
        (5, 5, 5, 2),  # nothing at all: still an error
        (1, 0, 1, 1),  # a failure side by side ends the run there
        (0, 1, 1, 2),
    ],
)
def test_the_baseline_runs_side_by_side_then_the_exclusive_tests_alone(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    side_by_side: int,
    alone: int,
    expected: int,
    phases: int,
) -> None:
    from tests.mutants import run

    calls: list[tuple[str, ...]] = []

    def fake(
        scratch: Path, tests: object, log: Path, options: tuple[str, ...] = ()
    ) -> tuple[int, float]:
        calls.append(tuple(options))
        return (side_by_side if len(calls) == 1 else alone), 1.0

    monkeypatch.setattr(run, "run_tests", fake)
    code, seconds = run.in_phases(tmp_path, ["tests/x.py"], tmp_path / "log", jobs=3)
    assert (code, seconds) == (expected, float(phases))
    assert calls[0] == ("-n", "3", "--dist", "loadgroup", "-m", "not exclusive")
    lanes = ("-n", "2", "--dist", "loadgroup", "-m", "exclusive")
    assert calls[1:] == ([lanes] if phases == 2 else [])


@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("baseline-exclusive", ("-n", "2", "--dist", "loadgroup", "-m", "exclusive")),
        ("baseline-rigs", ()),
        ("baseline-1", ()),
    ],
)
def test_the_baseline_part_of_exclusive_tests_runs_in_their_lanes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, options: tuple[str, ...]
) -> None:
    """As `make test` runs them: a lane per rig and one for the rest, under one hold; every
    other part runs its tests one after the other."""
    calls: list[tuple[str, ...]] = []

    def fake(
        scratch: Path, tests: object, log: Path, options: tuple[str, ...] = ()
    ) -> tuple[int, float]:
        calls.append(tuple(options))
        return 0, 1.0

    monkeypatch.setattr(run, "run_tests", fake)
    monkeypatch.setattr(run, "prepare", lambda scratch, mutant: None)
    monkeypatch.setattr(run, "assert_imports_from", lambda scratch: None)
    part = Mutant(name, "", "", "", "the named tests pass unmutated", ("tests/x.py::test_x",))
    assert run.run_mutant(part, tmp_path, baseline=True).status == "survived"
    assert calls == [options]


def test_a_mutant_run_asks_hypothesis_not_to_shrink(tmp_path: Path) -> None:
    """A kill needs a failure, not its smallest example: shrinking one took three minutes."""
    env = run.child_env(tmp_path)
    assert env[MUTANT_RUN_ENV] == "1"
    script = (
        "import tests.conftest; from hypothesis import Phase, settings;"
        "print(Phase.shrink in settings.default.phases)"
    )
    for value, shrinks in (("1", "False"), ("", "True")):
        out = subprocess.run(
            [sys.executable, "-c", script],
            cwd=REPO,
            env={**env, MUTANT_RUN_ENV: value, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert out == shrinks, (value, out)


def test_the_baseline_parts_hold_every_named_test_once() -> None:
    """Rigs' tests in one part, the tests marked exclusive in one, the rest in parts of
    BASELINE_CHUNK; nothing mutated (an empty path)."""
    rest = [f"tests/unit/test_a.py::test_{k}" for k in range(run.BASELINE_CHUNK * 2 + 1)]
    chosen = [
        Mutant("m1", "p", "o", "n", "promise", (rest[0], "tests/cluster/test_c.py::test_c")),
        Mutant("m2", "p", "o", "n", "promise", (*rest, "tests/faults/test_t.py::test_t")),
        Mutant("m3", "p", "o", "n", "promise", ("tests/cluster/test_x.py::test_x",)),
    ]
    marked = frozenset({"tests/faults/test_t.py::test_t[1]", "tests/cluster/test_x.py::test_x"})
    parts = run.baseline_parts(chosen, marked)
    by_name = {p.name: p.tests for p in parts}
    assert by_name["baseline-rigs"] == ("tests/cluster/test_c.py::test_c",)
    assert by_name["baseline-exclusive"] == (
        "tests/faults/test_t.py::test_t",
        "tests/cluster/test_x.py::test_x",
    )
    chunks = [len(by_name[f"baseline-{k}"]) for k in (1, 2, 3)]
    assert chunks == [run.BASELINE_CHUNK, run.BASELINE_CHUNK, 1]
    every = [t for p in parts for t in p.tests]
    assert sorted(every) == sorted({t for m in chosen for t in m.tests})
    assert all(p.path == "" for p in parts)
    assert run.exclusive(parts[[p.name for p in parts].index("baseline-exclusive")])


@pytest.mark.parametrize("part_fails", [False, True])
def test_a_failing_baseline_part_fails_the_run_whatever_the_mutants(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    part_fails: bool,
) -> None:
    """The baseline's parts run in the lanes with the mutants; a part whose tests fail makes
    the run an error (exit 2), since a kill then proves nothing."""
    chosen = [
        Mutant(f"m{k}", "p", "o", "n", "promise", (f"tests/unit/t.py::t{k}",)) for k in (1, 2)
    ]
    ran: list[tuple[str, bool]] = []

    def fake(mutant: Mutant, logs: Path, baseline: bool = False) -> run.Outcome:
        ran.append((mutant.name, baseline))
        failed = baseline and part_fails
        status = "killed" if not baseline or failed else "survived"
        return run.Outcome(mutant, status, 0.01, "tests/unit/t.py::t1" if failed else "")

    monkeypatch.setattr(run, "run_mutant", fake)
    monkeypatch.setattr(run, "marked_exclusive_tests", lambda tests: frozenset())
    monkeypatch.setattr(run, "MUTANTS", chosen)
    monkeypatch.setattr(run, "check_snippets", lambda chosen: [])
    code = run.main(["--baseline", "--jobs", "2", "--logs", str(tmp_path)])
    out = capsys.readouterr().out
    assert ("baseline-1", True) in ran
    assert {("m1", False), ("m2", False)} <= set(ran)
    if part_fails:
        assert code == 2
        assert out.splitlines()[-1] == "mutants: 0 killed, 0 survived (baseline failed)"
    else:
        assert code == 0
        assert out.splitlines()[-1] == "mutants: 2 killed, 0 survived"


def test_a_scratch_copy_reuses_the_bytecode_of_what_it_copies_and_runs_the_mutated_file(
    tmp_path: Path,
) -> None:
    """The bytecode copied with the sources is current in the copy (the times kept): Python
    loads it instead of compiling; the mutated file is compiled again, the mutant's code."""
    import py_compile

    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    for name in ("__init__", "kept", "mutated"):
        (root / "pkg" / f"{name}.py").write_text(f"NAME = {name!r}\n")
        os.utime(root / "pkg" / f"{name}.py", (1_700_000_000, 1_700_000_000))  # a checkout's
        py_compile.compile(str(root / "pkg" / f"{name}.py"), doraise=True)
    scratch = tmp_path / "scratch"
    mutant = Mutant("m", "pkg/mutated.py", "'mutated'", "'MUTATED'", "", ("t",))  # same size
    run.prepare(scratch, mutant, root)
    loaded = subprocess.run(
        [sys.executable, "-v", "-c", "import pkg.kept, pkg.mutated; print(pkg.mutated.NAME)"],
        cwd=scratch,
        env={"PYTHONDONTWRITEBYTECODE": "1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "MUTATED"
    cached = scratch / "pkg" / "__pycache__"
    assert f"code object from '{cached}/kept." in loaded.stderr, loaded.stderr[-2000:]
    assert f"code object from '{cached}/mutated." not in loaded.stderr


def test_the_collection_that_finds_the_locking_tests_writes_bytecode() -> None:
    """However this shell is set (PYTHONDONTWRITEBYTECODE=1 here), the one collection before
    the lanes writes the bytecode the scratch copies reuse."""
    assert "PYTHONDONTWRITEBYTECODE" not in run.writing_bytecode()
    assert run.child_env(REPO)["PYTHONDONTWRITEBYTECODE"] == "1"  # scratch copies: not theirs


def test_the_import_probe_accepts_the_scratch_copy_and_refuses_the_repository(
    tmp_path: Path,
) -> None:
    """Each mutant's run first checks that the scratch copy is what the tests import: a copy
    with the three top-level sources passes; one without settings.py would import the
    repository's (the editable install's finder) and stops the run."""
    for name in ("bulk_recorder", "consumer"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    with pytest.raises(SystemExit, match=r"settings\.py"):
        run.assert_imports_from(tmp_path)
    (tmp_path / "settings.py").write_text("")
    run.assert_imports_from(tmp_path)


_PROBE_TEST = """
import os, sys
import settings
import tests

def test_here():
    assert settings.WHERE == "scratch"
    assert tests.__file__.startswith(os.environ["SCRATCH"])
    assert os.getcwd() == os.environ["SCRATCH"]
    assert sys.dont_write_bytecode
    assert os.environ["PROBE"] == "1"
    assert sys.path[0] == os.environ["SCRATCH"]
"""


def test_a_forked_pytest_runs_the_scratch_copy_as_a_new_interpreter_would(tmp_path: Path) -> None:
    """The forked child imports the tests and the service from the scratch copy (the server's
    ``tests`` package left behind), in its directory, with its environment; a failure is exit
    status 1 and a run past its timeout is SIGKILLed (-1)."""
    scratch = tmp_path / "scratch"
    (scratch / "tests").mkdir(parents=True)
    (scratch / "tests" / "__init__.py").write_text("")
    (scratch / "settings.py").write_text('WHERE = "scratch"\n')
    (scratch / "tests" / "test_probe.py").write_text(_PROBE_TEST)
    (scratch / "tests" / "test_fails.py").write_text("def test_no():\n    assert False\n")
    (scratch / "tests" / "test_hangs.py").write_text(
        "import time\n\ndef test_long():\n    time.sleep(15)\n"
    )
    env = {**run.child_env(scratch), "PROBE": "1", "SCRATCH": str(scratch)}
    log = tmp_path / "log"
    options = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly"]

    def status(test: str, timeout: float = 60) -> int:
        return forked.run(scratch, [*options, test], log, env, timeout)

    assert status("tests/test_probe.py") == 0, log.read_text()
    assert status("tests/test_fails.py") == 1
    assert status("tests/test_hangs.py", timeout=3) == -1
    assert "1 passed" in log.read_text()


def test_the_fork_servers_preload_is_no_plugin_and_nothing_of_ours() -> None:
    """pytest rewrites its plugins' asserts as it imports them, which it cannot do for a module
    the server already imported; the service and the tests come from each scratch copy."""
    from importlib.metadata import entry_points

    plugins = {ep.module.split(".")[0] for ep in entry_points(group="pytest11")}
    for name in forked.PRELOAD:
        assert name.split(".")[0] not in plugins, name
        assert name.split(".")[0] not in forked.OURS, name
