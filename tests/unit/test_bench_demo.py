"""benchmarks/bench_demo.py cuts a `make demo` run into phases by the lines it prints."""

from __future__ import annotations

import pytest

from benchmarks.bench_demo import DEMO, INSTALL, Run, _stamps

LINES = [
    (0.5, "python3 -m venv .venv"),
    (5.0, ".venv/bin/pip install --quiet --require-hashes -r requirements-uv.lock"),
    (
        10.0,
        ".venv/bin/uv pip install --quiet --python .venv/bin/python"
        " --require-hashes -r requirements.lock",
    ),
    (12.0, ".venv/bin/uv pip install --quiet --python .venv/bin/python --no-deps -e ."),
    (15.0, "touch .venv/.runtime"),
    (15.1, ".venv/bin/bulk-recorder demo --count 300000"),
    (15.2, "bulk-recorder demo: 300,000 records through bulk_recorder.records into PostgreSQL"),
    (17.0, "recorder ready (pid 1, metrics on http://127.0.0.1:1/metrics)"),
    (20.0, "published   10/315,600  recorded   5/300,000  dead-lettered     0   1 rec/s   3.0 s"),
    (60.0, "published   315,600/315,600  recorded   300,000/300,000  dead-lettered   600   43.0 s"),
    (62.0, "== bulk-recorder demo summary =="),
    (62.1, "published        published 315600 messages (300000 valid, ...) in 30.5 s, 1 msg/s"),
]


def test_each_phase_runs_from_its_line_to_the_next_phase() -> None:
    phases = _stamps(LINES, end=63.0)
    assert phases == pytest.approx(
        {
            "venv": 5.0,  # make's start goes with the first phase
            "installer (uv)": 5.0,
            "lock": 2.0,
            "project (-e .)": 3.1,  # to the demo's command (touch is make's own)
            "demo start-up": 1.9,
            "publish + drain": 43.0,  # to the last progress line before the summary
            "stop + checks": 3.0,
        }
    )
    run = Run("x", wall_s=63.0, phases=phases)
    assert run.part(INSTALL) + run.part(DEMO) == pytest.approx(63.0)


def test_a_makefile_without_the_installer_step_has_no_such_phase() -> None:
    old = [line for line in LINES if "requirements-uv.lock" not in line[1]]
    phases = _stamps(old, end=63.0)
    assert "installer (uv)" not in phases
    assert phases["venv"] == pytest.approx(10.0)
