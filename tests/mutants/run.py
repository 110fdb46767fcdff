"""Run the mutants of tests/mutants/mutants.py: each on a scratch copy, only its own tests.

    python -m tests.mutants.run                 # every mutant (`make mutants`)
    python -m tests.mutants.run --baseline      # also check the named tests pass unmutated
    python -m tests.mutants.run --subset 2      # two fast mutants, a different pair each day
    python -m tests.mutants.run --only NAME ... # these mutants
    python -m tests.mutants.run --list          # names, promises and tests
    python -m tests.mutants.run --each          # every named test on its own: which ones kill
    python -m tests.mutants.run --jobs 3        # three mutants side by side (`make mutants`)

For each mutant the repository's tracked files (as they are in the working tree) are copied to
a temporary directory, the one replacement is applied there, and pytest runs the mutant's tests
with that directory as the working directory and the only source of ``bulk_recorder``,
``consumer``, ``settings`` and the tests: forked from a server that has pytest and the
libraries imported (tests/mutants/forked.py), as ``python -m pytest`` would run there. A
failing test kills the mutant; passing tests mean it survived; anything else (no tests
collected, an interrupted run, a timeout) is an error. Every snippet is checked before
anything runs: one that does not occur exactly once stops the run. The last line is
``mutants: N killed, M survived``; the exit status is 0 only when every mutant was killed.

With ``--jobs N``, N mutants run side by side, each on its own scratch copy (their tests wait on
the services far more than they compute). A test marked ``exclusive`` (it faults something every
test shares or times itself) still runs with no other test beside it, and one marked
``fixed_ports`` with no other test binding its ports: the suite lock (tests/suite_lock.py) is
one per user, so the mutants' pytest runs take it as the workers of one run do. The mutants
whose tests start clusters and namespaces, the image or compose (``EXCLUSIVE``) run one after
the other on one lane, beside the shared ones on the others, as ``make test`` runs its rigs
(two rigs at once would be six RabbitMQ nodes on two cores); the shared ones start slow first
(``fast`` last, to fill the end). The mutants with a named test marked exclusive run after all
of those: such a test holds back every new test while it waits for the running ones, and a
rig's test runs for minutes. ``--baseline`` with ``--jobs`` runs the named tests unmutated in
the same lanes, as parts of their own (the rigs' tests, those marked exclusive, and the rest
by :data:`BASELINE_CHUNK`), so that their waits overlap the mutants' work: a part that fails
makes the run an error (exit 2), whatever the mutants did. Alone (one job, or ``--each``),
the baseline runs first, as ``make test`` does: side by side on ``--jobs`` workers, then the
exclusive tests alone.
"""

from __future__ import annotations

import argparse
import datetime
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.mutants import MUTANT_RUN_ENV, forked
from tests.mutants.mutants import MUTANTS, Mutant

REPO = Path(__file__).resolve().parents[2]
PER_MUTANT_TIMEOUT_S = 900
# Tests that must not run beside another mutant's: clusters, namespaces, images and compose
# (each boots servers of its own; two at once overload the machine). A single test that faults
# a shared service is marked `exclusive`, one that binds a fixed port `fixed_ports`: each waits
# for its part of the suite lock.
EXCLUSIVE = (
    "tests/cluster/",
    "tests/partitions/",
    "tests/image/",
    "tests/compose/",
)
_SKIP_WHEN_NO_GIT = {
    ".git",
    ".venv",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    "build",
    "dist",
}


class SnippetError(Exception):
    """A mutant's ``old`` snippet does not occur exactly once in its file."""


@dataclass(frozen=True, slots=True)
class Outcome:
    mutant: Mutant
    status: str  # "killed", "survived" or "error"
    seconds: float
    detail: str


def mutate(text: str, mutant: Mutant) -> str:
    """``text`` with the mutant's one replacement; SnippetError unless ``old`` occurs once."""
    found = text.count(mutant.old)
    if found != 1:
        raise SnippetError(
            f"{mutant.name}: the snippet occurs {found} times in {mutant.path}, not once:\n"
            f"{mutant.old!r}"
        )
    return text.replace(mutant.old, mutant.new)


def check_snippets(mutants: Iterable[Mutant], root: Path = REPO) -> list[str]:
    """Problems with the snippets: each must occur once, and change something."""
    problems = []
    for mutant in mutants:
        path = root / mutant.path
        if not path.is_file():
            problems.append(f"{mutant.name}: no file {mutant.path}")
            continue
        try:
            mutate(path.read_text(), mutant)
        except SnippetError as exc:
            problems.append(str(exc))
        if mutant.old == mutant.new:
            problems.append(f"{mutant.name}: the replacement changes nothing")
        if not mutant.tests:
            problems.append(f"{mutant.name}: no tests named")
    return problems


def tracked_files(root: Path = REPO) -> list[Path]:
    """The repository's files: what git tracks or would (not ignored), or, without git, every
    file outside caches and the virtualenv."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return [
            p.relative_to(root)
            for p in root.rglob("*")
            if p.is_file()
            and not _SKIP_WHEN_NO_GIT.intersection(p.relative_to(root).parts)
            and not any(part.endswith(".egg-info") for part in p.parts)
        ]
    return [Path(name) for name in out.decode().split("\0") if name]


def scratch_copy(destination: Path, root: Path = REPO) -> None:
    """The tracked files, and the bytecode the repository holds for them (``__pycache__``,
    written by :func:`marked_exclusive_tests`' collection): with the sources' times kept
    (copy2), Python and pytest's assertion rewriting take it as current, so a mutant's pytest
    compiles only what changed instead of every module it imports."""
    folders: set[Path] = set()
    for relative in tracked_files(root):
        source = root / relative
        if not source.is_file():  # deleted in the working tree
            continue
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
        if relative.suffix == ".py":
            folders.add(relative.parent)
    for folder in folders:
        cache = root / folder / "__pycache__"
        if cache.is_dir():
            shutil.copytree(cache, destination / folder / "__pycache__", dirs_exist_ok=True)


def prepare(scratch: Path, mutant: Mutant | None, root: Path = REPO) -> None:
    """The scratch copy of ``root`` with ``mutant`` applied (None: unmutated). The mutated
    file's copied bytecode is stale from then on (written now, its time is not the source's:
    Python compiles it again; pytest's rewriting checks a hash of the source)."""
    scratch_copy(scratch, root)
    if mutant is not None:
        path = scratch / mutant.path
        path.write_text(mutate(path.read_text(), mutant))


def python() -> str:
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def child_env(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    # The scratch copy first, for pytest and for every child process the tests start.
    env["PYTHONPATH"] = str(scratch)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env[MUTANT_RUN_ENV] = "1"  # Hypothesis reports a failure unshrunk (tests/conftest.py)
    env.pop("SOAK", None)
    return env


def assert_imports_from(scratch: Path) -> None:
    """Fail loudly unless the scratch copy, not the repository, is what the tests import.
    The probe asks the import system where each would come from (``find_spec``, through the
    same finders, the editable install's among them) without running them: importing
    ``settings`` loads pydantic, 0.3 CPU-s a mutant."""
    probe = (
        "import importlib.util as u;"
        "print(*(u.find_spec(n).origin for n in ('bulk_recorder', 'consumer', 'settings')))"
    )
    out = subprocess.run(
        [python(), "-c", probe],
        cwd=scratch,
        env=child_env(scratch),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    resolved = scratch.resolve()
    wrong = [f for f in out if not Path(f).resolve().is_relative_to(resolved)]
    if wrong:
        raise SystemExit(f"the scratch copy is not what gets imported: {wrong}")


def run_tests(
    scratch: Path, tests: Sequence[str], log: Path, options: Sequence[str] = ()
) -> tuple[int, float]:
    """pytest on ``tests`` in the scratch copy, as ``python -m pytest`` would run them there,
    forked from a server that has the libraries imported (tests/mutants/forked.py): its exit
    status (-1: it outlived :data:`PER_MUTANT_TIMEOUT_S`) and its seconds."""
    arguments = ["-x", "-q", "-p", "no:cacheprovider", *options, *tests]
    started = time.monotonic()
    code = forked.run(scratch, arguments, log, child_env(scratch), PER_MUTANT_TIMEOUT_S)
    return code, time.monotonic() - started


def first_failure(log: Path) -> str:
    text = log.read_text(errors="replace")
    match = re.search(r"^(?:FAILED|ERROR) (\S+)", text, re.MULTILINE)
    return match.group(1) if match else text.strip().splitlines()[-1] if text.strip() else ""


# pytest's exit status when the selection (here: -m exclusive or its opposite) is empty.
NO_TESTS_COLLECTED = 5
# The tests marked exclusive as `make test` runs them: a lane per rig and one for the rest,
# under one exclusive hold (tests/suite_lock.py).
EXCLUSIVE_LANES = ("-n", "2", "--dist", "loadgroup", "-m", "exclusive")
BASELINE_EXCLUSIVE = "baseline-exclusive"


def in_phases(scratch: Path, tests: Sequence[str], log: Path, jobs: int) -> tuple[int, float]:
    """The tests as `make test` runs them: side by side on ``jobs`` workers, then the ones
    marked exclusive alone. Either phase may select nothing."""
    side_by_side = ["-n", str(jobs), "--dist", "loadgroup", "-m", "not exclusive"]
    code, seconds = run_tests(scratch, tests, log, side_by_side)
    if code not in (0, NO_TESTS_COLLECTED):
        return code, seconds
    alone, more = run_tests(scratch, tests, log, EXCLUSIVE_LANES)
    if alone == NO_TESTS_COLLECTED:
        alone = 0 if code == 0 else NO_TESTS_COLLECTED
    return alone, seconds + more


def run_mutant(
    mutant: Mutant,
    logs: Path,
    baseline: bool = False,
    tests: Sequence[str] | None = None,
    jobs: int = 1,
) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="mutant-") as tmp:
        scratch = Path(tmp)
        prepare(scratch, None if baseline else mutant)
        assert_imports_from(scratch)
        suffix = f"-{len(list(logs.glob(mutant.name + '*')))}" if tests else ""
        log = logs / f"{'baseline-' if baseline else ''}{mutant.name}{suffix}.log"
        log.write_bytes(b"")
        if baseline and jobs > 1:
            code, seconds = in_phases(scratch, tests or mutant.tests, log, jobs)
        elif mutant.name == BASELINE_EXCLUSIVE:
            code, seconds = run_tests(scratch, mutant.tests, log, EXCLUSIVE_LANES)
        else:
            code, seconds = run_tests(scratch, tests or mutant.tests, log)
    if code == 1:
        return Outcome(mutant, "killed", seconds, first_failure(log))
    if code == 0:
        return Outcome(mutant, "survived", seconds, f"all named tests passed (log {log})")
    reason = "timed out" if code == -1 else f"pytest exit code {code}"
    return Outcome(mutant, "error", seconds, f"{reason}: {first_failure(log)} (log {log})")


def exclusive(mutant: Mutant) -> bool:
    """Whether the mutant's tests start a rig: never beside another rig's."""
    return any(test.startswith(EXCLUSIVE) for test in mutant.tests)


def writing_bytecode() -> dict[str, str]:
    """This environment with bytecode written (``PYTHONDONTWRITEBYTECODE`` unset)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def marked_exclusive_tests(tests: Iterable[str]) -> frozenset[str]:
    """The test ids among ``tests`` marked ``exclusive`` (by themselves or their module),
    found by collecting them once. The collection writes the bytecode of every module the
    tests import into the repository's ``__pycache__`` folders (git ignores them), for
    :func:`scratch_copy` to reuse (tests/unit/test_mutants.py): a mutant's pytest then
    compiles only the file it changed."""
    named = sorted(set(tests))
    if not named:
        return frozenset()
    command = [python(), "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider"]
    out = subprocess.run(
        [*command, "-m", "exclusive", *named],
        cwd=REPO,
        env=writing_bytecode(),
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode not in (0, NO_TESTS_COLLECTED):
        raise SystemExit(f"collecting the named tests failed:\n{out.stdout[-3000:]}")
    return frozenset(line for line in out.stdout.splitlines() if "::" in line)


def _names(test: str, ids: frozenset[str]) -> bool:
    """Whether the named ``test`` (a module, a function or one parametrized case) covers one
    of the collected ``ids``."""
    return any(i == test or i.startswith((test + "[", test + "::")) for i in ids)


def marked_exclusive(chosen: Sequence[Mutant]) -> frozenset[str]:
    """The mutants with a named test marked ``exclusive`` (it waits for every other test of the
    shared services to end, and holds back every new one meanwhile)."""
    return _locking(chosen, marked_exclusive_tests(t for m in chosen for t in m.tests))


def _locking(chosen: Sequence[Mutant], ids: frozenset[str]) -> frozenset[str]:
    """The mutants with a named test among the collected exclusive ``ids``."""
    return frozenset(m.name for m in chosen if any(_names(t, ids) for t in m.tests))


BASELINE_CHUNK = 20  # named tests a baseline part runs, one after the other


def baseline_parts(chosen: Sequence[Mutant], locking_ids: frozenset[str]) -> list[Mutant]:
    """Every named test, unmutated, as parts that run in the lanes with the mutants: the rigs'
    tests in one part, the tests marked exclusive in one, the rest in parts of
    :data:`BASELINE_CHUNK`. Each is a Mutant with an empty path: nothing is changed."""
    tests = list(dict.fromkeys(t for m in chosen for t in m.tests))
    locking = [t for t in tests if _names(t, locking_ids)]
    rigs = [t for t in tests if t.startswith(EXCLUSIVE) and t not in locking]
    rest = [t for t in tests if t not in locking and t not in rigs]
    groups = [("rigs", rigs), (BASELINE_EXCLUSIVE.removeprefix("baseline-"), locking)]
    groups += [
        (str(k // BASELINE_CHUNK + 1), rest[k : k + BASELINE_CHUNK])
        for k in range(0, len(rest), BASELINE_CHUNK)
    ]
    return [
        Mutant(f"baseline-{name}", "", "", "", "the named tests pass unmutated", tuple(part))
        for name, part in groups
        if part
    ]


def run_all(
    chosen: Sequence[Mutant], logs: Path, jobs: int, locking: frozenset[str] = frozenset()
) -> list[Outcome]:
    """Every chosen mutant; each outcome printed as it comes, the list in the chosen order.

    With ``jobs`` > 1: the rig mutants one after the other on one lane, beside the shared ones
    on the other lanes (as make test runs the rigs beside the other tests), the slow shared
    ones first; then, laid out the same way, the ``locking`` ones (a named test marked
    exclusive, which holds back every other test while it waits and runs), so that none of
    them waits for a test of the first part (a rig's runs for minutes)."""
    printing = threading.Lock()
    began = time.monotonic()

    def one(mutant: Mutant) -> Outcome:
        unmutated = not mutant.path  # a part of the baseline
        outcome = run_mutant(mutant, logs, baseline=unmutated)
        status = outcome.status
        if unmutated:
            status = "passed" if status == "survived" else "FAILED"
        ended = time.monotonic() - began  # where the run's time goes, lane by lane
        with printing:
            print(
                f"{status:8} {mutant.name} ({outcome.seconds:.0f} s, ended at {ended:.0f} s):"
                f" {outcome.detail}",
                flush=True,
            )
        return outcome

    found: dict[str, Outcome] = {}
    if jobs <= 1:
        for mutant in chosen:
            found[mutant.name] = one(mutant)
        return [found[m.name] for m in chosen]

    def in_lanes(mutants: Sequence[Mutant]) -> None:
        """The rig mutants one after the other on the first lane, the rest on every lane as it
        comes free, the slow ones first."""
        rigs = [m for m in mutants if exclusive(m)]
        others = sorted((m for m in mutants if not exclusive(m)), key=lambda m: m.fast)
        waiting: queue.SimpleQueue[Mutant] = queue.SimpleQueue()
        for mutant in others:
            waiting.put(mutant)

        def lane(first: Sequence[Mutant]) -> None:
            for mutant in first:
                found[mutant.name] = one(mutant)
            while True:
                try:
                    mutant = waiting.get_nowait()
                except queue.Empty:
                    return
                found[mutant.name] = one(mutant)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            lanes = [pool.submit(lane, rigs)] + [pool.submit(lane, ()) for _ in range(jobs - 1)]
            for done in lanes:
                done.result()

    in_lanes([m for m in chosen if m.name not in locking])
    in_lanes([m for m in chosen if m.name in locking])
    return [found[m.name] for m in chosen]


def each_test(chosen: Sequence[Mutant], logs: Path) -> int:
    """Which of a mutant's named tests kill it, each run on its own (for the table in
    docs/guarantees.md)."""
    lame = 0
    for mutant in chosen:
        for test in mutant.tests:
            outcome = run_mutant(mutant, logs, tests=[test])
            lame += outcome.status != "killed"
            seconds = f"{outcome.seconds:.0f} s"
            print(f"{outcome.status:8} {mutant.name} <- {test} ({seconds})", flush=True)
    print(f"named tests that did not kill their mutant: {lame}")
    return 0


def subset(count: int, key: int) -> list[Mutant]:
    """``count`` fast mutants, starting at ``key`` (a day number): all take turns."""
    fast = [m for m in MUTANTS if m.fast]
    start = (key * count) % len(fast)
    return [fast[(start + i) % len(fast)] for i in range(min(count, len(fast)))]


def select(args: argparse.Namespace) -> list[Mutant]:
    if args.only:
        by_name = {m.name: m for m in MUTANTS}
        unknown = [n for n in args.only if n not in by_name]
        if unknown:
            raise SystemExit(f"unknown mutants: {', '.join(unknown)}")
        return [by_name[n] for n in args.only]
    if args.subset:
        key = args.rotation if args.rotation is not None else datetime.date.today().toordinal()
        return subset(args.subset, key)
    return list(MUTANTS)


def with_baseline(
    chosen: Sequence[Mutant], logs: Path, jobs: int, baseline: bool
) -> tuple[list[Outcome], list[Outcome]]:
    """The baseline's parts (with ``baseline`` and ``jobs`` > 1) and the mutants, run in the
    same lanes (:func:`run_all`): their outcomes, apart."""
    parts: list[Mutant] = []
    locking: frozenset[str] = frozenset()
    if jobs > 1:
        ids = marked_exclusive_tests(t for m in chosen for t in m.tests)
        locking = _locking(chosen, ids)
        if baseline:
            parts = baseline_parts(chosen, ids)
            locking |= {p.name for p in parts if p.name == BASELINE_EXCLUSIVE}
    everything = run_all([*parts, *chosen], logs, jobs, locking)
    return everything[: len(parts)], everything[len(parts) :]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--only", nargs="+", metavar="NAME")
    parser.add_argument("--subset", type=int, metavar="N", help="N fast mutants, rotating daily")
    parser.add_argument("--rotation", type=int, help="rotation key instead of today's date")
    parser.add_argument("--baseline", action="store_true", help="check the tests pass unmutated")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--each", action="store_true", help="run each named test on its own")
    parser.add_argument("--logs", type=Path, help="keep the pytest logs here")
    parser.add_argument(
        "--jobs", type=int, default=1, metavar="N", help="mutants side by side (exclusive: alone)"
    )
    args = parser.parse_args(argv)
    chosen = select(args)
    if args.list:
        for m in chosen:
            print(f"{m.name}{' (fast)' if m.fast else ''}: {m.promise}")
            for test in m.tests:
                print(f"    {test}")
        return 0
    problems = check_snippets(chosen)
    if problems:
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        print(f"mutants: 0 killed, 0 survived ({len(problems)} snippets do not apply)")
        return 2
    logs = args.logs or Path(tempfile.mkdtemp(prefix="mutant-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if args.baseline and (args.each or args.jobs <= 1):  # first, on its own
        named = list(dict.fromkeys(t for m in chosen for t in m.tests))
        unmutated = Mutant("unmutated", "", "", "", "", tuple(named))
        outcome = run_mutant(unmutated, logs, baseline=True, jobs=args.jobs)
        print(f"baseline: {len(named)} named tests, {outcome.seconds:.0f} s", flush=True)
        if outcome.status != "survived":  # unmutated, every named test must pass
            print(f"error: the named tests fail without any mutant: {outcome.detail}")
            print("mutants: 0 killed, 0 survived (baseline failed)")
            return 2
    if args.each:
        return each_test(chosen, logs)
    base, outcomes = with_baseline(chosen, logs, args.jobs, args.baseline)
    failed = [o for o in base if o.status != "survived"]
    if base:
        count = sum(len(o.mutant.tests) for o in base)
        print(f"baseline: {count} named tests in {len(base)} parts, {len(failed)} failed")
    if failed:
        for o in failed:
            print(f"error: the named tests fail without any mutant: {o.detail}")
        print(f"total {time.monotonic() - started:.0f} s; logs in {logs}", flush=True)
        print("mutants: 0 killed, 0 survived (baseline failed)")
        return 2
    killed = sum(o.status == "killed" for o in outcomes)
    survived = sum(o.status == "survived" for o in outcomes)
    errors = sum(o.status == "error" for o in outcomes)
    everything_killed = killed == len(outcomes)
    if everything_killed and args.logs is None:
        shutil.rmtree(logs, ignore_errors=True)  # nothing to look at
        print(f"total {time.monotonic() - started:.0f} s", flush=True)
    else:
        print(f"total {time.monotonic() - started:.0f} s; logs in {logs}", flush=True)
    suffix = f" ({errors} errors)" if errors else ""
    print(f"mutants: {killed} killed, {survived} survived{suffix}")
    return 0 if everything_killed else 1


if __name__ == "__main__":
    sys.exit(main())
