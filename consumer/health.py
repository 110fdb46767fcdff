"""A tiny HTTP server for ``/metrics`` (Prometheus), ``/healthz`` (alive) and ``/readyz``.

Ready means connected to both the broker and the database. Plain asyncio streams: the service
needs three fixed GET routes, not a web framework.
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from bulk_recorder.exceptions import EXIT_SETTINGS, BulkRecorderError
from bulk_recorder.infra.metrics import exposition

log = logging.getLogger(__name__)


class PortUnavailable(BulkRecorderError):
    """A listening port cannot be had: the message names the setting, the port and why."""

    exit_code = EXIT_SETTINGS

    def __init__(self, variable: str, host: str, port: int, exc: OSError) -> None:
        why = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be used ({exc})"
        super().__init__(
            f"{variable}: port {port} on {host} {why}; set {variable} to a free port"
            + (" (0 disables it)" if variable == "METRICS_PORT" else "")
        )
        self.variable = variable
        self.port = port


class HealthServer:
    def __init__(
        self,
        registry: CollectorRegistry,
        ready: Callable[[], tuple[bool, str]],
        host: str = "127.0.0.1",
        port: int = 9464,
    ) -> None:
        self._registry = registry
        self._ready = ready
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            return self._port
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        """Listen; raises :class:`PortUnavailable` naming METRICS_PORT when that fails."""
        try:
            self._server = await asyncio.start_server(self._handle, self._host, self._port)
        except OSError as exc:
            raise PortUnavailable("METRICS_PORT", self._host, self._port, exc) from None
        log.info("metrics and health on http://%s:%d/metrics", self._host, self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            parts = request.split(b" ", 2)
            method = parts[0] if parts else b""
            path = parts[1].split(b"?", 1)[0] if len(parts) > 1 else b""
            headers: dict[str, str] = {}
            if method not in (b"GET", b"HEAD"):
                status, ctype, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
            elif path == b"/metrics":
                asked = _headers(request)
                body, headers = exposition(
                    self._registry, asked.get("accept", ""), asked.get("accept-encoding", "")
                )
                status, ctype = "200 OK", headers.pop("Content-Type")
            elif path == b"/healthz":
                status, ctype, body = "200 OK", "text/plain", b"ok\n"
            elif path == b"/readyz":
                ok, detail = self._ready()
                status = "200 OK" if ok else "503 Service Unavailable"
                ctype, body = "text/plain", (detail + "\n").encode()
            else:
                status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
            extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n{extra}"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            ).encode()
            writer.write(head if method == b"HEAD" else head + body)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()


def _headers(request: bytes) -> dict[str, str]:
    """The request's header fields, names lower-cased (the request line skipped)."""
    fields: dict[str, str] = {}
    for line in request.decode("latin-1").split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if sep:
            fields[name.strip().lower()] = value.strip()
    return fields
