"""Every log line is made safe at the formatter, whatever the call site wrote: passwords masked,
and a value from outside cannot start a line of its own (text: control characters escaped;
JSON: one object a line, U+2028, U+2029 and C1 characters escaped too)."""

from __future__ import annotations

import json
import logging
import sys
import time

import pytest

from bulk_recorder.infra.logs import TEXT_FORMAT, JsonFormatter, SafeFormatter, escaped

BREAKS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def _record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    return logging.LogRecord(
        "consumer.app", logging.INFO, __file__, 1, msg, args, sys.exc_info() if exc else None
    )


@pytest.mark.parametrize("brk", BREAKS)
def test_a_text_line_stays_one_line_whatever_the_break(brk: str) -> None:
    record = _record("dead-lettering an invalid message: %s", f"type{brk}FORGED LINE: x")
    line = SafeFormatter(TEXT_FORMAT).format(record)
    assert line.splitlines() == [line]
    assert "FORGED LINE: x" in line


def test_other_control_characters_are_escaped_visibly() -> None:
    assert escaped("a\x00b\x1b[31mc\x7fd\x9be\tf") == "a\\x00b\\x1b[31mc\\x7fd\\x9be\\tf"
    assert escaped("caf\u00e9 \u20ac") == "caf\u00e9 \u20ac"  # text is left alone


def test_the_message_template_is_escaped_too() -> None:
    line = SafeFormatter(TEXT_FORMAT).format(_record("a value\nFORGED LINE: x"))
    assert line.splitlines() == [line]


def test_an_exceptions_message_cannot_add_a_line_to_the_traceback() -> None:
    try:
        raise ValueError("bad value\nFORGED LINE: x")
    except ValueError:
        record = _record("failed", exc=True)
    text = SafeFormatter(TEXT_FORMAT).format(record)
    assert not [line for line in text.splitlines() if line.startswith("FORGED")], text
    assert text.splitlines()[-1] == "ValueError: bad value\\nFORGED LINE: x"


@pytest.mark.parametrize("brk", BREAKS)
def test_a_json_line_is_one_object_whatever_the_break(brk: str) -> None:
    try:
        raise ValueError(f"bad{brk}FORGED")
    except ValueError:
        record = _record("value %s", f"type{brk}FORGED LINE: x", exc=True)
    line = JsonFormatter().format(record)
    assert line.splitlines() == [line]
    payload = json.loads(line)
    assert payload["message"] == f"value type{brk}FORGED LINE: x"  # the value, as it was


def test_both_formats_mask_what_a_call_site_forgot() -> None:
    record = _record("connecting to %s", "amqp://a:s3cr3t@h/?password=s3cr3t")
    assert "s3cr3t" not in SafeFormatter(TEXT_FORMAT).format(record)
    assert "s3cr3t" not in JsonFormatter().format(record)


def test_a_long_value_from_outside_is_cut_in_both_formats() -> None:
    record = _record("API request refused: GET %s from %s", "/v1/" + "x" * 60_000, "127.0.0.1")
    for line in (SafeFormatter(TEXT_FORMAT).format(record), JsonFormatter().format(record)):
        assert len(line) < 1_000
        assert "more characters" in line
        assert "from 127.0.0.1" in line  # the rest of the message is kept
    assert len(SafeFormatter(TEXT_FORMAT).format(_record("x" * 60_000))) < 4_200


@pytest.mark.parametrize(
    "hostile", ["a," * 30_000, "k=v," * 15_000, "a:b," * 15_000, "a" * 60_000, "a://" * 15_000]
)
@pytest.mark.exclusive(reason="times a format against 1 s")
def test_a_60_kb_value_is_formatted_in_linear_time(hostile: str) -> None:
    """Masking and escaping scan a line once: with a pattern that rescans from every comma, a
    60 KB exception message (not cut: it is no string argument) took 43 s to log."""
    try:
        raise ValueError(hostile)
    except ValueError as exc:
        record = _record("failed: %s", exc, exc=True)
    started = time.perf_counter()
    SafeFormatter(TEXT_FORMAT).format(record)
    JsonFormatter().format(record)
    assert time.perf_counter() - started < 1.0
