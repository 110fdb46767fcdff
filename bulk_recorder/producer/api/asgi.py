"""What the API's two pure ASGI middlewares share: the ASGI types and the response status seen;
and how uvicorn, which serves them, names its log lines."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class StatusSeen:
    """An ASGI ``send`` that passes every message on and keeps the response's status: 500 until
    a response starts (an exception before it is answered 500 by the server)."""

    __slots__ = ("_send", "status")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status = 500

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
        await self._send(message)


# The logger uvicorn writes all its own lines under, failures and lifecycle alike.
UVICORN_ERROR = "uvicorn.error"


class _OurName(logging.Filter):
    """Renames uvicorn's ``uvicorn.error`` records (its lifecycle lines too) to ``uvicorn``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == UVICORN_ERROR:
            record.name = "uvicorn"
        return True


def uvicorn_loggers() -> None:
    """uvicorn writes every line of its own, "Started server process" and "Application startup
    complete" as much as a failure, under the logger ``uvicorn.error``: a log search for errors
    would find each start and stop. Run with ``log_config=None`` (the service's handlers and
    format), its lines come out under ``uvicorn``, each at its own level."""
    logger = logging.getLogger(UVICORN_ERROR)
    if not any(isinstance(f, _OurName) for f in logger.filters):
        logger.addFilter(_OurName())
