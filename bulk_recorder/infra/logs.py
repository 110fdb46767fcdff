"""Logging set-up: one ``dictConfig`` for the process, text for people, JSON for containers.

Every line is made safe here, at the formatter, whatever the call site wrote: the rendered
message is cut (each string argument at 512 characters, the message at 4,096, as is each
exception's own text in a traceback), then its passwords are masked
(:func:`bulk_recorder.masking.masked`); in the text format its control characters are escaped
(CR, LF and the other C0 and C1 characters, U+2028 and U+2029: ``\\n``, ``\\x1b``,
``\\u2028``), in the message and in an exception's text, so that a value from outside (a header,
a path, a message property, a body's field) cannot start a line of its own. The JSON format is
one line by ``json.dumps``; the C1 characters and the two Unicode separators, which it leaves as
they are, are written as ``\\u`` escapes there too. Cut first, then scanned once: a line costs
the same whatever a caller sent.
"""

from __future__ import annotations

import json
import logging
import logging.config
import re
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from bulk_recorder.infra.tracing import current_ids
from bulk_recorder.masking import masked

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
# What str.splitlines breaks on, and every other C0/C1 control character.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_JSON_RAW = re.compile("[\x7f-\x9f\u2028\u2029]")  # json.dumps(ensure_ascii=False) keeps these
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

# A value from outside is cut at MAX_ARG_CHARS (a 60 KB path logged with each refusal) and a
# message at MAX_MESSAGE_CHARS, so that no request or message writes more than a short line.
MAX_ARG_CHARS = 512
MAX_MESSAGE_CHARS = 4096

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


def escaped(text: str) -> str:
    """``text`` on one line: each control character written as its Python escape."""
    return _CONTROL.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def cut(text: str, limit: int) -> str:
    """``text``, or at most its first ``limit`` characters and how many more there were. The
    cut falls at the end of a word when one ends in the second half (a URL is not split)."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    boundary = max(head.rfind(char) for char in " \t\n'\"")
    if boundary >= limit // 2:
        head = head[:boundary]
    return f"{head}... ({len(text) - len(head)} more characters)"


def rendered(record: logging.LogRecord) -> str:
    """The record's message, each long string argument cut, the whole cut, passwords masked
    (cut first: what is masked and escaped is a bounded text)."""
    args = record.args
    if isinstance(args, tuple) and any(isinstance(a, str) and len(a) > MAX_ARG_CHARS for a in args):
        short = tuple(cut(a, MAX_ARG_CHARS) if isinstance(a, str) else a for a in args)
        message = str(record.msg) % short
    else:
        message = record.getMessage()
    return masked(cut(message, MAX_MESSAGE_CHARS))


def _chain(exc: BaseException | None) -> list[BaseException]:
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return seen


def safe_traceback(text: str, exc: BaseException | None) -> str:
    """A formatted traceback with each exception's own text (which may carry a value from
    outside) cut and escaped: the traceback keeps its lines, a message cannot add one."""
    for each in _chain(exc):
        try:
            raw = str(each)
        except Exception:  # a broken __str__: the traceback says so itself
            continue
        shown = escaped(cut(raw, MAX_MESSAGE_CHARS))
        if raw and shown != raw:
            text = text.replace(raw, shown)
    return masked(text)


class SafeFormatter(logging.Formatter):
    """The text format: the message cut, masked and escaped, the traceback's messages escaped."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escaped(rendered(record))
        return super().formatMessage(record)

    def formatException(self, ei: _ExcInfo) -> str:
        return safe_traceback(super().formatException(ei), ei[1])


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, message, the traceback if any, and the
    ``trace_id`` and ``span_id`` (hex) of the span it was written in, when tracing is on."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": rendered(record),
        }
        ids = current_ids()
        if ids is not None:
            payload["trace_id"], payload["span_id"] = ids
        if record.exc_info:
            payload["exc_info"] = safe_traceback(
                self.formatException(record.exc_info), record.exc_info[1]
            )
        line = json.dumps(payload, ensure_ascii=False)
        return _JSON_RAW.sub(lambda m: f"\\u{ord(m[0]):04x}", line)


def setup_logging(level: str = "INFO", fmt: str = "text") -> None:
    formatter = (
        {"()": JsonFormatter} if fmt == "json" else {"()": SafeFormatter, "fmt": TEXT_FORMAT}
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
                # OpenTelemetry's TraceState logs each member it refuses, whole, at WARNING:
                # a caller's header would write what it likes, as often as it likes.
                "opentelemetry.trace.span": {"level": "ERROR"},
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
