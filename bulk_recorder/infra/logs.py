"""Logging set-up: one ``dictConfig`` for the process, text for people, JSON for containers.

Every line is made safe here, at the formatter, whatever the call site wrote: passwords are
masked (:func:`bulk_recorder.masking.masked`), then what is left is cut (each string argument
at 512 characters, the message at 4,096, as is each exception's own text and note in a
traceback): masked first, a cut never keeps the start of a password. In the text format control
characters are escaped (CR, LF and the other C0 and C1 characters, U+2028 and U+2029: ``\\n``,
``\\x1b``, ``\\u2028``), in the message and in every exception's text and notes, through a
chain and into an exception group, so that a value from outside (a header, a path, a message
property, a body's field) cannot start a line of its own. The JSON format is one line by
``json.dumps``; the C1 characters and the two Unicode separators, which it leaves as they are,
are written as ``\\u`` escapes there too. Masking reads at most ``MASK_READS`` times what the cut
keeps: a line costs about the same whatever a caller sent.
"""

from __future__ import annotations

import json
import logging
import logging.config
import re
import traceback
from collections.abc import Sequence
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
# Masking, which comes before the cut, reads at most this many times what the cut keeps.
MASK_READS = 4

_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]
_LAST_SPACE = re.compile(r"\s\S*\Z")
_SECRET_MARK = re.compile("[:=@]")


def escaped(text: str) -> str:
    """``text`` on one line: each control character written as its Python escape."""
    return _CONTROL.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    char = match[0]
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str, limit: int) -> str:
    """``text`` with its passwords masked, then cut at ``limit`` characters (:func:`cut`).
    Masking reads at most ``MASK_READS * limit`` of them (:func:`_bounded`)."""
    kept = _bounded(text, MASK_READS * limit)
    return cut(masked(kept), limit, len(text) - len(kept))


def _bounded(text: str, bound: int) -> str:
    """``text`` cut at ``bound`` for masking, less what masking could not tell from a password
    there, for want of its end: a URL's password may run to the end of its line, so the last
    line loses all from its first URL's ``://``; then the last word loses all from its first
    ``:``, ``=`` or ``@`` (a ``user:pass@host`` or a ``password=``)."""
    if len(text) <= bound:
        return text
    kept = text[:bound]
    url = kept.find("://", max(kept.rfind("\n"), kept.rfind("\r")) + 1)
    if url >= 0:
        kept = kept[:url]
    space = _LAST_SPACE.search(kept)
    mark = _SECRET_MARK.search(kept, space.start() + 1 if space else 0)
    return kept[: mark.start()] if mark else kept


def cut(text: str, limit: int, more: int = 0) -> str:
    """``text``, or at most its first ``limit`` characters and how many more there were (``more``
    of them left out already). The cut falls at the end of a word when one ends in the second
    half (a URL is not split)."""
    if len(text) <= limit and not more:
        return text
    head = text[:limit]
    if len(text) > limit:
        boundary = max(head.rfind(char) for char in " \t\n'\"")
        if boundary >= limit // 2:
            head = head[:boundary]
    return f"{head}... ({len(text) - len(head) + more} more characters)"


def rendered(record: logging.LogRecord) -> str:
    """The record's message, passwords masked, then cut: each long string argument, then the
    whole."""
    args = record.args
    if isinstance(args, tuple) and any(isinstance(a, str) and len(a) > MAX_ARG_CHARS for a in args):
        short = tuple(shown(a, MAX_ARG_CHARS) if isinstance(a, str) else a for a in args)
        message = str(record.msg) % short
    else:
        message = record.getMessage()
    return shown(message, MAX_MESSAGE_CHARS)


def safe_traceback(ei: _ExcInfo) -> str:
    """The traceback of ``ei`` as logging writes it, each exception's own text and notes (which
    may carry a value from outside) masked, cut and escaped: the traceback keeps its lines, a
    message cannot add one. Then the whole is masked: a source line may quote a password."""
    _, value, tb = ei
    if value is None:  # logging.exception() outside an except block
        return "NoneType: None"
    summary = traceback.TracebackException(type(value), value, tb, compact=True)
    for each in _chain(summary):
        # The exception's text as TracebackException keeps it for format(); no public name.
        each._str = _one_line(each._str)  # type: ignore[attr-defined]
        if isinstance(each.__notes__, Sequence):
            each.__notes__ = [_one_line(note) for note in each.__notes__]
    return masked("".join(summary.format()).removesuffix("\n"))


def _chain(summary: traceback.TracebackException) -> list[traceback.TracebackException]:
    """``summary`` and every exception it prints: its cause or context, a group's exceptions."""
    found: dict[int, traceback.TracebackException] = {}
    pending = [summary]
    while pending:
        each = pending.pop()
        if id(each) in found:
            continue
        found[id(each)] = each
        pending.extend(each.exceptions or ())
        pending.extend(e for e in (each.__cause__, each.__context__) if e is not None)
    return list(found.values())


def _one_line(value: object) -> str:
    try:
        text = str(value)
    except Exception:  # a broken __str__: say so, as the traceback itself would
        return "<str() failed>"
    return escaped(shown(text, MAX_MESSAGE_CHARS))


class SafeFormatter(logging.Formatter):
    """The text format: the message masked, cut and escaped, so are a traceback's messages."""

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info:  # not another formatter's traceback, kept on the record: ours
            record.exc_text = None
        return super().format(record)

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escaped(rendered(record))
        return super().formatMessage(record)

    def formatException(self, ei: _ExcInfo) -> str:
        return safe_traceback(ei)

    def formatStack(self, stack_info: str) -> str:
        return masked(stack_info)


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
            payload["exc_info"] = safe_traceback(record.exc_info)
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
