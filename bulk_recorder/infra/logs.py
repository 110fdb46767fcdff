"""Logging set-up: one ``dictConfig`` for the process, text for people, JSON for containers."""

from __future__ import annotations

import json
import logging
import logging.config
from datetime import UTC, datetime
from typing import Any

from bulk_recorder.infra.tracing import current_ids


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the traceback if any, and the
    ``trace_id`` and ``span_id`` (hex) of the span it was written in, when tracing is on."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ids = current_ids()
        if ids is not None:
            payload["trace_id"], payload["span_id"] = ids
        if record.exc_info:
            payload["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(payload, ensure_ascii=False)


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    formatter = (
        {"()": JsonFormatter}
        if fmt == "json"
        else {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"}
    )
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"default": formatter},
            "handlers": {
                "stderr": {
                    "class": "logging.StreamHandler",
                    "formatter": "default",
                    "stream": "ext://sys.stderr",
                }
            },
            "root": {"handlers": ["stderr"], "level": level},
            "loggers": {
                "aiormq": {"level": "WARNING"},
                "aio_pika": {"level": "WARNING"},
            },
        }
    )
    quiet_aiormq_connect_errors()


class _NotAConnectError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(AIORMQ_CONNECT_ERROR))


AIORMQ_CONNECT_ERROR = "error when creating transport"


def quiet_aiormq_connect_errors() -> None:
    """Drop aiormq's ERROR for every refused connect (``error when creating transport``): the
    connect raises, and the service logs the outage itself, once per change of state
    (:class:`bulk_recorder.infra.reconnect.OutageLog`), at its own level. An ERROR a retry
    would trip every ERROR-level log alert during an outage the service rides out."""
    aiormq_connection = logging.getLogger("aiormq.connection")
    if not any(isinstance(f, _NotAConnectError) for f in aiormq_connection.filters):
        aiormq_connection.addFilter(_NotAConnectError())
