"""CSV job uploads (RFC 4180): a header row naming columns among :data:`CSV_COLUMNS`, then one
record per line (a quoted field may span lines), each turned into the JSON body of a message."""

from __future__ import annotations

import codecs
import csv
from typing import Any, Final

from bulk_recorder.producer.lines import (
    BOM,
    ENCODE_JSON,
    WHITESPACE,
    FormatError,
    Item,
    too_long,
    utf8_size,
)

__all__ = ["CSV_COLUMNS", "CsvParser"]

CSV_COLUMNS: Final = (
    "id",
    "job_id",
    "document",
    "kind",
    "creditor",
    "amount",
    "occurred_on",
    "reason",
)
_CSV_REQUIRED: Final = frozenset({"id", "document", "kind", "creditor", "amount", "occurred_on"})
_CSV_OPTIONAL: Final = frozenset({"job_id", "reason"})


class CsvParser:
    """CSV (RFC 4180) with a header row naming columns among :data:`CSV_COLUMNS`."""

    def __init__(self, max_line_bytes: int) -> None:
        self._limit = max_line_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._tail = ""
        self._pending: list[str] = []  # physical lines of a record with an open quoted field
        self._pending_quotes = 0
        self._pending_size = 0
        self._line = 0
        self._record_line = 0
        self._header: list[str] | None = None
        self._first = True

    @property
    def lines(self) -> int:
        return self._line - (1 if self._header is not None else 0)

    def feed(self, chunk: bytes) -> list[Item]:
        try:
            text = self._decoder.decode(chunk, False)
        except UnicodeDecodeError as exc:
            raise FormatError(f"body is not valid UTF-8 near line {self._line + 1}") from exc
        if self._first and text:
            self._first = False
            text = text.removeprefix(BOM)
        data = self._tail + text if self._tail else text
        lines = data.split("\n")
        self._tail = lines.pop()
        if len(self._tail) > self._limit // 4 and utf8_size(self._tail) > self._limit:
            number = self._line + len(lines) + 1  # after the lines this chunk finished
            raise FormatError(f"line {number}: longer than {self._limit} bytes")
        return self._records(lines)

    def finish(self) -> list[Item]:
        try:
            self._tail += self._decoder.decode(b"", True)
        except UnicodeDecodeError as exc:
            raise FormatError(f"body is not valid UTF-8 near line {self._line + 1}") from exc
        lines = [self._tail] if self._tail else []
        self._tail = ""
        out = self._records(lines)
        if self._pending:
            raise FormatError(f"line {self._record_line}: a quoted field is never closed")
        if self._header is None:
            raise FormatError("empty body: expected a CSV header row and records")
        return out

    def _records(self, lines: list[str]) -> list[Item]:
        records: list[tuple[int, str]] = []
        for line in lines:
            self._line += 1
            if not self._pending:
                self._record_line = self._line
            quotes = line.count('"')
            if self._pending or quotes % 2:
                self._pending.append(line)
                self._pending_quotes += quotes
                self._pending_size += utf8_size(line) + 1
                if self._pending_quotes % 2:
                    if self._pending_size > self._limit:
                        raise FormatError(
                            f"line {self._record_line}: a quoted field is never closed, or the "
                            f"record is longer than {self._limit} bytes"
                        )
                    continue
                line = "\n".join(self._pending)
                self._pending, self._pending_quotes, self._pending_size = [], 0, 0
            if line.strip(WHITESPACE):
                records.append((self._record_line, line))
        out: list[Item] = []
        if not records:
            return out
        rows = csv.reader([text for _, text in records], strict=True)
        for (number, text), row in zip(records, _safe_rows(rows, len(records)), strict=True):
            if isinstance(row, str):
                out.append((number, f"invalid CSV: {row}"))
            elif self._header is None:
                self._header = _check_header(row)
            else:
                out.append((number, self._to_body(row, utf8_size(text))))
        return out

    def _to_body(self, row: list[str], size: int) -> bytes | str:
        header = self._header
        assert header is not None
        if size > self._limit:
            return too_long(self._limit)
        if len(row) != len(header):
            return f"expected {len(header)} fields, got {len(row)}"
        obj: dict[str, str] = {}
        for name, value in zip(header, row, strict=True):
            if value == "" and name in _CSV_OPTIONAL:
                continue
            obj[name] = value
        return ENCODE_JSON(obj)


def _safe_rows(rows: Any, count: int) -> list[list[str] | str]:
    """Every row of a csv.reader, a row that fails to parse as its error text."""
    out: list[list[str] | str] = []
    while len(out) < count:
        try:
            out.append(next(rows))
        except csv.Error as exc:
            out.append(str(exc))
        except StopIteration:  # pragma: no cover - one row per record by construction
            break
    return out


def _check_header(row: list[str]) -> list[str]:
    names = [name.strip().lower() for name in row]
    unknown = [name for name in names if name not in CSV_COLUMNS]
    if unknown:
        raise FormatError(
            f"CSV header: unknown column {unknown[0]!r}; columns are {', '.join(CSV_COLUMNS)}"
        )
    repeated = {name for name in names if names.count(name) > 1}
    if repeated:
        raise FormatError(f"CSV header: column {sorted(repeated)[0]!r} appears twice")
    missing = sorted(_CSV_REQUIRED.difference(names))
    if missing:
        raise FormatError(f"CSV header: missing column(s) {', '.join(missing)}")
    return names
