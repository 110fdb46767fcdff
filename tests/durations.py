"""Where `make test`'s time goes: a JUnit XML report grouped by folder.

    .venv/bin/pytest -q -p no:cacheprovider --junitxml=/tmp/suite.xml
    .venv/bin/python -m tests.durations /tmp/suite.xml

prints a Markdown table (folder, tests, seconds, CPU seconds, share) for CONTRIBUTING.md, and
the slowest tests. The seconds are each test's own (setup, call and teardown), as pytest reports
them; the CPU seconds are the whole machine's busy time over the same span (tests/cpu_clock.py),
meaningful when the tests ran one at a time. Several reports (one per phase of a run) add up.
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


Folders = dict[str, tuple[int, float, float]]


def cpu_of(case: ET.Element) -> float:
    for prop in case.iter("property"):
        if prop.get("name") == "machine_cpu_s":
            return float(prop.get("value", "0"))
    return 0.0


def by_folder(reports: Sequence[Path]) -> tuple[Folders, list[tuple[float, str]]]:
    counts: dict[str, int] = defaultdict(int)
    seconds: dict[str, float] = defaultdict(float)
    cpu: dict[str, float] = defaultdict(float)
    tests: list[tuple[float, str]] = []
    for report in reports:
        for case in ET.parse(report).getroot().iter("testcase"):
            folder = folder_of(case.get("classname", ""))
            took = float(case.get("time", "0"))
            counts[folder] += 1
            seconds[folder] += took
            cpu[folder] += cpu_of(case)
            tests.append((took, f"{case.get('classname')}::{case.get('name')}"))
    return {f: (counts[f], seconds[f], cpu[f]) for f in counts}, sorted(tests, reverse=True)


def table(folders: Folders) -> str:
    total = sum(s for _, s, _ in folders.values()) or 1.0
    lines = [
        "| folder | tests | seconds | CPU seconds | share |",
        "|---|---:|---:|---:|---:|",
    ]
    for folder, (count, took, cpu) in sorted(folders.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| `{folder}` | {count} | {took:,.0f} | {cpu:,.0f} | {took / total:.0%} |")
    count = sum(c for c, _, _ in folders.values())
    cpu = sum(c for _, _, c in folders.values())
    lines.append(f"| all | {count} | {total:,.0f} | {cpu:,.0f} | 100% |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("reports", type=Path, nargs="+", help="pytest --junitxml outputs")
    parser.add_argument("--slowest", type=int, default=15, help="slowest tests listed")
    args = parser.parse_args(argv)
    folders, tests = by_folder(args.reports)
    print(table(folders))
    print()
    for took, name in tests[: args.slowest]:
        print(f"{took:8.1f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
