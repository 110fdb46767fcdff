"""Streaming intake of a credit-annotation job: request chunks in, outbox rows out.

A job arrives as a JSON array of objects, as NDJSON (one object a line) or as CSV with a header
row. Parsers take the body chunk by chunk and keep at most one unfinished line (bounded by the
per-message limit), so a 300,000-line job is never held whole: each finished line is validated
at once with :func:`bulk_recorder.records.decode` -- the very function the recorder runs -- and
becomes an outbox row whose body is the canonical message of docs/messages.md.

Line numbers are 1-based: the physical line for NDJSON, the line where the record starts for CSV
(the header is line 1), and the element's position for a JSON array.

Every line counts toward a job's line limit, blank ones too (NDJSON and CSV physical lines, the
CSV header excepted; a JSON array's elements), and the limit is checked after every chunk, before
its lines are validated: blank filler cannot make a huge body look like a small job.

Two kinds of failure: a bad line is rejected with its number and reason and the job goes on; a
body that cannot be split into lines at all (a JSON array that does not parse, a CSV header with
an unknown column, invalid UTF-8 in CSV) raises
:class:`bulk_recorder.producer.parsers.FormatError` for the whole request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bulk_recorder.exceptions import BulkRecorderError
from bulk_recorder.producer.parsers import (
    ENCODE_JSON,
    Item,
    LineParser,
)
from bulk_recorder.records import CreditAnnotation, RecordError, decode

__all__ = ["JobIntake", "OutboxRow", "TooManyLines", "annotation_body"]


class TooManyLines(BulkRecorderError, ValueError):
    """The job has more lines than allowed (413)."""


def annotation_body(annotation: CreditAnnotation, job_id: str) -> bytes:
    """The canonical message body of an annotation, carrying ``job_id``."""
    return ENCODE_JSON(
        {
            "id": annotation.id,
            "job_id": job_id,
            "document": annotation.document,
            "kind": annotation.kind,
            "creditor": annotation.creditor,
            "amount": format(annotation.amount, "f"),
            "occurred_on": annotation.occurred_on.isoformat(),
            "reason": annotation.reason,
        }
    )


OutboxRow = tuple[str, str, str, bytes]  # record_type, record_id, job_id, body


@dataclass(slots=True)
class JobIntake:
    """Validates a job's lines as they arrive; collects outbox rows, counts and rejections.

    A line's own ``job_id``, if any, is replaced by the job's id (the job owns its lines). An
    annotation id that repeats an earlier line of the same job is rejected, so that a finished
    job has exactly ``accepted`` rows recorded under its id.
    """

    job_id: str
    parser: LineParser
    max_body_bytes: int
    max_lines: int
    max_rejections: int = 1000
    accepted: int = 0
    rejected: int = 0
    rejections: list[tuple[int, str]] = field(default_factory=list)
    rows: list[OutboxRow] = field(default_factory=list)
    _seen: dict[str, int] = field(default_factory=dict)

    @property
    def rejections_truncated(self) -> bool:
        return self.rejected > len(self.rejections)

    def feed(self, chunk: bytes) -> None:
        items = self.parser.feed(chunk)
        self._check_lines()
        self._take(items)

    def finish(self) -> None:
        items = self.parser.finish()
        self._check_lines()
        self._take(items)

    def take_rows(self) -> list[OutboxRow]:
        """The outbox rows collected since the last call (the caller COPYs them)."""
        rows, self.rows = self.rows, []
        return rows

    def _take(self, items: list[Item]) -> None:
        job_id, seen, rows = self.job_id, self._seen, self.rows
        for number, payload in items:
            if isinstance(payload, str):
                self._reject(number, payload)
                continue
            try:
                record = decode(payload, "credit_annotation", max_bytes=self.max_body_bytes)
            except RecordError as exc:
                self._reject(number, exc.reason)
                continue
            assert isinstance(record, CreditAnnotation)
            first = seen.setdefault(record.id, number)
            if first != number:
                self._reject(number, f"id: repeats line {first}")
                continue
            rows.append(("credit_annotation", record.id, job_id, annotation_body(record, job_id)))
            self.accepted += 1

    def _check_lines(self) -> None:
        """Every line counts, blank ones too; checked before the chunk's lines are validated."""
        if self.parser.lines > self.max_lines:
            raise TooManyLines(f"a job has at most {self.max_lines} lines")

    def _reject(self, number: int, reason: str) -> None:
        self.rejected += 1
        if len(self.rejections) < self.max_rejections:
            self.rejections.append((number, reason))
