"""What both demos share: a free local port, a bare HTTP GET, and the redrawn progress line."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import secrets
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

# The demo's roles get ports from here, below the kernel's range for port 0 (Linux's default
# ip_local_port_range starts at 32768). A port the kernel gave for port 0 and that we closed
# again can go to the next process that binds port 0 before our role binds it: another
# process's health server then answers our readiness probe. Here only a process asking for that
# very port can take it. The range leaves out 5790-5799, 25790-25799 and 9464.
PICK_FROM = range(10_000, 25_000)
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


# A port is free until the role it was picked for binds it: seconds later for a RabbitMQ node.
# Two processes side by side that draw the same number both find it free. With a shared folder,
# a port handed out is not handed out again, by any process that shares it, for KEPT_S.
KEPT_S = 600.0
_registry: Path | None = None


def share_ports_through(folder: Path) -> None:
    """Record the ports this process hands out under ``folder`` (one empty file each, its
    mtime the time), and pass over those any process recorded there in the last KEPT_S: for
    processes that pick ports side by side on one machine, as the test suite's workers do."""
    global _registry
    folder.mkdir(parents=True, exist_ok=True)
    _registry = folder


def _ephemeral_low() -> int:
    """The first port of the kernel's range for port 0 (65536 where it cannot be read)."""
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 65_536


def _candidate(candidates: range) -> int:
    return candidates[secrets.randbelow(len(candidates))]


@contextlib.contextmanager
def _handing_out() -> Iterator[Callable[[int], bool]]:
    """A check that takes a port for this process, false if another picker has it (under the
    folder's lock, so two processes never take one port)."""
    folder = _registry
    if folder is None:
        yield lambda port: True
        return
    with (folder / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)

        def take(port: int) -> bool:
            record = folder / str(port)
            with contextlib.suppress(FileNotFoundError):
                if time.time() - record.stat().st_mtime < KEPT_S:
                    return False  # handed out lately, maybe not bound yet
            record.touch()  # an old record's time becomes now
            return True

        yield take


def free_port() -> int:
    """A local port that is free now, for a role the demo starts."""
    candidates = range(PICK_FROM.start, min(PICK_FROM.stop, _ephemeral_low()))
    with _handing_out() as take:
        for _ in range(200 if candidates else 0):
            port = _candidate(candidates)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue  # taken: another
            if take(port):
                return port
    with socket.socket() as s:  # a kernel whose range starts below ours: let it choose
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 0, ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.decode(errors="replace").partition("\r\n\r\n")
    parts = head.split(" ", 2)
    return (int(parts[1]) if len(parts) > 1 else 0), body


class ProgressLine:
    """One progress line redrawn in place on a terminal, every few seconds otherwise."""

    def __init__(self) -> None:
        self._tty = sys.stderr.isatty()
        self._last = 0.0

    def draw(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < (0.2 if self._tty else 3.0):
            return
        self._last = now
        sys.stderr.write(("\r" + text.ljust(100)) if self._tty else text + "\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self._tty:
            sys.stderr.write("\n")
