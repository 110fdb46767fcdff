"""Where `make test`'s time goes: a JUnit XML report grouped by folder.

    .venv/bin/pytest -q -p no:cacheprovider --junitxml=/tmp/suite.xml
    .venv/bin/python -m tests.durations /tmp/suite.xml

prints a Markdown table (folder, tests, seconds, CPU seconds, own CPU seconds, share) for
CONTRIBUTING.md, and the slowest tests. The seconds are each test's own (setup, call and
teardown), as pytest reports them; the CPU seconds are the whole machine's busy time over the
same span (tests/cpu_clock.py), meaningful when the tests ran one at a time; the own CPU seconds
are the test's pytest process's and the children it waited for (the roles it started, its
private servers), meaningful side by side too (the machine's RabbitMQ and PostgreSQL are not
in them; a child's CPU is counted when it is reaped, in whichever test that happens).
``--by own`` lists the tests that cost the most own CPU instead of the slowest. Several
reports (one per phase of a run) add up.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path


def folder_of(classname: str) -> str:
    """``tests.integration.test_api`` -> ``tests/integration``; a module at the top: ``tests``."""
    parts = classname.split(".")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


Folders = dict[str, tuple[int, float, float, float]]


def cpu_of(case: ET.Element, name: str = "machine_cpu_s") -> float:
    for prop in case.iter("property"):
        if prop.get("name") == name:
            return float(prop.get("value", "0"))
    return 0.0


def by_folder(
    reports: Sequence[Path], by: str = "seconds"
) -> tuple[Folders, list[tuple[float, str]]]:
    """Each folder's (tests, seconds, machine CPU, own CPU), and every test with its seconds
    (``by="own"``: its own CPU seconds), the greatest first."""
    counts: dict[str, int] = defaultdict(int)
    seconds: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    own: dict[str, float] = defaultdict(float)
    tests: list[tuple[float, str]] = []
    for report in reports:
        for case in ET.parse(report).getroot().iter("testcase"):
            folder = folder_of(case.get("classname", ""))
            took = float(case.get("time", "0"))
            counts[folder] += 1
            seconds[folder] += took
            cpu[folder] += cpu_of(case)
            mine = cpu_of(case, "own_cpu_s")
            own[folder] += mine
            name = f"{case.get('classname')}::{case.get('name')}"
            tests.append((mine if by == "own" else took, name))
    folders = {f: (counts[f], seconds[f], cpu[f], own[f]) for f in counts}
    return folders, sorted(tests, reverse=True)


def table(folders: Folders) -> str:
    total = sum(s for _, s, _, _ in folders.values()) or 1.0
    lines = [
        "| folder | tests | seconds | CPU seconds | own CPU seconds | share |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for folder, (count, took, cpu, own) in sorted(folders.items(), key=lambda kv: -kv[1][1]):
        lines.append(
            f"| `{folder}` | {count} | {took:,.0f} | {cpu:,.0f} | {own:,.0f} | {took / total:.0%} |"
        )
    count = sum(c for c, _, _, _ in folders.values())
    cpu = sum(c for _, _, c, _ in folders.values())
    own = sum(o for _, _, _, o in folders.values())
    lines.append(f"| all | {count} | {total:,.0f} | {cpu:,.0f} | {own:,.0f} | 100% |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("reports", type=Path, nargs="+", help="pytest --junitxml outputs")
    parser.add_argument("--slowest", type=int, default=15, help="slowest tests listed")
    parser.add_argument(
        "--by",
        choices=("seconds", "own"),
        default="seconds",
        help="list the tests by their seconds (default) or by their own CPU seconds",
    )
    args = parser.parse_args(argv)
    folders, tests = by_folder(args.reports, args.by)
    print(table(folders))
    print()
    unit = "s" if args.by == "seconds" else "CPU s"
    for took, name in tests[: args.slowest]:
        print(f"{took:8.1f} {unit}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
