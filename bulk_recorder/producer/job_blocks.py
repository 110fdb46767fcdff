"""A job's lines validated a block at a time, off the event loop: what a worker process runs,
and how the API merges its answers in line order.

The parser (:mod:`bulk_recorder.producer.parsers`) stays on the event loop: it splits the body
into numbered lines, counts them toward the line limit and refuses a body that cannot be split,
exactly as for :class:`bulk_recorder.producer.ingest.JobIntake`. What costs (``decode`` and the
canonical message body, ~12 us a line) runs in :func:`validate_block`, a pure function of its
arguments: on a worker process of :class:`bulk_recorder.producer.job_workers.JobWorkers`, or
on the loop itself when no worker can take it. A block travels as a few flat buffers (line
numbers, lengths, the lines joined) and comes back as the rows already in PostgreSQL's binary
COPY format, so the loop copies bytes instead of building and encoding a tuple a line.

:class:`BlockIntake` applies the blocks' answers in order: an annotation id that repeats a line
of an earlier block is rejected there (``id: repeats line N``, as ``JobIntake`` says it), the
counts and the first ``max_rejections`` rejections, in line order, are the job's, and the rows
go to the staging COPY. Same lines in, same job out as ``JobIntake``
(``tests/unit/test_job_blocks.py`` compares them).
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from bulk_recorder.producer.ingest import TooManyLines, annotation_body
from bulk_recorder.producer.lines import Item, LineParser
from bulk_recorder.records import CreditAnnotation, RecordError, decode

__all__ = ["COPY_HEADER", "COPY_TRAILER", "Block", "BlockIntake", "Validated", "validate_block"]

# PostgreSQL's binary COPY: signature, flags, header extension length; a tuple is its field
# count and each field's length and bytes; -1 ends the data.
COPY_HEADER: Final = b"PGCOPY\n\xff\r\n\x00" + struct.pack(">ii", 0, 0)
COPY_TRAILER: Final = struct.pack(">h", -1)
_TUPLE_HEAD: Final = struct.Struct(">hi16si").pack  # 2 fields; record_id (uuid); body's length
_INT64: Final = "q"


class Block(NamedTuple):
    """Lines to validate: ``numbers`` and ``lengths`` are ``array('q')`` bytes, ``payload`` the
    lines joined; ``reasons`` are lines the parser already rejected."""

    numbers: bytes
    lengths: bytes
    payload: bytes
    reasons: list[tuple[int, str]]

    @classmethod
    def of(cls, items: list[Item]) -> Block:
        numbers, lengths, lines = array(_INT64), array(_INT64), []
        reasons: list[tuple[int, str]] = []
        for number, payload in items:
            if isinstance(payload, str):
                reasons.append((number, payload))
            else:
                numbers.append(number)
                lengths.append(len(payload))
                lines.append(payload)
        return cls(numbers.tobytes(), lengths.tobytes(), b"".join(lines), reasons)


class Validated(NamedTuple):
    """A block's answer: its accepted lines' ids (16 bytes each), numbers and COPY tuple
    sizes (``array('q')`` bytes), the tuples themselves, and its rejections in line order."""

    ids: bytes
    numbers: bytes
    sizes: bytes
    rows: bytes
    rejections: list[tuple[int, str]]


def validate_block(job_id: str, max_body_bytes: int, block: Block) -> Validated:
    """Validate a block's lines as ``JobIntake`` does, but for repeated ids: those are
    :class:`BlockIntake`'s, which sees every block."""
    numbers, lengths = array(_INT64), array(_INT64)
    numbers.frombytes(block.numbers)
    lengths.frombytes(block.lengths)
    payload = block.payload
    rejections = list(block.reasons)
    ids: list[bytes] = []
    accepted, sizes, rows = array(_INT64), array(_INT64), []
    at = 0
    for number, length in zip(numbers, lengths, strict=True):
        line = payload[at : at + length]
        at += length
        try:
            record = decode(line, "credit_annotation", max_bytes=max_body_bytes)
        except RecordError as exc:
            rejections.append((number, exc.reason))
            continue
        assert isinstance(record, CreditAnnotation)
        raw_id = bytes.fromhex(record.id.replace("-", ""))
        body = annotation_body(record, job_id)
        row = _TUPLE_HEAD(2, 16, raw_id, len(body)) + body
        ids.append(raw_id)
        accepted.append(number)
        sizes.append(len(row))
        rows.append(row)
    if block.reasons:
        rejections.sort()
    return Validated(b"".join(ids), accepted.tobytes(), sizes.tobytes(), b"".join(rows), rejections)


@dataclass(slots=True)
class BlockIntake:
    """A job's parser on the loop, and the blocks' answers merged in order: the counts, the
    first ``max_rejections`` rejections and the staged rows, as ``JobIntake`` keeps them."""

    parser: LineParser
    max_lines: int
    max_rejections: int = 1000
    accepted: int = 0
    rejected: int = 0
    rejections: list[tuple[int, str]] = field(default_factory=list)
    rows: list[bytes] = field(default_factory=list)  # binary COPY tuples, joined per block
    pending_rows: int = 0
    _seen: dict[bytes, int] = field(default_factory=dict)

    @property
    def rejections_truncated(self) -> bool:
        return self.rejected > len(self.rejections)

    def feed(self, chunk: bytes) -> Block | None:
        return self._block(self.parser.feed(chunk))

    def finish(self) -> Block | None:
        return self._block(self.parser.finish())

    def _block(self, items: list[Item]) -> Block | None:
        if self.parser.lines > self.max_lines:  # every line counts, checked before validation
            raise TooManyLines(f"a job has at most {self.max_lines} lines")
        return Block.of(items) if items else None

    def apply(self, answer: Validated) -> None:
        """Take a block's answer (blocks in line order)."""
        raw = answer.ids
        ids = [raw[at : at + 16] for at in range(0, len(raw), 16)]
        numbers = array(_INT64)
        numbers.frombytes(answer.numbers)
        rejections = answer.rejections
        if self._seen.keys().isdisjoint(ids) and len(set(ids)) == len(ids):
            self._seen.update(zip(ids, numbers, strict=True))
            self.rows.append(answer.rows)
            kept = len(ids)
        else:
            kept, rejections = self._repeats(answer, ids, numbers)
        self.accepted += kept
        self.pending_rows += kept
        self.rejected += len(rejections)
        room = self.max_rejections - len(self.rejections)
        if room > 0:
            self.rejections.extend(rejections[:room])

    def _repeats(
        self, answer: Validated, ids: list[bytes], numbers: array[int]
    ) -> tuple[int, list[tuple[int, str]]]:
        """The slow path: some ids repeat earlier lines; drop those rows."""
        sizes = array(_INT64)
        sizes.frombytes(answer.sizes)
        rejections = list(answer.rejections)
        rows, at, kept = [], 0, 0
        for raw_id, number, size in zip(ids, numbers, sizes, strict=True):
            first = self._seen.setdefault(raw_id, number)
            if first != number:
                rejections.append((number, f"id: repeats line {first}"))
            else:
                rows.append(answer.rows[at : at + size])
                kept += 1
            at += size
        rejections.sort()
        self.rows.append(b"".join(rows))
        return kept, rejections

    def take_rows(self) -> bytes:
        """The binary COPY data of the rows applied since the last call."""
        data = b"".join((COPY_HEADER, *self.rows, COPY_TRAILER))
        self.rows, self.pending_rows = [], 0
        return data
