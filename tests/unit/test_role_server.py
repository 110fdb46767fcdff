"""The role server (tests/role_server.py): a command forked from it is what the same command
started as before is, to its parent, to ``ps`` and to itself; and only the starts it can serve
so are forked. Each comparison runs tests/role_probe.py both ways: forked, and started (an
import-time variable that only the started one has turns the fork down)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path
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
    "stdout_buffer", "stderr_buffer", "stdout_write_through", "stdout_mode", "spawned",
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
    [
        "",
        "exit=3",
        "exit=256",
        "exit=-1",
        "message",
        "raise",
        "interrupt",
        "atexit",
        "unflushed",
        "del-raises",
        "thread-left",
    ],
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
    proc = subprocess.Popen(
        [*PROBE, "wait"], cwd=role_server.REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["forked"]
        assert proc.poll() is None
        proc.terminate()
        assert proc.wait(30) == -15
    finally:
        proc.kill()
        proc.wait(30)
        if proc.stdout is not None:
            proc.stdout.close()


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
MODULE = ("module", "tests.role_probe", PROBE)
SCRIPT = [role_server.CONSOLE_SCRIPT, "dlq"]
PACKAGE = [sys.executable, "-m", "consumer"]


@pytest.mark.parametrize(
    ("args", "cwd", "env", "asked", "expected"),
    [
        (PROBE, None, {}, PLAIN, MODULE),
        ([*PROBE, "x"], None, {}, PLAIN, ("module", "tests.role_probe", [*PROBE, "x"])),
        (PACKAGE, None, {}, PLAIN, ("module", "consumer", PACKAGE)),
        ([sys.executable, "-m", "consumerx"], None, {}, PLAIN, None),  # not a module of ours
        ([sys.executable, "-m", "tests.role_probex"], None, {}, PLAIN, None),
        ([sys.executable, "-m", "tests.conftest"], None, {}, PLAIN, None),
        ([sys.executable, "-X", "importtime", "-m", "consumer"], None, {}, PLAIN, None),
        ([sys.executable, "-c", "pass"], None, {}, PLAIN, None),
        (["python3", "-m", "consumer"], None, {}, PLAIN, None),  # another interpreter
        (SCRIPT, None, {}, PLAIN, ("script", "", SCRIPT)),
        (PROBE, "/", {}, PLAIN, None),  # another working directory
        (PROBE, None, {"PYTHONPATH": "/elsewhere"}, PLAIN, None),
        (PROBE, None, {"HOME": "/elsewhere"}, PLAIN, None),
        (PROBE, None, {"PROMETHEUS_MULTIPROC_DIR": "/tmp"}, PLAIN, None),
        (PROBE, None, {"YARL_NO_EXTENSIONS": "1"}, PLAIN, None),
        (PROBE, None, {"OTEL_TRACES_EXPORTER": "otlp"}, PLAIN, MODULE),  # read by the SDK's setup
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


@pytest.mark.parametrize(
    "argv",
    [
        ["consumer.cli", "--version"],
        ["consumer.cli", "dlq", "--help"],
        ["consumer.cli", "no-such-command"],
        ["consumer", "--help"],  # a package: its __main__ runs
        ["consumer.no_such_module"],
    ],
)
def test_the_cli_says_the_same_forked_and_started(argv: list[str]) -> None:
    """Its module run as ``__main__`` is the only copy, as in a started ``python -m`` (the
    server's import of it made runpy warn on stderr)."""
    server = role_server.installed()
    assert server is not None
    answers = []
    for extra in ({}, STARTED):
        before = server.forked
        done = subprocess.run(
            [sys.executable, "-m", *argv], env={**os.environ, **extra},
            cwd=role_server.REPO, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert server.forked == before + (0 if extra else 1)
        answers.append((done.returncode, done.stdout, done.stderr))
    assert answers[0] == answers[1]


# Imports PRELOAD in a fresh interpreter with os.environ replaced by a mapping that records each
# name read, and where the whole of it was read (iterated or copied).
_READ_AT_IMPORT = """
import importlib, json, os, sys, traceback
real, names, wholes = os.environ, set(), set()

class Recording:
    def _whole(self):
        wholes.add(traceback.extract_stack(limit=3)[0].filename)
    def __getitem__(self, key):
        names.add(key)
        return real[key]
    def get(self, key, default=None):
        names.add(key)
        return real.get(key, default)
    def __contains__(self, key):
        names.add(key)
        return key in real
    def __iter__(self):
        self._whole()
        return iter(real)
    def items(self):
        self._whole()
        return real.items()
    def keys(self):
        self._whole()
        return real.keys()
    def copy(self):
        self._whole()
        return real.copy()
    def __len__(self):
        return len(real)
    def __getattr__(self, name):
        return getattr(real, name)

os.environ = Recording()
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
print(json.dumps({"names": sorted(names), "wholes": sorted(wholes)}))
"""


def test_what_the_server_imports_reads_of_the_environment_is_compared() -> None:
    """A start is forked only with the server's values of every variable read as the server
    imported its modules: a library that begins to read one at import fails this test until
    IMPORT_TIME_ENV names it."""
    done = subprocess.run(
        [sys.executable, "-c", _READ_AT_IMPORT, json.dumps(role_server.PRELOAD)],
        cwd=role_server.REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    read = json.loads(done.stdout.splitlines()[-1])
    assert read["names"]  # the recording saw the imports read (HOME, at least)
    unnamed = [n for n in read["names"] if not n.startswith(role_server.IMPORT_TIME_ENV)]
    assert unnamed == []
    assert [Path(w).name for w in read["wholes"]] == ["handlers.py"]  # wsgiref's, copied again


def test_wsgiref_sees_the_forked_command_s_environment() -> None:
    seen, _ = probe()
    assert seen["forked"]
    assert seen["wsgiref_env"] == "seen"


def test_a_forked_command_is_that_command_once_its_start_returns() -> None:
    """Its session and its command line are set before Popen returns, as an exec'd one's
    are: a test may signal its group or read its command line at once."""
    proc = subprocess.Popen(
        [*PROBE, "wait"], cwd=role_server.REPO, stdout=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert os.getpgid(proc.pid) == proc.pid
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[:-1]
        assert [a.decode() for a in cmdline] == [*PROBE, "wait"]
    finally:
        proc.kill()
        proc.wait(30)


@pytest.mark.parametrize("attempt", range(5))
def test_a_signal_sent_at_once_ends_a_forked_command_by_it(attempt: int) -> None:
    """Signals sent as the fork is made are held until it has become the command, then
    delivered: never lost, never caught by the server's code. (SIGTERM: SIGINT is ignored
    where the suite runs in the background, by a started command as by a forked one.)"""
    proc = subprocess.Popen([*PROBE, "wait"], cwd=role_server.REPO, stdout=subprocess.DEVNULL)
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.wait(30)
