"""A traceback in the log, text or JSON, is made safe like the message: each exception's own text
and notes, through the whole chain (``raise ... from``, an exception raised while handling
another) and into an exception group, are masked, cut and escaped, and then the whole traceback
is masked (a source line may quote a password); so is a stack (``stack_info``)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable

import pytest

from bulk_recorder.infra.logs import (
    MAX_MESSAGE_CHARS,
    TEXT_FORMAT,
    JsonFormatter,
    SafeFormatter,
    escaped,
)

FORGED = "\nFORGED LINE: level=ERROR all is lost"
FORGED_SHOWN = escaped(FORGED)
SECRET = "s3cr3t"


def _plain(exc: BaseException) -> None:
    raise exc


def _implicit(exc: BaseException) -> None:
    """``exc`` as the ``__context__`` of the exception logged."""
    try:
        raise exc
    except BaseException:
        raise RuntimeError("failed while handling it")  # noqa: B904


def _explicit(exc: BaseException) -> None:
    """``exc`` as the ``__cause__`` of the exception logged, and not its ``__context__``."""
    try:
        raise exc
    except BaseException as caught:
        first = caught
    raise RuntimeError("failed because of it") from first


def _grouped(exc: BaseException) -> None:
    """``exc`` inside an exception group inside another."""
    raise BaseExceptionGroup("many", [KeyError("k"), BaseExceptionGroup("inner", [exc])])


def _noted(exc: BaseException) -> None:
    """``exc``'s text as a note on another exception."""
    other = ValueError("bad value")
    other.add_note(str(exc))
    raise other


SHAPES: dict[str, Callable[[BaseException], None]] = {
    "plain": _plain,
    "implicit chain": _implicit,
    "explicit chain": _explicit,
    "group": _grouped,
    "note": _noted,
}


def _logged(shape: Callable[[BaseException], None], exc: BaseException) -> logging.LogRecord:
    try:
        shape(exc)
    except BaseException:
        return logging.LogRecord(
            "consumer.app", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    raise AssertionError("nothing raised")


def _tracebacks(record: logging.LogRecord) -> list[str]:
    """The traceback as each format writes it: the text entry, the JSON line's ``exc_info``."""
    text = SafeFormatter(TEXT_FORMAT).format(record)
    line = JsonFormatter().format(record)
    assert line.splitlines() == [line]
    return [text, json.loads(line)["exc_info"]]


def _forged(traceback: str) -> list[str]:
    """The traceback's lines that the exception's text started."""
    return [line for line in traceback.splitlines() if FORGED[1:] in line.replace(FORGED_SHOWN, "")]


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_no_exception_text_adds_a_line_to_a_traceback(shape: str) -> None:
    record = _logged(SHAPES[shape], ValueError("bad value" + FORGED))
    for traceback in _tracebacks(record):
        assert FORGED_SHOWN in traceback
        assert not _forged(traceback), traceback


def test_an_implicitly_chained_traceback_is_escaped_in_text() -> None:
    """The reported case: a ValueError, then a RuntimeError raised while handling it."""
    try:
        try:
            raise ValueError("bad" + FORGED)
        except ValueError:
            raise RuntimeError("second")  # noqa: B904
    except RuntimeError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    text = SafeFormatter(TEXT_FORMAT).format(record)
    assert not [line for line in text.splitlines() if line.startswith("FORGED LINE:")], text
    assert "ValueError: bad\\nFORGED LINE: level=ERROR all is lost" in text.splitlines()


def test_an_exception_groups_own_text_adds_no_line() -> None:
    record = _logged(_plain, ExceptionGroup("many" + FORGED, [KeyError("k")]))
    for traceback in _tracebacks(record):
        assert not _forged(traceback), traceback


def _reach_the_database() -> None:
    raise ConnectionError("cannot reach postgresql://app:s3cr3t@db:5432/ledger")


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_password_in_an_exceptions_text_is_masked(shape: str) -> None:
    """In its text (and here in the source line that raised it too)."""
    try:
        _reach_the_database()
    except ConnectionError as exc:
        record = _logged(SHAPES[shape], exc)
    for traceback in _tracebacks(record):
        assert SECRET not in traceback, traceback
        assert "postgresql://app:***@db:5432/ledger" in traceback


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_password_in_an_exceptions_text_alone_is_masked(shape: str) -> None:
    """The URL built at run time: it is in no source line, only in the exception's text."""
    url = "postgresql://app:" + "".join(reversed("t3rc3s")) + "@db:5432/ledger"
    record = _logged(SHAPES[shape], ConnectionError(f"cannot reach {url}"))
    for traceback in _tracebacks(record):
        assert SECRET not in traceback, traceback


def test_a_password_in_a_source_line_is_masked() -> None:
    try:
        _reach_the_database()
    except ConnectionError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    for traceback in _tracebacks(record):
        assert 'raise ConnectionError("cannot reach postgresql://app:***@db' in traceback


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_long_exception_text_is_masked_before_it_is_cut(shape: str) -> None:
    """The cut of an exception's text (4,096) falling in a password: none of it is shown."""
    url = "amqp://app:" + "Z" * 16 + "@rabbit.example:5672/vx"
    for before in range(MAX_MESSAGE_CHARS - len(url) - 2, MAX_MESSAGE_CHARS + 2, 3):
        record = _logged(SHAPES[shape], ValueError("n" * before + "," + url))
        for traceback in _tracebacks(record):
            assert "Z" not in traceback, (before, traceback[-300:])


def test_a_traceback_another_formatter_wrote_first_is_made_safe_again() -> None:
    """``logging.Formatter.format`` keeps the traceback it wrote on the record (``exc_text``) and
    every later formatter reuses it: another handler's formatter may write it first."""
    try:
        _implicit(ConnectionError("postgresql://app:s3cr3t@db/x" + FORGED))
    except RuntimeError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert SECRET in logging.Formatter().format(record)
    text = SafeFormatter(TEXT_FORMAT).format(record)
    assert SECRET not in text
    assert not _forged(text), text


def test_a_stack_is_masked_in_text() -> None:
    """``stack_info=True``: the stack's source lines may quote a password (JSON omits it)."""
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "connecting", (), None)
    record.stack_info = (
        "Stack (most recent call last):\n"
        '  File "/srv/app.py", line 3, in <module>\n'
        '    connect("postgresql://app:s3cr3t@db:5432/ledger")'
    )
    text = SafeFormatter(TEXT_FORMAT).format(record)
    assert SECRET not in text
    assert 'connect("postgresql://app:***@db:5432/ledger")' in text


def test_logging_an_exception_outside_an_except_block_still_writes_a_line() -> None:
    record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), (None, None, None))
    for traceback in _tracebacks(record):
        assert traceback.endswith("NoneType: None")
