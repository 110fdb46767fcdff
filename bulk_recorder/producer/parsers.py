"""Line parsers for job uploads: NDJSON, JSON array and CSV, fed chunk by chunk.

Each keeps at most one unfinished line (bounded by the per-message limit) and yields
``(line number, body)`` for a line to validate or ``(line number, reason)`` for one already
rejected; a body that cannot be split into lines at all raises :class:`FormatError`.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Final

from bulk_recorder.producer.csv_lines import CSV_COLUMNS, CsvParser
from bulk_recorder.producer.lines import (
    BOM,
    ENCODE_JSON,
    FormatError,
    Item,
    LineParser,
    too_long,
)
from bulk_recorder.records import MAX_DEPTH

__all__ = [
    "CONTENT_TYPES",
    "CSV_COLUMNS",
    "ENCODE_JSON",
    "CsvParser",
    "FormatError",
    "Item",
    "JsonArrayParser",
    "LineParser",
    "NdjsonParser",
    "parser_for",
]

# media type -> format
CONTENT_TYPES: Final = {
    "application/json": "json",
    "application/x-ndjson": "ndjson",
    "application/ndjson": "ndjson",
    "application/jsonl": "ndjson",
    "application/x-jsonlines": "ndjson",
    "text/csv": "csv",
}

_WHITESPACE_RUN: Final = re.compile(r"[ \t\r\n]+").match


def _discard(pairs: object) -> None:
    return None


# Finds where an array element ends; decode() judges it. msgspec reads a whole document only,
# so the stdlib scanner does the splitting, told to build nothing: numbers stay text (an
# integer over the interpreter's digit limit is decode's "invalid JSON" for that line, not a
# ValueError for the request) and objects are dropped as read.
_RAW_DECODE: Final = json.JSONDecoder(
    parse_int=str, parse_float=str, parse_constant=str, object_pairs_hook=_discard
).raw_decode


def parser_for(fmt: str, max_line_bytes: int) -> LineParser:
    if fmt == "ndjson":
        return NdjsonParser(max_line_bytes)
    if fmt == "csv":
        return CsvParser(max_line_bytes)
    if fmt == "json":
        return JsonArrayParser(max_line_bytes)
    raise ValueError(f"unknown format {fmt!r}")


def _skip_whitespace(text: str, pos: int) -> int:
    """The first position at or after ``pos`` that is not JSON whitespace (at C speed)."""
    run = _WHITESPACE_RUN(text, pos)
    return run.end() if run else pos


class NdjsonParser:
    """One JSON object per line; blank lines are skipped, but numbered and counted."""

    def __init__(self, max_line_bytes: int) -> None:
        self._limit = max_line_bytes
        self._tail = b""
        self._line = 0
        self._skipping = False  # inside a line already known to be too long
        self._first = True

    @property
    def lines(self) -> int:
        return self._line

    def feed(self, chunk: bytes) -> list[Item]:
        if self._first and chunk:
            chunk = self._tail + chunk
            self._tail = b""
            if len(chunk) < len(codecs.BOM_UTF8) and codecs.BOM_UTF8.startswith(chunk):
                self._tail = chunk  # a BOM cut by the chunk boundary: wait for its rest
                return []
            self._first = False
            chunk = chunk.removeprefix(codecs.BOM_UTF8)
        data = self._tail + chunk if self._tail else chunk
        lines = data.split(b"\n")
        tail = lines.pop()
        out: list[Item] = []
        for raw in lines:
            self._emit(raw, out)
        if self._skipping or len(tail) > self._limit:
            self._skipping = True
            self._tail = b""
        else:
            self._tail = tail
        return out

    def finish(self) -> list[Item]:
        out: list[Item] = []
        if self._tail or self._skipping:
            self._emit(self._tail, out)
        self._tail = b""
        return out

    def _emit(self, raw: bytes, out: list[Item]) -> None:
        self._line += 1
        if self._skipping:
            self._skipping = False
            out.append((self._line, too_long(self._limit)))
            return
        if not raw.strip():
            return
        if len(raw) > self._limit:
            out.append((self._line, too_long(self._limit)))
            return
        out.append((self._line, raw))


class JsonArrayParser:
    """A JSON array of objects, split into elements as it arrives."""

    def __init__(self, max_element_bytes: int) -> None:
        self._limit = max_element_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._text = ""
        self._state = "start"  # start, first, value, comma, done
        self._count = 0
        self._offset = 0  # characters consumed before self._text

    @property
    def lines(self) -> int:
        return self._count

    def feed(self, chunk: bytes) -> list[Item]:
        self._text += self._decode(chunk, final=False)
        return self._drain(final=False)

    def finish(self) -> list[Item]:
        self._text += self._decode(b"", final=True)
        out = self._drain(final=True)
        if self._state != "done":
            if self._state == "start":
                raise FormatError("empty body: expected a JSON array of objects")
            raise FormatError(
                f"unexpected end of body after element {self._count}: the JSON array is not closed"
            )
        return out

    def _decode(self, data: bytes, *, final: bool) -> str:
        try:
            text = self._decoder.decode(data, final)
        except UnicodeDecodeError as exc:
            raise FormatError(f"body is not valid UTF-8 ({exc.reason})") from None
        if self._state == "start" and not self._text:
            text = text.removeprefix(BOM)
        return text

    def _drain(self, *, final: bool) -> list[Item]:
        text, pos, end_of_text = self._text, 0, len(self._text)
        out: list[Item] = []
        while True:
            pos = _skip_whitespace(text, pos)
            if pos == end_of_text:
                break
            state = self._state
            char = text[pos]
            if state == "start":
                if char != "[":
                    raise FormatError(
                        "a JSON body must be an array of objects; send one object per line as "
                        "application/x-ndjson"
                    )
                pos += 1
                self._state = "first"
            elif state in ("first", "value"):
                if state == "first" and char == "]":
                    pos += 1
                    self._state = "done"
                    continue
                end = self._element_end(text, pos, final=final)
                if end is None:
                    break  # cut by the chunk boundary, or a number that may go on: wait for more
                self._count += 1
                element = text[pos:end].encode("utf-8", "surrogatepass")
                if len(element) > self._limit:
                    out.append((self._count, too_long(self._limit)))
                else:
                    out.append((self._count, element))
                pos = end
                self._state = "comma"
            elif state == "comma":
                if char == ",":
                    self._state = "value"
                elif char == "]":
                    self._state = "done"
                else:
                    raise FormatError(f"after element {self._count}: expected ',' or ']'")
                pos += 1
            else:
                raise FormatError("unexpected data after the closing ']'")
        self._text = text[pos:]
        return out

    def _element_end(self, text: str, pos: int, *, final: bool) -> int | None:
        """Where the element at ``pos`` ends; None if it may go on in the next chunk."""
        try:
            _, end = _RAW_DECODE(text, pos)
        except RecursionError:  # nested far past MAX_DEPTH: no end to be found
            raise FormatError(
                f"element {self._count + 1}: JSON nesting deeper than {MAX_DEPTH} levels"
            ) from None
        except json.JSONDecodeError as exc:
            if not final and len(text) - pos <= self._limit:
                return None
            if final and exc.pos >= len(text):
                raise FormatError(
                    f"unexpected end of body in element {self._count + 1}: the JSON "
                    "array is not closed"
                ) from None
            raise FormatError(
                f"element {self._count + 1}: invalid JSON ({exc.msg}) or larger than "
                f"{self._limit} bytes"
            ) from None
        return None if end == len(text) and not final else end
