"""The roles and commands the tests start, forked from a server that has imported them, instead
of new interpreters that import them again.

A ``bulk-recorder`` command or role started by a test (``python -m consumer.cli ...``, the
console script, ``python -m consumer``, a benchmark module) spends 0.3-1 CPU-s importing
pydantic, aio-pika, asyncpg, prometheus-client and our modules before its first line of work,
and the side-by-side phase of ``make test`` starts hundreds of them on two busy cores. Each
pytest process starts one server (on its first such start) that has imported them; a start
that :func:`divertible` accepts is then a fork of it.

The child must be the test's child, as a started one is: ``Popen.wait``, ``poll``, asyncio's
child watcher and the CPU accounting of the tests (``RUSAGE_CHILDREN``) wait for it or read it
with ``waitpid``. So the server forks with ``CLONE_PARENT``: the child's parent is the server's
parent, the pytest process. (``CLONE_CHILD_SETTID`` writes the child's thread id where glibc's
``fork`` writes it, so that ``pthread_kill`` reaches the child's main thread.)

The child then becomes what the command line asked for: the standard streams, the working
directory, the environment (the whole of it, replaced), the session or process group, its
``/proc/PID/cmdline`` and name (what ``ps``, ``healthcheck`` and the tests read), ``sys.argv``,
and the module run as ``__main__`` (``runpy``, as ``python -m`` does), ending as an interpreter
ends: threads joined, ``atexit`` run, streams flushed, the exit status of ``SystemExit``.

What the server imported was imported with the server's environment, so a start whose
environment differs in what is read at import (:data:`IMPORT_TIME_ENV`), or that asks for
anything else (a shell, ``preexec_fn``, ``pass_fds``, a user, another working directory, an
interpreter option such as ``-X``), is started as before.
``TEST_ROLE_SERVER=off`` starts every one as before (a run to compare with, or to rule this out).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.machinery
import importlib.util
import io
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import threading
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SWITCH = "TEST_ROLE_SERVER"
CONSOLE_SCRIPT = str(Path(sys.executable).with_name("bulk-recorder"))
# `python -m` of these, or of a module in them (tests/role_probe.py: what the tests of this
# module run; the dead-letter flooder: four at a time in the DLQ's tests)
MODULES = ("consumer", "benchmarks", "tests.role_probe", "tests.integration.dead_letter_flood")
# Read by the interpreter or by a library as :data:`PRELOAD` is imported, not when it is used
# (tests/unit/test_role_server.py records what the imports read): the interpreter's own, the
# locale, HOME (sysconfig's user base), pydantic's plugins, prometheus-client's multiprocess
# mode, and whether multidict, propcache and yarl use their C extensions. (wsgiref copies the
# whole environment as it is imported: the child copies it again, :func:`_become`.)
IMPORT_TIME_ENV = (
    "PYTHON", "_PYTHON", "LC_", "LANG", "TZ", "HOME", "PYDANTIC_", "PROMETHEUS_",
    "prometheus_", "MULTIDICT_", "PROPCACHE_", "YARL_",
)  # fmt: skip
# What the server imports: every command's modules, and what they import.
PRELOAD = (
    "settings",
    "consumer.cli",
    "consumer.app",
    "consumer.runner",
    "consumer.migrate_cmd",
    "consumer.topology",
    "consumer.producer",
    "consumer.api_keys",
    "consumer.healthcheck",
    "consumer.tools.loadgen",
    "consumer.tools.demo",
    "consumer.tools.dlq",
    "consumer.tools.outbox",
    "consumer.tools.retention",
    "consumer.tools.partitions",
    "consumer.tools.shards",
    "consumer.tools.tune",
    "bulk_recorder.build",
    "uvloop",
)
MAX_MESSAGE = 1 << 20
ANSWER_WAIT_S = 60.0  # for the server's answer: it imports for seconds, forks in milliseconds

# x86-64 Linux: clone(2)'s number and flags.
_SYS_CLONE = 56
_CLONE_PARENT = 0x00008000
_CLONE_CHILD_SETTID = 0x01000000
_PR_SET_NAME, _PR_SET_MM, _PR_SET_MM_MAP = 15, 35, 14


# The test's side ---------------------------------------------------------------------------


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV)}


def divertible(
    args: Sequence[str],
    executable: str | None,
    cwd: str | None,
    env: Mapping[str, str],
    server_env: Mapping[str, str],
    **asked: Any,
) -> tuple[str, str, list[str]] | None:
    """What the server runs for this start: ``("module", name, args)`` for ``python -m name``,
    ``("script", "", args)`` for the console script; None when it must be started as before.
    ``asked`` are Popen's other arguments, each at the value that asks for nothing."""
    plain = {
        "shell": False,
        "preexec_fn": None,
        "pass_fds": (),
        "close_fds": True,
        "restore_signals": True,
        "gid": None,
        "gids": None,
        "uid": None,
        "umask": -1,
    }
    if any(asked.get(name, value) != value for name, value in plain.items()):
        return None
    if not args or not all(isinstance(a, str) for a in args):
        return None
    if executable not in (None, args[0]):
        return None
    if os.path.realpath(cwd or os.getcwd()) != str(REPO):
        return None
    if any(not isinstance(k, str) or not isinstance(v, str) or "=" in k for k, v in env.items()):
        return None
    if import_time_env(env) != import_time_env(server_env):
        return None
    if args[0] == CONSOLE_SCRIPT:
        return ("script", "", list(args))
    if args[0] == sys.executable and len(args) >= 3 and args[1] == "-m":
        module = args[2]
        if any(module == m or module.startswith(m + ".") for m in MODULES):
            return ("module", module, list(args))
    return None


class _Unanswered(OSError):
    """The request was sent and no answer came: the child may run, so it is not started again."""


class RoleServer:
    """One pytest process's server: started on first use, ended with the process."""

    def __init__(self) -> None:
        self.env = dict(os.environ)  # as the session started, not as a test changed it
        self.pid = os.getpid()  # a process forked from this one has none of its own
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.broken = False
        self.forked = 0  # commands forked so far

    def _start(self) -> socket.socket:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ours.settimeout(ANSWER_WAIT_S)
        try:
            self._process = subprocess.Popen(  # not ours to fork: its module is not in MODULES
                [sys.executable, "-m", "tests.role_server", str(theirs.fileno())],
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # what goes wrong comes back as the answer
                pass_fds=(theirs.fileno(),),
            )
            theirs.close()
            ready = ours.recv(MAX_MESSAGE)
        except BaseException:
            ours.close()
            theirs.close()
            raise
        if ready != b"ready":
            ours.close()
            raise OSError(f"the role server did not start: {ready.decode(errors='replace')}")
        self._socket = ours
        return ours

    def spawn(
        self,
        target: tuple[str, str, list[str]],
        fds: tuple[int, int, int],
        env: Mapping[str, str],
        new_session: bool,
        process_group: int,
    ) -> int:
        """Fork ``target`` with ``fds`` as its standard streams, once it has become that
        command (its session, streams, command line): its pid, a child of this process."""
        kind, module, args = target
        request = json.dumps(
            {
                "kind": kind,
                "module": module,
                "args": args,
                "env": dict(env),
                "new_session": new_session,
                "process_group": process_group,
            }
        ).encode()
        with self._lock:
            if self.broken:
                raise OSError("the role server is gone")
            try:
                channel = self._socket or self._start()
            except BaseException:
                self.broken = True
                raise
            socket.send_fds(channel, [request], list(fds))
            try:
                answer = json.loads(channel.recv(MAX_MESSAGE) or b'{"error": "the server ended"}')
            except BaseException as error:
                # An answer may still come: no later request may take it for its own.
                self.broken = True
                channel.close()
                self._socket = None
                raise _Unanswered(f"the role server did not answer: {error!r}") from error
        if "pid" in answer and "error" in answer:
            os.waitpid(int(answer["pid"]), 0)  # it failed to become the command, and ended
        if "error" in answer:
            raise OSError(f"the role server refused: {answer['error']}")
        self.forked += 1
        return int(answer["pid"])

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()  # the server ends on the end of its requests
            self._socket = None
        if self._process is not None:
            self._process.wait(30)
            self._process = None


_original_execute_child: Callable[..., None] | None = None
_server: RoleServer | None = None


def install() -> None:
    """Start the commands :func:`divertible` accepts from the server, in this process."""
    global _original_execute_child, _server
    if os.environ.get(SWITCH, "on") == "off" or _original_execute_child is not None:
        return
    if sys.platform != "linux" or os.uname().machine != "x86_64" or _tid_offset() is None:
        return
    _server = RoleServer()
    _original_execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    subprocess.Popen._execute_child = _execute_child  # type: ignore[attr-defined]


def installed() -> RoleServer | None:
    """This process's server, when starts are forked from one."""
    return _server


def uninstall() -> None:
    global _original_execute_child, _server
    if _original_execute_child is not None:
        subprocess.Popen._execute_child = _original_execute_child  # type: ignore[attr-defined]
        _original_execute_child = None
    if _server is not None:
        _server.close()
        _server = None


def _execute_child(
    self: subprocess.Popen[Any],
    args: Any,
    executable: Any,
    preexec_fn: Any,
    close_fds: bool,
    pass_fds: Sequence[int],
    cwd: Any,
    env: Mapping[Any, Any] | None,
    startupinfo: Any,
    creationflags: int,
    shell: bool,
    p2cread: int,
    p2cwrite: int,
    c2pread: int,
    c2pwrite: int,
    errread: int,
    errwrite: int,
    restore_signals: bool,
    gid: Any,
    gids: Any,
    uid: Any,
    umask: int,
    start_new_session: bool,
    process_group: int,
) -> None:
    """``Popen._execute_child``, forking from the server what it accepts."""
    original = _original_execute_child
    assert original is not None
    server = _server
    target = None
    if (
        server is not None
        and not server.broken
        and server.pid == os.getpid()
        and isinstance(args, list | tuple)
    ):
        child_env = dict(os.environ if env is None else env)
        target = divertible(
            [os.fsdecode(a) if isinstance(a, bytes | os.PathLike) else a for a in args],
            None if executable is None else os.fsdecode(executable),
            None if cwd is None else os.fsdecode(cwd),
            child_env,
            server.env,
            shell=shell,
            preexec_fn=preexec_fn,
            pass_fds=tuple(pass_fds),
            close_fds=close_fds,
            restore_signals=restore_signals,
            gid=gid,
            gids=gids,
            uid=uid,
            umask=umask,
        )
    if target is not None and server is not None:
        sys.audit("subprocess.Popen", target[2][0], target[2], cwd, env)
        fds = (
            0 if p2cread == -1 else p2cread,
            1 if c2pwrite == -1 else c2pwrite,
            2 if errwrite == -1 else errwrite,
        )
        try:
            pid = server.spawn(target, fds, child_env, start_new_session, process_group)
        except _Unanswered:
            raise
        except OSError as error:
            print(f"tests.role_server: {error}; starting commands as before", file=sys.stderr)
        else:
            self.pid = pid
            self._child_created = True  # type: ignore[attr-defined]
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]
            return
    original(
        self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
        creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
        restore_signals, gid, gids, uid, umask, start_new_session, process_group,
    )  # fmt: skip


# The server's side -------------------------------------------------------------------------


def _tid_offset() -> int | None:
    """Where glibc keeps a thread's id in its descriptor (what its ``fork`` sets in the child),
    checked against this thread's id; None where it cannot be found."""
    try:
        libc = ctypes.CDLL(None)
        offset = (ctypes.c_uint32 * 3).in_dll(libc, "_thread_db_pthread_tid")[2]
        libc.pthread_self.restype = ctypes.c_void_p
        here = libc.pthread_self() + offset
    except (OSError, ValueError, TypeError):
        return None
    found = ctypes.c_int.from_address(here).value == threading.get_native_id()
    return int(offset) if found else None


def _fork_as_sibling(tid_offset: int) -> int:
    """``os.fork``, the child's parent being this process's parent: 0 in the child, the
    child's pid here. Only in a process of one thread, with every signal blocked (as glibc's
    fork blocks them): no Python may run between the clone and the interpreter's after-fork."""
    python = ctypes.pythonapi  # calls that hold the GIL, as os.fork does
    libc = ctypes.PyDLL(None, use_errno=True)
    libc.pthread_self.restype = ctypes.c_void_p
    libc.syscall.restype = ctypes.c_long
    libc.syscall.argtypes = [ctypes.c_long, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
    tid_at = libc.pthread_self() + tid_offset
    flags = _CLONE_PARENT | _CLONE_CHILD_SETTID | signal.SIGCHLD
    python.PyOS_BeforeFork()
    pid = libc.syscall(_SYS_CLONE, flags, None, None, tid_at, None)
    if pid == 0:
        python.PyOS_AfterFork_Child()
        return 0
    error = ctypes.get_errno()
    python.PyOS_AfterFork_Parent()
    if pid < 0:
        raise OSError(error, os.strerror(error))
    return int(pid)


class _MmMap(ctypes.Structure):
    """``struct prctl_mm_map`` (linux/prctl.h)."""

    _fields_ = [
        *((name, ctypes.c_uint64) for name in (
            "start_code", "end_code", "start_data", "end_data", "start_brk", "brk",
            "start_stack", "arg_start", "arg_end", "env_start", "env_end", "auxv",
        )),
        ("auxv_size", ctypes.c_uint32),
        ("exe_fd", ctypes.c_uint32),
    ]  # fmt: skip


def _set_arguments(start: int | None = None, end: int | None = None) -> bool:
    """Point ``/proc/self/cmdline`` at [start, end) (or where it is: a check that it can be
    moved), everything else of the process's memory map as it is (``PR_SET_MM_MAP``: the
    capability ``CAP_CHECKPOINT_RESTORE``, which root has here)."""
    fields = Path("/proc/self/stat").read_text().rpartition(")")[2].split()

    def field(number: int) -> int:  # proc(5) numbers them from 1; the split starts at 3
        return int(fields[number - 3])

    libc = ctypes.CDLL(None, use_errno=True)
    libc.sbrk.restype = ctypes.c_void_p
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                           ctypes.c_ulong]  # fmt: skip
    mm = _MmMap(
        start_code=field(26), end_code=field(27), start_stack=field(28),
        start_data=field(45), end_data=field(46), start_brk=field(47),
        arg_start=field(48) if start is None else start,
        arg_end=field(49) if end is None else end,
        env_start=field(50), env_end=field(51), auxv=0, auxv_size=0, exe_fd=0xFFFFFFFF,
    )  # fmt: skip
    size, pointer = ctypes.sizeof(mm), ctypes.byref(mm)
    mm.brk = libc.sbrk(0)  # last: what the kernel takes for the heap's end must be its end
    return int(libc.prctl(_PR_SET_MM, _PR_SET_MM_MAP, pointer, size, 0)) == 0


_cmdline: Any = None


def _set_cmdline(argv: list[str]) -> None:
    """``/proc/self/cmdline`` and the process name as ``execve(argv)`` would have set them."""
    global _cmdline  # kept for the life of the process: the kernel reads it from there
    libc = ctypes.CDLL(None)
    name = ctypes.c_char_p(os.path.basename(argv[0]).encode()[:15])
    libc.prctl(_PR_SET_NAME, name, 0, 0, 0)
    text = b"\0".join(os.fsencode(a) for a in argv) + b"\0"
    _cmdline = ctypes.create_string_buffer(text)
    start = ctypes.addressof(_cmdline)
    if not _set_arguments(start, start + len(text)):
        raise OSError("/proc/self/cmdline could not be set")


def _stdio() -> None:
    """New standard streams on fds 0-2, as an interpreter makes them at start
    (``create_stdio``): stdin buffered; stdout and stderr written through, unbuffered, under
    ``-u`` (the server's, which the command shares), else line-buffered on a terminal and
    stderr always."""
    assert isinstance(sys.stdout, io.TextIOWrapper)
    unbuffered = sys.stdout.write_through
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        old = getattr(sys, name)
        if mode == "r":
            buffer: Any = io.open(fd, "rb", closefd=False)  # noqa: SIM115, UP020
            raw = buffer.raw
        else:
            buffer = io.open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115, UP020
            raw = buffer if unbuffered else buffer.raw
        raw.name = f"<{name}>"
        stream = io.TextIOWrapper(
            buffer,
            encoding=old.encoding,
            errors=old.errors,
            newline="\n",
            line_buffering=mode == "w" and not unbuffered and (os.isatty(fd) or fd == 2),
            write_through=mode == "w" and unbuffered,
        )
        stream.mode = mode  # type: ignore[misc]
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _unimport(module: str) -> None:
    """Forget the server's import of what runs as ``__main__`` (the module, or a package's
    ``__main__``): a started ``python -m`` has only that copy (runpy warns of another), and
    imports another only if asked to."""
    spec = importlib.util.find_spec(module)
    if spec is not None and spec.submodule_search_locations is not None:
        module += ".__main__"
    if sys.modules.pop(module, None) is not None:
        package, _, name = module.rpartition(".")
        if package and hasattr(sys.modules.get(package), name):
            delattr(sys.modules[package], name)


def _shebang(script: str) -> str:
    """The interpreter a script's ``#!`` line names (what the kernel runs it with)."""
    with open(script, "rb") as f:
        first = f.readline()
    return os.fsdecode(first[2:].strip().split(b" ")[0]) if first.startswith(b"#!") else ""


def _become(request: dict[str, Any], fds: list[int], ready: int) -> None:
    """In the child, its signals blocked: become the command ``request`` asks for; close
    ``ready`` when it has (the server answers then); then run it as ``__main__``, and end as a
    started interpreter ends (this is the server's ``__main__``: an exception or ``SystemExit``
    ends the process as it would have ended that interpreter)."""
    args: list[str] = request["args"]
    try:
        if request["new_session"]:
            os.setsid()
        if request["process_group"] >= 0:
            os.setpgid(0, request["process_group"])
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, ready)
        os.closerange(ready + 1, os.sysconf("SC_OPEN_MAX"))
        os.chdir(REPO)
        os.environ.clear()
        os.environ.update(request["env"])
        handlers = sys.modules.get("wsgiref.handlers")
        if handlers is not None:  # its copy of the environment, made as it was imported
            handlers.BaseHandler.os_environ = handlers.read_environ()
        if request["kind"] == "script":
            interpreter = _shebang(args[0])
            _set_cmdline([interpreter, *args] if interpreter else args)
        else:
            _set_cmdline(args)
        _stdio()
    except BaseException as error:
        os.write(ready, repr(error).encode())
        os._exit(1)
    os.close(ready)
    main = types.ModuleType("__main__")  # a fresh one, as an interpreter starts with
    sys.modules["__main__"] = main
    signal.pthread_sigmask(signal.SIG_SETMASK, set())  # what arrived meanwhile, now
    if request["kind"] == "script":
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(args[0])  # a script's own directory comes first
        with open(args[0], "rb") as f:
            code = compile(f.read(), args[0], "exec")
        main.__file__ = args[0]
        main.__dict__["__cached__"] = None
        main.__loader__ = importlib.machinery.SourceFileLoader("__main__", args[0])
        exec(code, main.__dict__)
        return
    module = request["module"]
    sys.argv = ["-m", *args[3:]]
    sys.path[0] = str(REPO)  # `python -m` starts in the working directory
    _unimport(module)
    runpy._run_module_as_main(module)  # type: ignore[attr-defined]  # what `-m` runs


def serve(channel: socket.socket) -> tuple[dict[str, Any], list[int], int] | None:
    """Fork a child for each request until the test's process ends: None here; in a child,
    what it is to become (:func:`_become`)."""
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except BaseException:
        channel.send(traceback.format_exc()[-MAX_MESSAGE // 2 :].encode())
        return None
    offset = _tid_offset()
    if offset is None or not _set_arguments():
        channel.send(b"this process cannot fork as a sibling, or set a child's command line")
        return None
    channel.send(b"ready")
    while True:
        message, fds, _flags, _address = socket.recv_fds(channel, MAX_MESSAGE, 3)
        if not message:
            return None
        answer = _fork(json.loads(message), fds, offset)
        if answer is None:  # the child
            channel.close()
            return json.loads(message), fds, _ready_fd
        channel.send(json.dumps(answer).encode())


_ready_fd = -1


def _fork(request: dict[str, Any], fds: list[int], offset: int) -> dict[str, Any] | None:
    """Fork the child for ``request``, and wait until it has become the command: its pid
    (with an error if it could not), or None in the child."""
    global _ready_fd
    if len(os.listdir("/proc/self/task")) != 1:
        return {"error": "the server has more than one thread"}
    readable, _ready_fd = os.pipe()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    try:
        pid = _fork_as_sibling(offset)
    except OSError as error:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.close(readable)
        os.close(_ready_fd)
        for fd in fds:
            os.close(fd)
        return {"error": repr(error)}
    if pid == 0:
        os.close(readable)
        return None
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    os.close(_ready_fd)
    for fd in fds:
        os.close(fd)
    with os.fdopen(readable, "rb") as became:
        failed = became.read()  # until the child closes its end: it has become the command
    return {"pid": pid, "error": failed.decode(errors="replace")} if failed else {"pid": pid}


if __name__ == "__main__":
    child = serve(socket.socket(fileno=int(sys.argv[1])))
    if child is not None:
        _become(*child)
