"""What both demos share: a free local port, a bare HTTP GET, and the redrawn progress line."""

from __future__ import annotations

import asyncio
import socket
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
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
