"""The role server (tests/role_server.py): a command forked from it is what the same command
started as before is, to its parent, to ``ps`` and to itself; and only the starts it can serve
so are forked. Each comparison runs tests/role_probe.py both ways: forked, and started (an
import-time variable that only the started one has turns the fork down)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import sys
from typing import Any

import pytest

from tests import role_server

pytestmark = pytest.mark.skipif(
    role_server.installed() is None, reason="no role server in this session (TEST_ROLE_SERVER)"
)

PROBE = [sys.executable, "-m", "tests.role_probe"]
STARTED = {"PYTHONROLEPROBE": "1"}  # read at import by nothing, but refused all the same
SAME = (
    "argv", "cmdline", "comm", "cwd", "path0", "main", "probe_env", "stdin_tty",
    "stdout_line_buffered", "stderr_line_buffered", "stdin_name", "signal_to_main_thread",
)  # fmt: skip


def probe(*action: str, started: bool = False, **popen: Any) -> tuple[dict[str, Any], Any]:
    env = {**os.environ, "ROLE_PROBE": "seen", **(STARTED if started else {})}
    done = subprocess.run(
        [*PROBE, *action], env=env, cwd=role_server.REPO, capture_output=True, text=True,
        timeout=60, check=False, **popen,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert lines, done.stderr
    return json.loads(lines[0]), done


def test_a_forked_command_sees_its_process_as_a_started_one_does() -> None:
    forked, _ = probe()
    started, _ = probe(started=True)
    assert forked["forked"]
    assert not started["forked"]
    assert {k: forked[k] for k in SAME} == {k: started[k] for k in SAME}
    assert forked["cmdline"] == [*PROBE]  # what ps and the health check read
    assert forked["ppid"] == started["ppid"] == os.getpid()  # this process waits for it
    assert forked["signal_to_main_thread"]  # pthread_kill finds the main thread
    assert forked["open_fds"] == started["open_fds"]  # nothing of the server's left open


def test_two_forked_commands_draw_different_random_numbers() -> None:
    first, _ = probe()
    second, _ = probe()
    assert first["forked"]
    assert second["forked"]
    assert first["random"] != second["random"]


@pytest.mark.parametrize(
    "action",
    ["", "exit=3", "exit=256", "exit=-1", "message", "raise", "interrupt", "atexit", "unflushed"],
)
def test_a_forked_command_ends_as_a_started_one_does(action: str) -> None:
    """Exit status (a signal's as a negative one), what it wrote last on each stream, and
    what an ending interpreter runs (atexit) or flushes."""
    forked, forked_done = probe(action)
    started, started_done = probe(action, started=True)
    assert forked["forked"]
    assert not started["forked"]
    assert forked_done.returncode == started_done.returncode
    assert forked_done.stdout.splitlines()[1:] == started_done.stdout.splitlines()[1:]
    assert forked_done.stderr.splitlines()[-1:] == started_done.stderr.splitlines()[-1:]


def test_a_forked_command_reads_its_standard_input() -> None:
    forked, _ = probe("echo", input="a line\n")
    assert forked["forked"]
    assert forked["read"] == "a line\n"


def test_a_terminal_is_a_terminal_to_a_forked_command() -> None:
    main, child = pty.openpty()
    try:
        for started in (False, True):
            seen, _ = probe(started=started, stdin=child)
            assert seen["forked"] is not started
            assert seen["stdin_tty"]
    finally:
        os.close(main)
        os.close(child)


@pytest.mark.parametrize("new_session", [False, True])
def test_a_forked_command_gets_its_session_as_asked(new_session: bool) -> None:
    seen, _ = probe(start_new_session=new_session)
    assert seen["forked"]
    assert (seen["sid"] == seen["pid"]) is new_session
    assert seen["sid"] == (seen["pid"] if new_session else os.getsid(0))


def test_a_signal_ends_a_forked_command_and_its_parent_sees_it() -> None:
    with subprocess.Popen(
        [*PROBE, "wait"], cwd=role_server.REPO, stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["forked"]
        assert proc.poll() is None
        proc.terminate()
        assert proc.wait(30) == -15


async def test_asyncio_waits_for_a_forked_command() -> None:
    proc = await asyncio.create_subprocess_exec(
        *PROBE, "exit=5", cwd=role_server.REPO, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert json.loads(out.splitlines()[0])["forked"]
    assert proc.returncode == 5


def test_the_console_script_is_forked_too() -> None:
    server = role_server.installed()
    assert server is not None
    before = server.forked
    done = subprocess.run(
        [role_server.CONSOLE_SCRIPT, "--version"], cwd=role_server.REPO, capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0
    assert done.stdout.startswith("bulk-recorder ")
    assert server.forked == before + 1


PLAIN: dict[str, Any] = {}
MODULE = ("module", "tests.role_probe", [sys.executable])
SCRIPT = [role_server.CONSOLE_SCRIPT, "dlq"]


@pytest.mark.parametrize(
    ("args", "cwd", "env", "asked", "expected"),
    [
        (PROBE, None, {}, PLAIN, MODULE),
        ([*PROBE, "x"], None, {}, PLAIN, ("module", "tests.role_probe", [sys.executable, "x"])),
        ([sys.executable, "-m", "consumer"], None, {}, PLAIN, ("module", "consumer", MODULE[2])),
        ([sys.executable, "-m", "consumerx"], None, {}, PLAIN, None),  # not a module of ours
        ([sys.executable, "-m", "tests.role_probex"], None, {}, PLAIN, None),
        ([sys.executable, "-m", "tests.conftest"], None, {}, PLAIN, None),
        ([sys.executable, "-X", "importtime", "-m", "consumer"], None, {}, PLAIN, None),
        ([sys.executable, "-c", "pass"], None, {}, PLAIN, None),
        (["python3", "-m", "consumer"], None, {}, PLAIN, None),  # another interpreter
        (SCRIPT, None, {}, PLAIN, ("script", "", SCRIPT)),
        (PROBE, "/", {}, PLAIN, None),  # another working directory
        (PROBE, None, {"PYTHONPATH": "/elsewhere"}, PLAIN, None),
        (PROBE, None, {"OTEL_PYTHON_CONTEXT": "x"}, PLAIN, None),
        (PROBE, None, {"LANG": "C"}, PLAIN, None),
        (PROBE, None, {"DATABASE_URL": "postgresql://elsewhere"}, PLAIN, MODULE),  # read later
        (PROBE, None, {}, {"shell": True}, None),
        (PROBE, None, {}, {"preexec_fn": print}, None),
        (PROBE, None, {}, {"pass_fds": (5,)}, None),
        (PROBE, None, {}, {"close_fds": False}, None),
        (PROBE, None, {}, {"uid": 0}, None),
        (PROBE, None, {}, {"umask": 0o22}, None),
        (PROBE, None, {}, {"restore_signals": False}, None),
    ],
)  # fmt: skip
def test_only_what_a_fork_serves_as_a_start_would_is_forked(
    args: list[str], cwd: str | None, env: dict[str, str], asked: dict[str, Any], expected: Any
) -> None:
    server_env = {"PATH": "/usr/bin", "LANG": "C.UTF-8"}
    child_env = {**server_env, **env}
    where = cwd or str(role_server.REPO)
    assert role_server.divertible(args, None, where, child_env, server_env, **asked) == expected


def test_an_executable_other_than_the_first_argument_is_started() -> None:
    server_env: dict[str, str] = {}
    repo = str(role_server.REPO)
    assert role_server.divertible(PROBE, "/bin/true", repo, {}, server_env) is None
    assert role_server.divertible(PROBE, PROBE[0], repo, {}, server_env) is not None


def test_the_session_environment_is_the_one_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that changes an import-time variable in this process gets a started command."""
    monkeypatch.setenv("PYTHONROLEPROBE", "2")
    seen, _ = probe()
    assert not seen["forked"]


@pytest.mark.parametrize("argv", [["--version"], ["dlq", "--help"], ["no-such-command"]])
def test_the_cli_says_the_same_forked_and_started(argv: list[str]) -> None:
    """Its module run as ``__main__`` is the only copy, as in a started ``python -m`` (the
    server's import of it made runpy warn on stderr)."""
    server = role_server.installed()
    assert server is not None
    answers = []
    for extra in ({}, STARTED):
        before = server.forked
        done = subprocess.run(
            [sys.executable, "-m", "consumer.cli", *argv], env={**os.environ, **extra},
            cwd=role_server.REPO, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert server.forked == before + (0 if extra else 1)
        answers.append((done.returncode, done.stdout, done.stderr))
    assert answers[0] == answers[1]
