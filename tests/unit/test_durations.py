"""tests/durations.py groups a JUnit report by folder, for CONTRIBUTING.md's table."""

from __future__ import annotations

from pathlib import Path

from tests.durations import by_folder, folder_of, table

REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.unit.test_a" name="test_one" time="0.5"/>
<testcase classname="tests.unit.test_b" name="test_two" time="1.5"/>
<testcase classname="tests.faults.test_c" name="test_three" time="6.0"/>
</testsuite></testsuites>
"""


def test_each_folder_sums_its_tests_and_the_slowest_come_first(tmp_path: Path) -> None:
    report = tmp_path / "suite.xml"
    report.write_text(REPORT)
    folders, tests = by_folder(report)
    assert folders == {"tests/unit": (2, 2.0), "tests/faults": (1, 6.0)}
    assert tests[0] == (6.0, "tests.faults.test_c::test_three")
    lines = table(folders).splitlines()
    assert lines[2] == "| `tests/faults` | 1 | 6 | 75% |"
    assert lines[3] == "| `tests/unit` | 2 | 2 | 25% |"
    assert lines[-1] == "| all | 3 | 8 | 100% |"
    assert folder_of("tests.test_top") == "tests"
