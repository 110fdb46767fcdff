"""An asyncio TCP proxy for fault tests: put it between the recorder and PostgreSQL or RabbitMQ.

``TcpProxy(host, port)`` listens on 127.0.0.1 with a free port and forwards every connection to
the target. Four modes:

- pass (``restore()``): bytes flow both ways.
- cut (``cut()``): every open connection is aborted (the peer sees a reset) and new connections
  are accepted and closed at once, as when the other side is down.
- blackhole (``blackhole()``): connections stay open, new ones are accepted, and nothing is
  forwarded: at most one chunk a direction is read and held, then the sockets are no longer
  read, so TCP holds the rest (a partition that loses nothing). ``restore()`` lets the held
  bytes through in order, like a healed network.
- refuse new (``refuse_new()``): open connections keep flowing; new ones are accepted and closed
  at once, so a client that leaves its connection cannot come back until ``restore()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Self

log = logging.getLogger(__name__)

Mode = Literal["pass", "cut", "blackhole", "refuse"]

# Sees every chunk of one direction of one connection just before it is forwarded (awaited, so
# it can hold the chunk); see TcpProxy.inspector.
Inspect = Callable[[bytes], Awaitable[None]]
# Rewrites every chunk of one direction of one connection before it is forwarded (after the
# inspector): what it returns goes on, possibly nothing; see TcpProxy.rewriter.
Rewrite = Callable[[bytes], bytes]

_CHUNK = 65_536


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream connection."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def abort(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()


class TcpProxy:
    """Forward 127.0.0.1:<port> to ``target_host:target_port``; inject faults on demand."""

    def __init__(self, target_host: str, target_port: int, listen_host: str = "127.0.0.1") -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = listen_host
        self.mode: Mode = "pass"
        self.faults = 0  # cut() and blackhole() calls that changed the mode
        self.connections_total = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._accept, self.listen_host, 0)
        log.debug("proxy %d -> %s:%d", self.port, self.target_host, self.target_port)
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "proxy not started"
        assert self._server.sockets, "proxy not listening"
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for link in list(self._links):
            link.abort()
        self._flowing.set()  # wake blocked pumps so that they see their closed streams
        tasks = [t for link in self._links for t in link.tasks] + list(self._handlers)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._links.clear()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- faults ---------------------------------------------------------------------------

    @property
    def active_connections(self) -> int:
        return len(self._links)

    def cut(self) -> None:
        """Abort every connection and refuse new ones (accept, then close) until restore()."""
        if self.mode != "cut":
            self.faults += 1
        self.mode = "cut"
        self._flowing.clear()
        for link in list(self._links):
            link.abort()
        log.info("proxy %d: cut", self.port)

    def blackhole(self) -> None:
        """Hold every connection open and forward nothing until restore()."""
        if self.mode != "blackhole":
            self.faults += 1
        self.mode = "blackhole"
        self._flowing.clear()
        log.info("proxy %d: blackhole", self.port)

    def refuse_new(self) -> None:
        """Keep the open connections flowing; close every new one at once until restore()."""
        if self.mode != "refuse":
            self.faults += 1
        self.mode = "refuse"
        log.info("proxy %d: refusing new connections", self.port)

    def restore(self) -> None:
        """Forward again; connections held by blackhole() resume where they stopped."""
        self.mode = "pass"
        self._flowing.set()
        log.info("proxy %d: restored", self.port)

    def inspector(self, connection: int, to_upstream: bool) -> Inspect | None:
        """Hook for subclasses that watch the traffic (e.g. decode it): called once per
        direction of each connection (numbered from 1 in accept order). None: not watched."""
        return None

    def rewriter(self, connection: int, to_upstream: bool) -> Rewrite | None:
        """Hook for subclasses that change the traffic (e.g. drop a frame): called once per
        direction of each connection. None: forwarded as read."""
        return None

    async def open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """The connection to the target (subclasses may open it elsewhere, e.g. in another
        network namespace: tests/rigs/netns.py)."""
        return await asyncio.open_connection(self.target_host, self.target_port)

    def _is_cut(self) -> bool:
        # a method, not an inline comparison: the mode changes while a handler awaits
        return self.mode == "cut"

    # -- forwarding -----------------------------------------------------------------------

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.ensure_future(self._serve(reader, writer))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_total += 1
        number = self.connections_total
        if self.mode in ("cut", "refuse"):
            writer.transport.abort()
            return
        link = _Link(writer)
        self._links.add(link)
        try:
            await self._flowing.wait()  # blackhole: accepted, but not connected onwards yet
            if self._is_cut() or writer.transport.is_closing():
                return
            try:
                up_reader, up_writer = await self.open_upstream()
            except (OSError, TimeoutError) as exc:
                log.debug("proxy %d: upstream connect failed: %s", self.port, exc)
                return
            link.upstream = up_writer
            if self._is_cut():
                return
            link.tasks = [
                asyncio.ensure_future(
                    self._pump(
                        reader,
                        up_writer,
                        self.inspector(number, to_upstream=True),
                        self.rewriter(number, to_upstream=True),
                    )
                ),
                asyncio.ensure_future(
                    self._pump(
                        up_reader,
                        writer,
                        self.inspector(number, to_upstream=False),
                        self.rewriter(number, to_upstream=False),
                    )
                ),
            ]
            # When either direction ends, the other cannot carry a meaningful conversation.
            await asyncio.wait(link.tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            link.abort()
            for task in link.tasks:
                task.cancel()
            await asyncio.gather(*link.tasks, return_exceptions=True)
            self._links.discard(link)

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        inspect: Inspect | None,
        rewrite: Rewrite | None = None,
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await src.read(_CHUNK)
                if not data:
                    return
                if not self._flowing.is_set():
                    await self._flowing.wait()  # held, not dropped
                if self._is_cut() or dst.transport.is_closing():
                    return
                if inspect is not None:
                    await inspect(data)
                    if self._is_cut() or dst.transport.is_closing():
                        return
                if rewrite is not None:
                    data = rewrite(data)
                dst.write(data)
                await dst.drain()
