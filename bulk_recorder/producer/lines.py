"""What a job-upload line parser is: the items it yields, the error that refuses a whole body,
and the small pieces every format shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Protocol

import msgspec

from bulk_recorder.exceptions import BulkRecorderError

__all__ = ["BOM", "ENCODE_JSON", "FormatError", "Item", "LineParser", "too_long", "utf8_size"]

# One parsed line: (line number, message body to validate) or (line number, reason rejected).
Item = tuple[int, bytes | str]

BOM: Final = "\ufeff"
WHITESPACE: Final = " \t\r\n"  # JSON's, and what a blank CSV line may hold
# Compact JSON, UTF-8 as is (the same bytes the stdlib's compact, ensure_ascii=False form gave),
# ten times faster.
ENCODE_JSON: Final[Callable[[Any], bytes]] = msgspec.json.Encoder().encode


class FormatError(BulkRecorderError, ValueError):
    """The body cannot be split into lines; the whole request is refused (400)."""


class LineParser(Protocol):
    @property
    def lines(self) -> int:
        """Lines seen so far that count toward the job's line limit (blank ones included)."""
        ...

    def feed(self, chunk: bytes) -> list[Item]: ...

    def finish(self) -> list[Item]: ...


def too_long(limit: int) -> str:
    return f"line longer than {limit} bytes"


def utf8_size(text: str) -> int:
    """The bytes ``text`` takes in UTF-8, what the line limits count (an ASCII text's length,
    known without encoding it)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
