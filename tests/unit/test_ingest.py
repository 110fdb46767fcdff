"""Streaming job parsers: the same lines whatever the chunk boundaries, bounded buffering;
every line counts toward the line limit (blank ones too), checked before a chunk is validated."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bulk_recorder.producer.ingest import JobIntake, TooManyLines
from bulk_recorder.producer.parsers import (
    CSV_COLUMNS,
    CsvParser,
    FormatError,
    JsonArrayParser,
    LineParser,
    NdjsonParser,
    parser_for,
)
from bulk_recorder.records import decode
from consumer.tools.generator import Generator

A = {
    "id": "0193a3c4-0000-7000-8000-000000000001",
    "document": "529.982.247-25",
    "kind": "RESTRICTION",
    "creditor": 'Banco "Ação", S.A.',
    "amount": "1200.00",
    "occurred_on": "2026-11-20",
    "reason": "two\nlines",
}
B = dict(A, id="0193a3c4-0000-7000-8000-000000000002", document="12.ABC.345/01DE-35")
JOB = "0193a3c4-0000-7000-8000-0000000000ff"

NDJSON = (json.dumps(A, ensure_ascii=False) + "\n\n" + json.dumps(B) + "\r\nnot json\n").encode()
ARRAY = json.dumps([A, 7, B], ensure_ascii=False, indent=1).encode()
_REST = 'RESTRICTION,"Banco ""Ação"", S.A.",1200.00,2026-11-20,"two\nlines"\r\n'
CSV = (
    "\ufeffid,document,kind,creditor,amount,occurred_on,reason\r\n"
    f"{A['id']},{A['document']},{_REST}"
    f"{B['id']},{B['document']},{_REST}"
    "x,y\n"
).encode()

BODIES = {"ndjson": NDJSON, "json": ARRAY, "csv": CSV}


def run(fmt: str, chunks: list[bytes], limit: int = 4096):
    parser = parser_for(fmt, limit)
    items = []
    for chunk in chunks:
        items.extend(parser.feed(chunk))
    items.extend(parser.finish())
    return items


def split(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(body)) for c in cuts})
    out, start = [], 0
    for p in points:
        out.append(body[start:p])
        start = p
    out.append(body[start:])
    return out


@pytest.mark.parametrize("fmt", sorted(BODIES))
@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=700), max_size=12))
def test_chunk_boundaries_do_not_change_the_lines(fmt: str, cuts: list[int]) -> None:
    body = BODIES[fmt]
    assert run(fmt, split(body, cuts)) == run(fmt, [body])


def test_line_numbers_and_canonical_bodies() -> None:
    for fmt, rejected_line in (("ndjson", 4), ("json", 2), ("csv", 6)):
        intake = JobIntake(JOB, parser_for(fmt, 4096), max_body_bytes=4096, max_lines=10)
        intake.feed(BODIES[fmt])
        intake.finish()
        assert intake.accepted == 2, fmt
        assert [n for n, _ in intake.rejections] == [rejected_line], fmt
        bodies = [json.loads(row[3]) for row in intake.take_rows()]
        assert [b["id"] for b in bodies] == [A["id"], B["id"]]
        assert all(b["job_id"] == JOB for b in bodies)
        assert bodies[0]["document"] == "52998224725"
        assert bodies[1]["document"] == "12ABC34501DE35"
        assert bodies[0]["creditor"] == A["creditor"]
        assert bodies[0]["reason"] == "two\nlines"


def test_an_overlong_ndjson_line_is_rejected_without_being_buffered() -> None:
    parser = parser_for("ndjson", 100)
    items = parser.feed(b'{"a": "' + b"x" * 150)
    assert items == []
    items = parser.feed(b"y" * 10_000)  # still the same line: nothing kept
    assert items == []
    items = parser.feed(b'"}\n{"b": 1}\n')
    assert items == [(1, "line longer than 100 bytes"), (2, b'{"b": 1}')]


def test_json_array_errors_name_the_element() -> None:
    with pytest.raises(FormatError, match="after element 1"):
        run("json", [b'[{"a": 1} x'])
    with pytest.raises(FormatError, match="unexpected end of body in element 2"):
        run("json", [b'[{"a": 1}, {"b"'])
    with pytest.raises(FormatError, match="element 1: invalid JSON"):
        run("json", [b"[{oops}]"], limit=4)
    assert run("json", [b"[]"]) == []


@pytest.mark.parametrize("fmt", ["json", "ndjson"])
def test_an_element_with_an_integer_over_the_digit_limit_is_rejected_as_that_line(
    fmt: str,
) -> None:
    # The array's splitter once read the number as an int: ValueError, a 500 for the request.
    big = b'{"id": 1' + b"0" * 5000 + b"}"
    good = json.dumps(A).encode()
    body = b"[" + big + b", " + good + b"]" if fmt == "json" else big + b"\n" + good + b"\n"
    intake = JobIntake(JOB, parser_for(fmt, 1 << 20), max_body_bytes=1 << 20, max_lines=10)
    intake.feed(body)
    intake.finish()
    assert intake.rejections == [(1, "invalid JSON")]
    assert intake.accepted == 1


def test_an_element_nested_past_the_splitters_reach_refuses_the_body() -> None:
    # Once a RecursionError, a 500 for the request: now the body cannot be split, a 400.
    deep = b"[" * 5000 + b"]" * 5000
    with pytest.raises(FormatError, match="element 1: JSON nesting deeper than 32 levels"):
        run("json", [b"[" + deep + b"]"], limit=1 << 20)


def test_csv_invalid_utf8_and_unclosed_quote() -> None:
    with pytest.raises(FormatError, match="not valid UTF-8"):
        run("csv", [b"id,document\n\xff\n"])
    header = b"id,document,kind,creditor,amount,occurred_on\n"
    with pytest.raises(FormatError, match="line 2: a quoted field is never closed"):
        run("csv", [header + b'1,"2\n'])


def test_repeated_id_and_line_limit() -> None:
    body = (json.dumps(A) + "\n" + json.dumps(A) + "\n").encode()
    intake = JobIntake(JOB, parser_for("ndjson", 4096), max_body_bytes=4096, max_lines=5)
    intake.feed(body)
    intake.finish()
    assert (intake.accepted, intake.rejections) == (1, [(2, "id: repeats line 1")])
    small = JobIntake(JOB, parser_for("ndjson", 4096), max_body_bytes=4096, max_lines=1)
    with pytest.raises(TooManyLines):
        small.feed(body)


# -- every line counts toward the limit ----------------------------------------------------------

LIMIT = 1 << 20


def sample_annotations(n: int, seed: int = 1) -> list[dict[str, Any]]:
    gen = Generator.create(seed)
    return [gen.credit_annotation() for _ in range(n)]


def ndjson_line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


def feed_all(parser: LineParser, chunks: list[bytes]) -> list[tuple[int, bytes | str]]:
    out: list[tuple[int, bytes | str]] = []
    for chunk in chunks:
        out += parser.feed(chunk)
    return out + parser.finish()


@pytest.mark.parametrize(
    ("body", "lines"),
    [
        (b"", 0),
        (b"\n", 1),
        (b"\n\n\n", 3),
        (b" \t\r\n  \n", 2),  # whitespace-only lines are lines
        (b'{"a":1}\n\n{"b":2}', 3),  # the last line needs no newline
        (b'{"a":1}\n\n{"b":2}\n', 3),
    ],
)
def test_ndjson_counts_every_physical_line(body: bytes, lines: int) -> None:
    parser = NdjsonParser(LIMIT)
    feed_all(parser, [body[i : i + 2] for i in range(0, len(body), 2)])
    assert parser.lines == lines


def test_csv_counts_blank_lines_but_not_the_header() -> None:
    one = sample_annotations(1)[0]
    head = ",".join(CSV_COLUMNS) + "\n"
    record = ",".join(str(one[name]) for name in CSV_COLUMNS) + "\n"
    parser = CsvParser(LIMIT)
    items = feed_all(parser, [(head + "\n" + record + "\n\n").encode()])
    assert [number for number, _ in items] == [3]
    assert parser.lines == 4  # blank, record, blank, blank


def test_json_array_counts_elements_and_skips_whitespace_split_across_chunks() -> None:
    objs = sample_annotations(3)
    body = ("[ \n\t" + " \r\n ,\n ".join(json.dumps(o) for o in objs) + "\n\n ]  \n").encode()
    for size in (1, 3, 7, len(body)):
        parser = JsonArrayParser(LIMIT)
        items = feed_all(parser, [body[i : i + size] for i in range(0, len(body), size)])
        assert [json.loads(payload)["id"] for _, payload in items] == [o["id"] for o in objs]
        assert parser.lines == 3


@pytest.mark.parametrize("fmt", ["ndjson", "csv"])
def test_blank_filler_trips_the_line_limit(fmt: str) -> None:
    head = (",".join(CSV_COLUMNS) + "\n").encode() if fmt == "csv" else b""
    intake = JobIntake(JOB, parser_for(fmt, LIMIT), max_body_bytes=LIMIT, max_lines=100)
    intake.feed(head + b"\n" * 100)  # exactly at the limit: fine
    with pytest.raises(TooManyLines, match="a job has at most 100 lines"):
        intake.feed(b"\n")


def test_a_job_of_exactly_max_lines_is_accepted() -> None:
    body = b"".join(ndjson_line(o) for o in sample_annotations(3))
    intake = JobIntake(JOB, NdjsonParser(LIMIT), max_body_bytes=LIMIT, max_lines=3)
    intake.feed(body)
    intake.finish()
    assert (intake.accepted, intake.rejected) == (3, 0)


def test_the_limit_is_checked_before_the_chunk_is_validated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = 0

    def counting_decode(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return decode(*args, **kwargs)

    monkeypatch.setattr("bulk_recorder.producer.ingest.decode", counting_decode)
    body = b"".join(ndjson_line(o) for o in sample_annotations(5))
    intake = JobIntake(JOB, NdjsonParser(LIMIT), max_body_bytes=LIMIT, max_lines=3)
    with pytest.raises(TooManyLines):
        intake.feed(body)
    assert calls == 0


def test_the_last_line_without_newline_counts_at_finish() -> None:
    body = b"".join(ndjson_line(o) for o in sample_annotations(3)) + b"\n" + b'{"x":1}'
    intake = JobIntake(JOB, NdjsonParser(LIMIT), max_body_bytes=LIMIT, max_lines=4)
    intake.feed(body)  # four lines so far
    with pytest.raises(TooManyLines):
        intake.finish()  # the fifth, unterminated


@pytest.mark.parametrize("fmt", sorted(BODIES))
@pytest.mark.parametrize("cut", [1, 2])
def test_a_bom_split_across_chunks_is_dropped_as_in_one_chunk(fmt: str, cut: int) -> None:
    """How TCP segments fall decides nothing: a BOM cut after its first or second byte is
    dropped like a whole one, and line 1 is read as it was sent."""
    body = BODIES[fmt].removeprefix(b"\xef\xbb\xbf")
    with_bom = b"\xef\xbb\xbf" + body
    whole = run(fmt, [with_bom])
    assert whole == run(fmt, [body])
    assert run(fmt, [with_bom[:cut], with_bom[cut:]]) == whole
    assert run(fmt, [with_bom[:1], with_bom[1:2], with_bom[2:]]) == whole


def _csv_record(creditor: str) -> str:
    return f"{A['id']},{A['document']},RESTRICTION,{creditor},1.00,2026-11-20,"


@pytest.mark.parametrize("quoted", [False, True])
def test_the_csv_line_limit_counts_bytes_not_characters(quoted: bool) -> None:
    """A record of 'ç' (2 bytes each) is measured in bytes, as docs/producer.md states: one
    byte over is refused with the line limit's reason, whatever its count of characters, and
    one at the limit is taken. Quoted (a field that may span lines) or not."""
    base = len(_csv_record('""' if quoted else "").encode())
    limit = base + 200
    header = "id,document,kind,creditor,amount,occurred_on,reason\n"

    def record(creditor: str) -> str:
        return _csv_record(f'"{creditor}"' if quoted else creditor)

    at_limit, over = record("ç" * 100), record("ç" * 100 + "x")
    assert len(at_limit.encode()) == limit
    assert len(over) < limit < len(over.encode())
    body = (header + at_limit + "\n" + over + "\n").encode()
    items = run("csv", [body], limit)
    assert [(n, type(item)) for n, item in items] == [(2, bytes), (3, str)]
    assert items[1] == (3, f"line longer than {limit} bytes")


def test_an_unfinished_csv_line_is_measured_in_bytes() -> None:
    """The line not yet ended by a newline is bounded in bytes too: a client sending 'ç'
    without a newline is refused at the limit, not at twice it."""
    parser = CsvParser(100)
    parser.feed(b"id,document,kind,creditor,amount,occurred_on,reason\n")
    with pytest.raises(FormatError, match="line 2: longer than 100 bytes"):
        parser.feed(("ç" * 51).encode())


def test_a_csv_line_of_exactly_the_limit_cut_before_its_newline_is_taken() -> None:
    """The unfinished line is held to the limit as the finished one is: a record of exactly
    the limit in bytes ('ç', 2 bytes each), its newline in the next chunk, is taken; one byte
    more, still unfinished, refuses the body."""
    header = "id,document,kind,creditor,amount,occurred_on,reason\n"
    limit = len(_csv_record("").encode()) + 200
    at_limit = _csv_record("ç" * 100)
    assert len(at_limit.encode()) == limit
    items = run("csv", [(header + at_limit).encode(), b"\n"], limit)
    assert [(n, type(item)) for n, item in items] == [(2, bytes)]
    parser = CsvParser(limit)
    with pytest.raises(FormatError, match=f"line 2: longer than {limit} bytes"):
        parser.feed((header + at_limit + "x").encode())


def test_an_unfinished_csv_line_of_4_byte_characters_is_refused_one_past_the_limit() -> None:
    """The cheap count of characters before the exact count of bytes lets no line through: 25
    four-byte characters are the limit of 100 bytes exactly, 26 are refused."""
    header = b"id,document,kind,creditor,amount,occurred_on,reason\n"
    CsvParser(100).feed(header + ("\U0001f600" * 25).encode())  # 100 bytes: fine so far
    with pytest.raises(FormatError, match="line 2: longer than 100 bytes"):
        CsvParser(100).feed(header + ("\U0001f600" * 26).encode())


def test_a_csv_quoted_field_left_open_is_measured_in_bytes() -> None:
    """A quoted field that runs on over several lines is bounded in bytes too: 100 bytes of
    'ç' (50 characters) with their newline make the limit of 100 exactly, one more line is
    refused."""
    parser = CsvParser(100)
    parser.feed(b"id,document,kind,creditor,amount,occurred_on,reason\n")
    opened = '"' + "ç" * 49  # 99 bytes, and its newline: 100
    assert parser.feed((opened + "\n").encode()) == []
    with pytest.raises(FormatError, match="line 2: a quoted field is never closed, or the"):
        parser.feed(b"\n")


def test_an_overlong_unfinished_csv_line_names_its_own_line() -> None:
    """The lines finished in the same chunk count: the refusal names the line that is too
    long (line 4, after the header and two blank lines), not the chunk's first."""
    body = b"id,document,kind,creditor,amount,occurred_on,reason\n\n\n" + b"x" * 101
    with pytest.raises(FormatError, match=r"^line 4: longer than 100 bytes$"):
        CsvParser(100).feed(body)
