"""How a credit-annotation job's body appears in the OpenAPI document: JSON array, NDJSON, CSV.

A JSON array is an array of ``CreditAnnotationIn``. NDJSON and CSV are text, so their schema is a
string with a pattern a client can check before sending, built from the record's published
rules (:mod:`bulk_recorder.records.published`): one JSON object per line in the compact form
encoders write, fields in ``CreditAnnotationIn``'s order, or a CSV header naming
:data:`~bulk_recorder.producer.csv_lines.CSV_COLUMNS` in order and one record per line. The
patterns are narrower than the parsers (which take any key order, spacing, escapes, CSV quoting
and column order): a body that matches is accepted but for the rules no schema states. The
NDJSON media types also carry ``x-itemSchema`` (OpenAPI 3.2's ``itemSchema``): one line's schema.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from bulk_recorder.producer.csv_lines import CSV_COLUMNS
from bulk_recorder.producer.parsers import CONTENT_TYPES
from bulk_recorder.records import published as p
from bulk_recorder.records.contract import (
    ANNOTATION_KINDS,
    MAX_ANNOTATION_REASON_LEN,
    MAX_CREDITOR_LEN,
)
from bulk_recorder.records.schema import CreditAnnotationIn

__all__ = ["CSV_BODY", "NDJSON_BODY", "job_request_body"]

ANNOTATION_REF: Final = p.COMPONENT_REF.format(name="CreditAnnotationIn")
NDJSON_BODY: Final = "CreditAnnotationLines"
CSV_BODY: Final = "CreditAnnotationCsv"

# A valid line: the examples of the document, checked by tests/unit/test_published_schema.py.
EXAMPLE_LINES: Final[tuple[dict[str, Any], ...]] = (
    {
        "id": "0193a7c2-5f1e-7d4a-9b8c-2e4f6a8b0c1d",
        "document": "529.982.247-25",
        "kind": "RESTRICTION",
        "creditor": "Banco Exemplo S.A.",
        "amount": "1500.00",
        "occurred_on": "2026-11-30",
        "reason": "overdue invoice",
    },
    {
        "id": "0193a7c2-5f1e-7d4a-9b8c-2e4f6a8b0c1e",
        "document": "12.ABC.345/01DE-35",
        "kind": "RELEASE",
        "creditor": "Loja Modelo Ltda",
        "amount": "89.9",
        "occurred_on": "2026-12-01",
    },
)


def _spread(length: int, must: str, rest: str) -> str:
    """Up to ``length`` characters of class ``rest``, one of them of class ``must``."""
    before = (length - 1) // 2
    return f"{rest}{{0,{before}}}{must}{rest}{{0,{length - 1 - before}}}"


def _kinds() -> str:
    return "(?:" + "|".join(sorted(ANNOTATION_KINDS)) + ")"


# -- NDJSON: compact JSON objects, fields in order, strings without escapes ---------------------

_JSON_CONTROL: Final = ('"', "\\\\", "\\u0001-\\u001f")  # never raw in a JSON string
_JSON_CHAR: Final = p.text_chars(*_JSON_CONTROL)
_JSON_VALUES: Final = {
    "id": f'"{p.UUID}"',
    "job_id": f'(?:"{p.UUID}"|null)',
    "document": f'"{p.BOUNDED_DOCUMENT}"',
    "kind": f'"{_kinds()}"',
    "creditor": '"'
    + _spread(MAX_CREDITOR_LEN, p.text_chars(*_JSON_CONTROL, p.BLANK_CHARS), _JSON_CHAR)
    + '"',
    "amount": f'(?:"{p.DECIMAL}"|{p.JSON_INTEGER})',
    "occurred_on": f'"{p.DATE}"',
    "reason": f'(?:"{_JSON_CHAR}{{0,{MAX_ANNOTATION_REASON_LEN}}}"|null)',
}


def _ndjson_line() -> str:
    info = msgspec.inspect.type_info(CreditAnnotationIn)
    assert isinstance(info, msgspec.inspect.StructType)
    assert [f.name for f in info.fields] == list(_JSON_VALUES), "a field without a line pattern"
    parts: list[str] = []
    for field in info.fields:
        pair = f'"{field.name}":{_JSON_VALUES[field.name]}'
        first = not parts
        pair = pair if first else "," + pair
        parts.append(pair if field.required else f"(?:{pair})?")
    return "\\{" + "".join(parts) + "\\}"


# -- CSV: the header in CSV_COLUMNS order, then records without quoting ----------------------------

_CSV_SPECIAL: Final = (",", '"', "\\u000a", "\\u000d")
_CSV_CHAR: Final = p.text_chars(*_CSV_SPECIAL)
_CSV_VALUES: Final = {
    "id": p.UUID,
    "job_id": f"(?:{p.UUID})?",
    "document": p.BOUNDED_DOCUMENT,
    "kind": _kinds(),
    "creditor": _spread(MAX_CREDITOR_LEN, p.text_chars(",", '"', p.BLANK_CHARS), _CSV_CHAR),
    "amount": p.DECIMAL,
    "occurred_on": p.DATE,
    "reason": f"{_CSV_CHAR}{{0,{MAX_ANNOTATION_REASON_LEN}}}",
}


def _csv_body() -> str:
    assert tuple(_CSV_VALUES) == CSV_COLUMNS, "a CSV column without a pattern"
    header = ",".join(CSV_COLUMNS)
    record = ",".join(_CSV_VALUES[name] for name in CSV_COLUMNS)
    return f"{header}\\u000a(?:{record}\\u000a)+"


def ndjson_example() -> str:
    return "".join(msgspec.json.encode(line).decode() + "\n" for line in EXAMPLE_LINES)


def csv_example() -> str:
    rows = [",".join(CSV_COLUMNS)]
    rows += [",".join(str(line.get(name, "")) for name in CSV_COLUMNS) for line in EXAMPLE_LINES]
    return "\n".join(rows) + "\n"


def body_components(max_line_bytes: int) -> dict[str, Any]:
    """The NDJSON and CSV body schemas, for components."""
    return {
        NDJSON_BODY: {
            "type": "string",
            "pattern": p.anchored(f"(?:{_ndjson_line()}\\u000a)+"),
            "description": "NDJSON: one CreditAnnotationIn object a line, each line ended by a "
            "newline. The pattern states the compact form, fields in CreditAnnotationIn's order "
            "and strings without escapes; any JSON object valid under CreditAnnotationIn is "
            "accepted on a line, and blank lines are skipped (but numbered). At most "
            f"{max_line_bytes} bytes a line. {p.UNSTATED_ANNOTATION_RULES}",
            "examples": [ndjson_example()],
        },
        CSV_BODY: {
            "type": "string",
            "pattern": p.anchored(_csv_body()),
            "description": "CSV (RFC 4180): a header row, then one record a line. The pattern "
            f"states the header {','.join(CSV_COLUMNS)} and records without quoting (so no "
            "comma, quote or line break in a value); the API also takes the columns in any "
            "order, job_id and reason left out or empty, and quoted fields. At most "
            f"{max_line_bytes} bytes a record. {p.UNSTATED_ANNOTATION_RULES}",
            "examples": [csv_example()],
        },
    }


def job_request_body(max_lines: int) -> dict[str, Any]:
    """The ``requestBody`` of ``POST /v1/credit-annotation-jobs``."""
    lines: dict[str, Any] = {
        "schema": {"$ref": p.COMPONENT_REF.format(name=NDJSON_BODY)},
        "x-itemSchema": {"$ref": ANNOTATION_REF},
    }
    content: dict[str, Any] = {
        "application/json": {
            "schema": {
                "type": "array",
                "items": {"$ref": ANNOTATION_REF},
                "minItems": 1,
                "maxItems": max_lines,
                "uniqueItems": True,  # two equal lines repeat an id
            },
            "example": list(EXAMPLE_LINES),
        }
    }
    for media, fmt in CONTENT_TYPES.items():
        if fmt == "ndjson":
            content[media] = lines
    content["text/csv"] = {"schema": {"$ref": p.COMPONENT_REF.format(name=CSV_BODY)}}
    return {
        "requestBody": {
            "required": True,
            "description": "Streamed: a JSON array of objects, NDJSON (one object a line) or "
            f"CSV with a header row; at most {max_lines} lines (blank ones count). Each line is "
            "validated on its own: the job is accepted (202) if one line is valid, and lists "
            "the rejected ones with their reasons.",
            "content": content,
        }
    }
