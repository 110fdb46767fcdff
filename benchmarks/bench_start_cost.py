"""What starting a command costs in CPU, as a multiple of a bare interpreter's start (issue 40).

    python -m benchmarks.bench_start_cost --runs 20
    python -m benchmarks.bench_start_cost --runs 20 --compare /path/to/another/checkout

Each command runs as the tests and the supervisors start it (``python -m consumer.cli ...``) in
a fresh process; its CPU (user + system, with the ``git`` it may run) is read when it exits.
``migrate`` is given a database that refuses at once (port 1): it pays the whole start-up (the
settings, logging, the tracing decision, the drivers) and stops at its reachability check. The
role's line imports what ``consume`` imports before it connects. The commands take turns in
each round, so a busy machine slows them alike; each figure is the median of ``--runs`` rounds
and is given as a ratio to ``python -c pass`` measured in the same rounds. ``--compare`` runs
the same commands from another checkout in the same rounds (before/after a change).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_BASE = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/")}
_UNREACHABLE = {
    **_BASE,
    "DATABASE_URL": "postgresql://postgres@127.0.0.1:1/none",
    "RABBITMQ_URL": "amqp://guest:guest@127.0.0.1:1/",
}
_CONSUME_IMPORTS = (
    "import consumer.cli, settings, consumer.app, bulk_recorder.infra.reach, "
    "bulk_recorder.infra.logs; from bulk_recorder.unknown_settings import warn_unknown_settings; "
    "warn_unknown_settings({})"
)

COMMANDS: dict[str, tuple[list[str], dict[str, str]]] = {
    "python -c pass": (["-c", "pass"], _BASE),
    "bulk-recorder healthcheck --help": (["-m", "consumer.cli", "healthcheck", "--help"], _BASE),
    "bulk-recorder --help": (["-m", "consumer.cli", "--help"], _BASE),
    "bulk-recorder migrate (refused)": (["-m", "consumer.cli", "migrate"], _UNREACHABLE),
    "consume's imports": (["-c", _CONSUME_IMPORTS], _BASE),
}


def cpu_of(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    """CPU seconds of one run of ``python ARGV`` from ``cwd`` (and of the children it waited
    for), its output discarded."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.chdir(cwd)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            os.execve(sys.executable, [sys.executable, *argv], env)
        finally:
            os._exit(127)
    _, _, usage = os.wait4(pid, 0)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--compare", type=Path, default=None, help="another checkout")
    args = parser.parse_args()
    trees = {"this": REPO, **({"compared": args.compare.resolve()} if args.compare else {})}
    spent: dict[tuple[str, str], list[float]] = {(t, c): [] for t in trees for c in COMMANDS}
    for round_ in range(args.runs):
        order = list(trees.items())
        for command, (argv, env) in COMMANDS.items():
            for tree, cwd in order if round_ % 2 else order[::-1]:
                spent[(tree, command)].append(cpu_of(argv, env, cwd))
    bare = statistics.median(spent[("this", "python -c pass")])
    print(f"CPU per start, median of {args.runs}; x = ratio to python -c pass ({bare:.3f} s)")
    for command in COMMANDS:
        line = f"{command:34s}"
        for tree in trees:
            median = statistics.median(spent[(tree, command)])
            line += f"  {tree}: {median:.3f} s ({median / bare:4.1f}x)"
        if args.compare:
            this = statistics.median(spent[("this", command)])
            other = statistics.median(spent[("compared", command)])
            line += f"  this/compared {this / other:.2f}"
        print(line)


if __name__ == "__main__":
    main()
