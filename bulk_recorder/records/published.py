"""The record contract's rules as JSON Schema, for the OpenAPI document: what a client may send.

Every rule a schema can state is stated, built from the contract's own limits
(:mod:`.contract`, :mod:`.documents`), so the document cannot drift from the validation. Patterns
are written in the part of the regex dialect that ECMA 262 (JSON Schema's), Python's ``re`` and
Rust's ``regex`` read alike: explicit classes (never ``\\s``, ``\\S``, ``\\d`` or ``\\w``, whose
meanings differ between them), ``\\uXXXX`` escapes, non-capturing groups, ``^`` and a closing
``$``. A pattern may be narrower than the validation (one spelling of a date-time, of a job
line): whatever matches it is accepted.

What no schema can state -- CPF/CNPJ check digits, the double-entry sums, an operation's asset
equal to its transaction's, distinct ids, an integer amount's spelling (1.0 is an integer to JSON
Schema, a float to the API), sizes in bytes, nesting depth -- the descriptions say
(:data:`UNSTATED_TRANSACTION_RULES`, :data:`UNSTATED_ANNOTATION_RULES`).
"""

from __future__ import annotations

from typing import Any, Final

from bulk_recorder.records.contract import (
    MAX_AMOUNT_FRACTION_DIGITS,
    MAX_AMOUNT_INTEGER_DIGITS,
    MAX_DEPTH,
    MAX_METADATA_BYTES,
    MAX_METADATA_EXPONENT,
    MAX_METADATA_FRACTION_DIGITS,
    MAX_METADATA_INTEGER_DIGITS,
)
from bulk_recorder.records.documents import CNPJ_LEN, CPF_LEN, MAX_RAW_LEN, PUNCTUATION

__all__ = [
    "ASSET",
    "BLANK_CHARS",
    "BOUNDED_DOCUMENT",
    "COMPONENT_REF",
    "DATE",
    "DECIMAL",
    "DOCUMENT",
    "JSON_INTEGER",
    "METADATA_COMPONENTS",
    "NOT_BLANK_TEXT",
    "TEXT",
    "UNSTATED_ANNOTATION_RULES",
    "UNSTATED_TRANSACTION_RULES",
    "UUID",
    "amount_schema",
    "anchored",
    "date_time_pattern",
    "override",
    "resolve_overrides",
]

COMPONENT_REF: Final = "#/components/schemas/{name}"
_OVERRIDE: Final = "x-override"


def override(schema: dict[str, Any]) -> dict[str, Any]:
    """``extra_json_schema`` for keys msgspec writes itself (it keeps its own ``pattern`` and a
    union's ``anyOf`` over the extra ones): :func:`resolve_overrides` puts them in place."""
    return {_OVERRIDE: schema}


def resolve_overrides(node: Any) -> Any:
    """``node`` (a JSON Schema, or a dict of them) with every :func:`override` applied."""
    if isinstance(node, list):
        return [resolve_overrides(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: resolve_overrides(value) for key, value in node.items() if key != _OVERRIDE}
    out.update(node.get(_OVERRIDE, {}))
    return out


# -- pattern bodies (unanchored, so that the job-body patterns can embed them) -----------------

UUID: Final = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
ASSET: Final = "[A-Z][A-Z0-9]{0,9}"
# An exact decimal as text, digit limits of numeric(38,18); rules.amount matches with it.
DECIMAL: Final = (
    f"[0-9]{{1,{MAX_AMOUNT_INTEGER_DIGITS}}}(?:\\.[0-9]{{1,{MAX_AMOUNT_FRACTION_DIGITS}}})?"
)
# The same range as a JSON integer (JSON has no leading zeros).
JSON_INTEGER: Final = f"(?:0|[1-9][0-9]{{0,{MAX_AMOUNT_INTEGER_DIGITS - 1}}})"
MAX_INTEGER_AMOUNT: Final = 10**MAX_AMOUNT_INTEGER_DIGITS - 1
# The characters str.isspace() is true for (what str.strip() drops): Python's \s, as a class.
# ECMA 262's \s differs (no \x1c-\x1f or \x85, but \ufeff), so "not blank" is spelled out.
# tests/unit/test_published_schema.py checks it against every code point.
BLANK_CHARS: Final = (
    "\\u0009-\\u000d\\u001c-\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f"
    "\\u205f\\u3000"
)
NUL: Final = "\\u0000"  # PostgreSQL text cannot hold it


def _document(repeat: str) -> str:
    punctuation = "".join(f"\\u{c:04x}" for c in PUNCTUATION)
    p = f"[{punctuation}]{repeat}"
    cpf = f"(?:{p}[0-9]){{{CPF_LEN}}}"
    cnpj = f"(?:{p}[0-9A-Za-z]){{{CNPJ_LEN - 2}}}(?:{p}[0-9]){{2}}"
    return f"(?:{cpf}|{cnpj}){p}"


# A CPF or a CNPJ in shape, punctuation anywhere; its check digits no pattern can state.
DOCUMENT: Final = _document("*")
MAX_DOCUMENT_LEN: Final = MAX_RAW_LEN
# The same, with at most so much punctuation at each place that it fits MAX_DOCUMENT_LEN
# without a maxLength (inside a job line's pattern).
BOUNDED_DOCUMENT: Final = _document(f"{{0,{(MAX_RAW_LEN - CNPJ_LEN) // (CNPJ_LEN + 1)}}}")

_DAY_OF_ANY_MONTH: Final = "(?:0[1-9]|1[0-9]|2[0-8])"
_LEAP_YEAR: Final = (
    "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
)


def _date(year: str) -> str:
    """A real calendar date YYYY-MM-DD with a year ``year`` matches (leap days in leap years)."""
    month_day = (
        f"(?:(?:0[1-9]|1[0-2])-{_DAY_OF_ANY_MONTH}|(?:0[13-9]|1[0-2])-(?:29|30)"
        "|(?:0[13578]|1[02])-31)"
    )
    return f"(?:{year}-{month_day}|{_LEAP_YEAR}-02-29)"


# Years 0001-9999, as datetime.date has them.
DATE: Final = _date("(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)")
# Years 0002-9998: with any offset the instant stays within datetime's range in UTC.
_DATE_TIME_YEAR: Final = (
    "(?:000[2-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])"
)


def date_time_pattern() -> str:
    """RFC 3339 with a timezone (Z or an offset) and no leap second: a form of ISO 8601 that
    ``datetime.fromisoformat`` reads, within datetime's range once converted to UTC."""
    time = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?"
    offset = "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"
    return anchored(f"{_date(_DATE_TIME_YEAR)}T{time}{offset}")


def anchored(body: str) -> str:
    return f"^(?:{body})$"


def text_chars(*excluded: str) -> str:
    """A class of any character but NUL and ``excluded`` (class syntax)."""
    return f"[^{NUL}{''.join(excluded)}]"


TEXT: Final[str] = anchored(f"{text_chars()}*")  # any text PostgreSQL can store
# Not blank: at least one character str.isspace() is false for, and no NUL.
NOT_BLANK_TEXT: Final[str] = anchored(f"{text_chars()}*{text_chars(BLANK_CHARS)}{text_chars()}*")


def amount_schema(*, positive: bool) -> dict[str, Any]:
    """An exact decimal as a JSON string or integer (never a float); > 0 if ``positive``."""
    text: dict[str, Any] = {"type": "string", "pattern": anchored(DECIMAL)}
    if positive:
        text["not"] = {"pattern": "^[0.]*$", "description": "zero"}
    bound = "> 0" if positive else ">= 0"
    return {
        "anyOf": [
            text,
            {"type": "integer", "minimum": 1 if positive else 0, "maximum": MAX_INTEGER_AMOUNT},
        ],
        "description": f"Exact decimal {bound} as a JSON string or integer, at most "
        f"{MAX_AMOUNT_INTEGER_DIGITS} integer and {MAX_AMOUNT_FRACTION_DIGITS} fractional "
        "digits; never a float (1.0 and 1e2 are refused).",
    }


# Metadata: any JSON object (or null), but no NUL in any string or key anywhere in it.
_VALUE_REF: Final = COMPONENT_REF.format(name="MetadataValue")
METADATA_COMPONENTS: Final[dict[str, Any]] = {
    "MetadataObject": {
        "type": "object",
        "propertyNames": {"pattern": TEXT},
        "additionalProperties": {"$ref": _VALUE_REF},
        "description": "A JSON object, stored as jsonb with its numbers digit for digit: no "
        f"NUL in any string or key, at most {MAX_METADATA_BYTES} bytes as compact JSON, numbers "
        f"of at most {MAX_METADATA_INTEGER_DIGITS} digits before the decimal point and "
        f"{MAX_METADATA_FRACTION_DIGITS} after (PostgreSQL's numeric; counted as written once "
        "the exponent is applied, trailing zeros included, whatever the spelling) with an "
        f"exponent as written of at most {MAX_METADATA_EXPONENT} either way, even on a zero; "
        f"at most {MAX_DEPTH} levels of nesting in the whole body (the sizes, the digits, the "
        "exponents and the depth are checked on receipt: no schema states them).",
    },
    "MetadataValue": {
        "anyOf": [
            {"type": "string", "pattern": TEXT},
            {"type": ["number", "boolean", "null"]},
            {"type": "array", "items": {"$ref": _VALUE_REF}},
            {"$ref": COMPONENT_REF.format(name="MetadataObject")},
        ]
    },
}

UNSTATED_TRANSACTION_RULES: Final = (
    "Rules no JSON Schema can state, checked on receipt (422 with the reason): the debits sum "
    "to the credits, and both to `amount` (reasons `debits X != credits Y`, `debits X and "
    "credits Y != amount Z`); every operation's `asset_code` is the transaction's "
    "(`operations[i].asset_code: X != transaction asset Y`); operation ids are distinct from "
    "each other and from the transaction id (`operations[i].id: duplicate`, "
    "`operations[i].id: same as the transaction id`; `uniqueItems` states only that two "
    "legs differ, JSON Schema cannot compare one property of each); an integer amount is "
    "written without a fraction or exponent, which JSON Schema's `integer` allows (`amount: "
    "must be a decimal "
    "string or integer, not a float`); the body's size and nesting depth. "
    "A transaction id already accepted with other content is 409."
)
UNSTATED_ANNOTATION_RULES: Final = (
    "Rules no JSON Schema can state, checked on receipt (the line is rejected with the "
    "reason): the document's check digits (`document: invalid CPF check digits`, `document: "
    "invalid CNPJ check digits`) and a document of one repeated character (`document: invalid "
    "CPF (all characters identical)`); an id that repeats an earlier line of the same job "
    "(`id: repeats line N`); an integer amount written without a fraction or exponent, which "
    "JSON Schema's `integer` allows (`amount: must be a decimal string or integer, not a "
    "float`); the line's size."
)
