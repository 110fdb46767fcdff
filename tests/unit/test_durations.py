"""tests/durations.py groups JUnit reports by folder, for CONTRIBUTING.md's table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cpu_clock import machine_busy_seconds
from tests.durations import by_folder, folder_of, table

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.unit.test_a" name="test_one" time="0.5">
<properties><property name="machine_cpu_s" value="0.25"/></properties></testcase>
<testcase classname="tests.unit.test_b" name="test_two" time="1.5"/>
<testcase classname="tests.faults.test_c" name="test_three" time="6.0">
<properties><property name="own_cpu_s" value="9"/>
<property name="machine_cpu_s" value="3.5"/></properties></testcase>
</testsuite></testsuites>
"""

SECOND = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.faults.test_d" name="test_four" time="2.0">
<properties><property name="machine_cpu_s" value="1.5"/></properties></testcase>
</testsuite></testsuites>
"""


def test_each_folder_sums_its_tests_and_cpu_and_the_slowest_come_first(tmp_path: Path) -> None:
    report = tmp_path / "suite.xml"
    report.write_text(REPORT)
    folders, tests = by_folder([report])
    assert folders == {"tests/unit": (2, 2.0, 0.25, 0.0), "tests/faults": (1, 6.0, 3.5, 9.0)}
    assert tests[0] == (6.0, "tests.faults.test_c::test_three")
    lines = table(folders).splitlines()
    assert lines[2] == "| `tests/faults` | 1 | 6 | 4 | 9 | 75% |"
    assert lines[3] == "| `tests/unit` | 2 | 2 | 0 | 0 | 25% |"
    assert lines[-1] == "| all | 3 | 8 | 4 | 9 | 100% |"
    assert folder_of("tests.test_top") == "tests"


def test_the_reports_of_a_run_in_phases_add_up(tmp_path: Path) -> None:
    first, second = tmp_path / "a.xml", tmp_path / "b.xml"
    first.write_text(REPORT)
    second.write_text(SECOND)
    folders, tests = by_folder([first, second])
    assert folders["tests/faults"] == (2, 8.0, 5.0, 9.0)
    assert [name for _, name in tests][:2] == [
        "tests.faults.test_c::test_three",
        "tests.faults.test_d::test_four",
    ]


def test_the_machine_clock_counts_busy_time_not_idle_time() -> None:
    before = machine_busy_seconds()
    deadline = sum(range(2_000_000))  # about 50 ms of one core
    after = machine_busy_seconds()
    assert deadline > 0
    assert after - before >= 0.01
    assert after - before < 5


def test_each_test_carries_its_cpu_into_the_report(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    pytester.makeconftest('pytest_plugins = ["tests.cpu_clock"]')
    pytester.makepyfile("def test_spin():\n    assert sum(range(3_000_000)) > 0\n")
    report = pytester.path / "r.xml"
    pytester.runpytest_subprocess(f"--junitxml={report}", "-p", "no:cacheprovider").assert_outcomes(
        passed=1
    )
    folders, _ = by_folder([report])
    ((count, _, cpu, own),) = folders.values()
    assert count == 1
    assert cpu > 0
    assert own > 0


def test_by_own_cpu_the_costliest_come_first_whatever_their_seconds(tmp_path: Path) -> None:
    report = tmp_path / "suite.xml"
    report.write_text(
        REPORT.replace(
            '<testcase classname="tests.unit.test_b" name="test_two" time="1.5"/>',
            '<testcase classname="tests.unit.test_b" name="test_two" time="1.5">'
            '<properties><property name="own_cpu_s" value="12.5"/></properties></testcase>',
        )
    )
    _, tests = by_folder([report], by="own")
    assert tests[:2] == [
        (12.5, "tests.unit.test_b::test_two"),
        (9.0, "tests.faults.test_c::test_three"),
    ]
