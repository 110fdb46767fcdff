"""``python -m tests.role_probe [ACTION]``: what a started command sees of its own process, as
JSON on stdout, then ACTION (tests/unit/test_role_server.py compares a forked start with a
started one)."""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time


def facts() -> dict[str, object]:
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = [a.decode() for a in f.read().split(b"\0")[:-1]]
    with open("/proc/self/comm") as f:
        comm = f.read().strip()
    received: list[int] = []
    signal.signal(signal.SIGUSR1, lambda *_: received.append(1))
    main = threading.get_ident()
    sender = threading.Thread(target=signal.pthread_kill, args=(main, signal.SIGUSR1))
    sender.start()
    sender.join()
    deadline = time.monotonic() + 5
    while not received and time.monotonic() < deadline:
        time.sleep(0.001)
    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sid": os.getsid(0),
        "pgid": os.getpgid(0),
        "argv": sys.argv,
        "cmdline": cmdline,
        "comm": comm,
        "cwd": os.getcwd(),
        "path0": sys.path[0],
        "main": sys.modules["__main__"].__spec__.name,  # type: ignore[union-attr]
        "probe_env": os.environ.get("ROLE_PROBE"),
        "stdin_tty": sys.stdin.isatty(),
        "stdout_line_buffered": sys.stdout.line_buffering,
        "stderr_line_buffered": sys.stderr.line_buffering,
        "stdin_name": sys.stdin.name,
        "random": random.random(),
        "signal_to_main_thread": bool(received),
        "forked": "consumer.app" in sys.modules,  # imported by the server only
        "open_fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "wsgiref_env": _wsgiref_env(),
        "stdout_buffer": type(sys.stdout.buffer).__name__,
        "stderr_buffer": type(sys.stderr.buffer).__name__,
        "stdout_write_through": getattr(sys.stdout, "write_through", None),
        "stdout_mode": sys.stdout.mode,
        "spawned": _spawned(),
    }


def _spawned() -> int:
    """A process started by multiprocessing's spawn, which imports ``__main__`` again."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return int(pool.apply(abs, (-7,)))


class _RaisesAtExit:
    def __del__(self) -> None:
        raise RuntimeError("raised at exit")


def _wsgiref_env() -> str | None:
    from wsgiref.handlers import BaseHandler

    return BaseHandler.os_environ.get("ROLE_PROBE")


_LEFT: object = None


def _finish_later() -> None:
    time.sleep(0.5)
    print("thread done")


def main() -> None:
    action = sys.argv[1] if len(sys.argv) > 1 else ""
    line = sys.stdin.readline() if action == "echo" else ""
    found = facts()
    found["read"] = line
    print(json.dumps(found), flush=True)
    print("to stderr", file=sys.stderr)
    if action.startswith("exit="):
        sys.exit(int(action.removeprefix("exit=")))
    if action == "message":
        sys.exit("a message")
    if action == "raise":
        raise RuntimeError("raised")
    if action == "interrupt":
        raise KeyboardInterrupt
    if action == "wait":
        signal.pause()  # until a signal ends it
    if action == "unflushed":
        sys.stdout.write("no newline, no flush")
    if action == "del-raises":
        global _LEFT
        _LEFT = _RaisesAtExit()
    if action == "thread-left":
        threading.Thread(target=_finish_later).start()
    if action == "atexit":
        import atexit

        atexit.register(lambda: print("atexit ran"))


if __name__ == "__main__":
    main()
