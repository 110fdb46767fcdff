"""The job workers' path (:mod:`bulk_recorder.producer.job_blocks`) against the loop's own
(:class:`~bulk_recorder.producer.ingest.JobIntake`): the same body, cut anywhere and handed over
in blocks of any size, gives the same counts, the same rejections in line order (repeated ids
across and inside blocks, the cap on listed rejections) and the same staged rows, here read
back from the binary COPY stream."""

from __future__ import annotations

import json
import struct
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bulk_recorder.producer.ingest import JobIntake, TooManyLines
from bulk_recorder.producer.job_blocks import (
    COPY_HEADER,
    COPY_TRAILER,
    BlockIntake,
    validate_block,
)
from bulk_recorder.producer.parsers import parser_for
from consumer.tools.generator import Generator

JOB = "0193a3c4-0000-7000-8000-0000000000ff"
LIMIT = 4096


def copy_rows(data: bytes) -> list[tuple[str, bytes]]:
    """(record_id, body) of each tuple of a binary COPY stream."""
    assert data.startswith(COPY_HEADER)
    assert data.endswith(COPY_TRAILER)
    at, end, rows = len(COPY_HEADER), len(data) - len(COPY_TRAILER), []
    while at < end:
        fields, id_len = struct.unpack_from(">hi", data, at)
        assert (fields, id_len) == (2, 16)
        record_id = str(uuid.UUID(bytes=data[at + 6 : at + 22]))
        (body_len,) = struct.unpack_from(">i", data, at + 22)
        rows.append((record_id, data[at + 26 : at + 26 + body_len]))
        at += 26 + body_len
    assert at == end
    return rows


def by_loop(fmt: str, chunks: list[bytes], max_rejections: int) -> tuple[Any, ...]:
    intake = JobIntake(
        JOB,
        parser_for(fmt, LIMIT),
        max_body_bytes=LIMIT,
        max_lines=10_000,
        max_rejections=max_rejections,
    )
    for chunk in chunks:
        intake.feed(chunk)
    intake.finish()
    rows = [(record_id, body) for _, record_id, _, body in intake.take_rows()]
    return intake.accepted, intake.rejected, intake.rejections, rows


def by_blocks(
    fmt: str, chunks: list[bytes], max_rejections: int, copy_every: int
) -> tuple[Any, ...]:
    intake = BlockIntake(parser_for(fmt, LIMIT), max_lines=10_000, max_rejections=max_rejections)
    rows: list[tuple[str, bytes]] = []
    blocks = [intake.feed(chunk) for chunk in chunks] + [intake.finish()]
    for block in blocks:
        if block is None:
            continue
        intake.apply(validate_block(JOB, LIMIT, block))
        if intake.pending_rows >= copy_every:
            rows += copy_rows(intake.take_rows())
    rows += copy_rows(intake.take_rows())
    return intake.accepted, intake.rejected, intake.rejections, rows


def job_lines(seed: int, n: int, repeats: list[tuple[int, int]], bad: list[int]) -> list[str]:
    gen = Generator.create(seed)
    records: list[Any] = [gen.credit_annotation() for _ in range(n)]
    for target, source in repeats:  # a later line takes an earlier line's id
        if target != source:
            records[target] = dict(records[target], id=records[source]["id"])
    for index in bad:
        records[index] = dict(records[index], amount="-1")
    return [json.dumps(r) for r in records]


def split(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(body)) for c in cuts})
    out, start = [], 0
    for p in points:
        out.append(body[start:p])
        start = p
    out.append(body[start:])
    return out


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(min_value=1, max_value=40),
    data=st.data(),
    cuts=st.lists(st.integers(min_value=0, max_value=12_000), max_size=10),
    max_rejections=st.integers(min_value=1, max_value=6),
    copy_every=st.integers(min_value=1, max_value=30),
    fmt=st.sampled_from(["ndjson", "json"]),
)
def test_blocks_give_the_same_job_as_the_loop(
    n: int, data: Any, cuts: list[int], max_rejections: int, copy_every: int, fmt: str
) -> None:
    index = st.integers(min_value=0, max_value=n - 1)
    repeats = data.draw(st.lists(st.tuples(index, index), max_size=6))
    bad = data.draw(st.lists(index, max_size=4))
    lines = job_lines(1, n, repeats, bad)
    if fmt == "ndjson":
        body = ("\n".join(lines) + "\n\nnot json\n").encode()
    else:
        body = ("[" + ",\n".join([*lines, "7"]) + "]").encode()
    chunks = split(body, cuts)
    assert by_blocks(fmt, chunks, max_rejections, copy_every) == by_loop(
        fmt, chunks, max_rejections
    )


def test_an_id_repeated_inside_a_block_and_from_an_earlier_one_names_the_first_line() -> None:
    lines = job_lines(2, 4, [], [])
    first_id = json.loads(lines[0])["id"]
    second = [json.dumps(dict(json.loads(lines[1]), id=first_id))] * 2
    chunks = [(lines[0] + "\n").encode(), ("\n".join([*second, lines[2]]) + "\n").encode()]
    accepted, rejected, rejections, rows = by_blocks("ndjson", chunks, 10, 1)
    assert (accepted, rejected) == (2, 2)
    assert rejections == [(2, "id: repeats line 1"), (3, "id: repeats line 1")]
    assert [r[0] for r in rows] == [first_id, json.loads(lines[2])["id"]]
    assert by_loop("ndjson", chunks, 10) == (accepted, rejected, rejections, rows)


CSV_HEADER = "id,document,kind,creditor,amount,occurred_on,reason"


def csv_rows(seed: int, n: int) -> list[str]:
    gen = Generator.create(seed)
    rows = []
    for _ in range(n):
        r = gen.credit_annotation()
        rows.append(
            f'{r["id"]},{r["document"]},{r["kind"]},"{r["creditor"]}",{r["amount"]},'
            f"{r['occurred_on']},"
        )
    return rows


def test_csv_blocks_match_the_loop() -> None:
    body = ("\r\n".join([CSV_HEADER, *csv_rows(3, 30), "x,y"]) + "\r\n").encode()
    chunks = split(body, [100, 1000, 1001, 2500])
    assert by_blocks("csv", chunks, 5, 7) == by_loop("csv", chunks, 5)


def test_the_line_limit_is_checked_before_a_block_is_made() -> None:
    intake = BlockIntake(parser_for("ndjson", LIMIT), max_lines=2)
    with pytest.raises(TooManyLines):
        intake.feed(b"\n\n\n")


@pytest.mark.parametrize("fmt", ["ndjson", "csv"])
@pytest.mark.parametrize("last_newline", [True, False], ids=["newline", "at-finish"])
def test_a_job_of_exactly_max_lines_is_accepted_on_the_workers_path(
    fmt: str, last_newline: bool
) -> None:
    """On the blocks' path as on the loop's: a job of API_MAX_JOB_LINES lines (3 here; a CSV
    header is no line) is taken whole, one more line is refused, whether the last line ends
    with a newline or is counted at the body's end."""

    def intake_of(n: int) -> BlockIntake:
        lines = job_lines(4, n, [], []) if fmt == "ndjson" else csv_rows(4, n)
        head = [CSV_HEADER] if fmt == "csv" else []
        body = "\n".join([*head, *lines]) + ("\n" if last_newline else "")
        intake = BlockIntake(parser_for(fmt, LIMIT), max_lines=3)
        for block in (intake.feed(body.encode()), intake.finish()):
            if block is not None:
                intake.apply(validate_block(JOB, LIMIT, block))
        return intake

    at_limit = intake_of(3)
    assert (at_limit.accepted, at_limit.rejected, at_limit.parser.lines) == (3, 0, 3)
    with pytest.raises(TooManyLines, match="a job has at most 3 lines"):
        intake_of(4)


@pytest.mark.parametrize("fmt", ["ndjson", "csv"])
def test_rejections_of_the_parser_and_of_validation_are_listed_in_line_order(fmt: str) -> None:
    """One block holding a line validation refuses (a bad amount) before one the parser
    refuses (too long; in CSV a wrong field count): the job lists them in line order, as the
    loop does."""
    good = job_lines(5, 3, [], [1]) if fmt == "ndjson" else csv_rows(5, 3)
    if fmt == "ndjson":
        lines = [good[0], good[1], json.dumps({"pad": "x" * LIMIT}), good[2]]
    else:
        head, _, occurred_on, reason = good[1].rsplit(",", 3)
        lines = [CSV_HEADER, good[0], f"{head},-1,{occurred_on},{reason}", "x,y", good[2]]
    chunks = [("\n".join(lines) + "\n").encode()]
    accepted, rejected, rejections, rows = by_blocks(fmt, chunks, 10, 100)
    assert (accepted, rejected) == (2, 2)
    first = 2 if fmt == "ndjson" else 3  # the CSV header is line 1
    assert [number for number, _ in rejections] == [first, first + 1]
    assert rejections[0][1].startswith("amount:")
    assert by_loop(fmt, chunks, 10) == (accepted, rejected, rejections, rows)
