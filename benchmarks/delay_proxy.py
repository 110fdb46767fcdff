"""A TCP proxy that adds a fixed latency, to benchmark against a "remote" database on loopback.

    python -m benchmarks.delay_proxy --target 127.0.0.1:5432 --delay-ms 1

prints ``listening on 127.0.0.1:<port>`` and forwards every connection to the target, holding
each chunk of bytes for half the delay in each direction (so a round trip gains ``--delay-ms``)
while keeping its order and letting later chunks follow in the same pipeline: latency, not
bandwidth. Threads with ``time.sleep`` are used because event-loop timers have millisecond
granularity (a 0.5 ms sleep would become 1-2 ms). Listens on loopback only; stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import signal
import socket
import sys
import threading
import time
from types import FrameType


class Pipe:
    """One direction of one connection: a receiver thread and a delayed sender thread."""

    def __init__(self, src: socket.socket, dst: socket.socket, delay_s: float) -> None:
        self._src = src
        self._dst = dst
        self._delay = delay_s
        self._queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self._ready = threading.Condition()
        threading.Thread(target=self._receive, daemon=True).start()
        threading.Thread(target=self._send, daemon=True).start()

    def _receive(self) -> None:
        while True:
            try:
                data = self._src.recv(262_144)
            except OSError:
                data = b""
            with self._ready:
                self._queue.append((time.monotonic() + self._delay, data))
                self._ready.notify()
            if not data:
                return

    def _send(self) -> None:
        while True:
            with self._ready:
                while not self._queue:
                    self._ready.wait()
                due, data = self._queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    self._dst.shutdown(socket.SHUT_WR)
                return
            try:
                self._dst.sendall(data)
            except OSError:
                return


def serve(listen: socket.socket, target: tuple[str, int], delay_s: float) -> None:
    while True:
        client, _ = listen.accept()
        try:
            upstream = socket.create_connection(target)
        except OSError:
            client.close()
            continue
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        Pipe(client, upstream, delay_s / 2)
        Pipe(upstream, client, delay_s / 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--target", default="127.0.0.1:5432", help="host:port to forward to")
    parser.add_argument("--delay-ms", type=float, default=1.0, help="added round-trip time")
    parser.add_argument("--port", type=int, default=0, help="port to listen on (0: any free)")
    args = parser.parse_args()
    host, _, port = args.target.rpartition(":")
    sys.setswitchinterval(0.0002)  # hand the GIL over quickly: senders wake on time

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, on_term)
    listen = socket.socket()
    listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listen.bind(("127.0.0.1", args.port))
    listen.listen(128)
    print(f"listening on 127.0.0.1:{listen.getsockname()[1]}", flush=True)
    serve(listen, (host, int(port)), args.delay_ms / 1000)


if __name__ == "__main__":
    main()
