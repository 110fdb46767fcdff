"""Which process `bulk-recorder healthcheck` checks: process 1, or the role behind an init."""

from __future__ import annotations

from pathlib import Path

from consumer.healthcheck import find_role


def _proc(root: Path, processes: dict[int, list[str]]) -> Path:
    for pid, argv in processes.items():
        (root / str(pid)).mkdir()
        (root / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (root / "self").mkdir()  # not a process number: skipped
    return root


def test_find_role_takes_process_1_when_it_runs_a_role(tmp_path: Path) -> None:
    proc = _proc(tmp_path, {1: ["/opt/venv/bin/python", "/opt/venv/bin/bulk-recorder", "relay"]})
    assert find_role(proc=proc) == (1, "relay")


def test_find_role_reads_the_role_from_an_inits_command_line(tmp_path: Path) -> None:
    proc = _proc(tmp_path, {1: ["/run/podman-init", "--", "bulk-recorder", "api"], 7: ["x"]})
    assert find_role(proc=proc) == (1, "api")


def test_find_role_looks_behind_a_shell_for_the_first_role_process(tmp_path: Path) -> None:
    proc = _proc(
        tmp_path,
        {
            1: ["/bin/sh", "-c", "bulk-recorder api"],
            12: ["bulk-recorder", "api", "--help"],
            9: ["python", "/opt/venv/bin/bulk-recorder", "api"],
            30: ["bulk-recorder", "healthcheck"],
        },
    )
    assert find_role(proc=proc) == (9, "api")


def test_find_role_finds_nothing_where_no_role_runs(tmp_path: Path) -> None:
    proc = _proc(tmp_path, {1: ["sh"], 5: ["bulk-recorder", "migrate"]})
    assert find_role(proc=proc) is None
    assert find_role(5, proc=proc) is None


def test_find_role_finds_a_recorder_started_as_python_m_consumer(tmp_path: Path) -> None:
    """docs/reference.md: `python -m consumer` is the same as `bulk-recorder consume`."""
    proc = _proc(tmp_path, {1: ["/usr/bin/tini", "--", "python3", "-m", "consumer"]})
    assert find_role(proc=proc) == (1, "consume")
    assert find_role(1, proc=proc) == (1, "consume")
