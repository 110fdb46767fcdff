"""What no schema states, checked in Python after msgspec's pass: the exact-decimal rules of
amounts (no floats, 20 integer and 18 decimal digits), ISO 8601 ``created_at`` as
``datetime.fromisoformat`` reads it, CPF/CNPJ check digits, and what PostgreSQL cannot store
(NUL, lone surrogates, metadata numbers beyond ``numeric``). The double-entry sums are in
:mod:`bulk_recorder.records.validation`, through :mod:`bulk_recorder.records.exact`.

Each rule returns the clean value or raises :class:`RecordError` with the reason the DLQ header
carries; ``where`` is the prefix of the field name ("" or "operations[3].").
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final, NoReturn

import msgspec

from bulk_recorder.exceptions import BulkRecorderError
from bulk_recorder.records.contract import (
    MAX_AMOUNT_FRACTION_DIGITS,
    MAX_AMOUNT_INTEGER_DIGITS,
    MAX_METADATA_BYTES,
    MAX_METADATA_EXPONENT,
    MAX_METADATA_FRACTION_DIGITS,
    MAX_METADATA_INTEGER_DIGITS,
    RecordError,
)
from bulk_recorder.records.documents import normalize_document
from bulk_recorder.records.schema import ASSET_PATTERN, ENCODE, PARSE, json_number

MISSING: Final = object()

# Looser shape, only used to explain why an amount failed the strict pattern.
_NUMBER_MATCH: Final = re.compile(r"(-?)([0-9]+)(?:\.([0-9]+))?").fullmatch
_AMOUNT_LIMIT: Final = 10**MAX_AMOUNT_INTEGER_DIGITS
_LOWER_HEX_DIGITS: Final = b"0123456789abcdef"
_ASSET_MATCH: Final = re.compile(ASSET_PATTERN).search
_KINDS: Final[dict[type, str]] = {
    bool: "a boolean",
    int: "a number",
    float: "a number",
    Decimal: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
}


def fail(where: str, key: str, message: str) -> NoReturn:
    raise RecordError(f"{where}{key}: {message}")


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    return _KINDS.get(type(value), type(value).__name__)


def type_error(where: str, key: str, value: Any, expected: str) -> NoReturn:
    if value is MISSING:
        fail(where, key, "missing")
    fail(where, key, f"must be {expected}, not {kind_of(value)}")


def uuids(joined: str) -> bool:
    """True if ``joined``, ids of 36 characters each (the schema saw to that) laid end to end,
    holds only UUIDs as UUID_PATTERN has them: hex digits but for a hyphen at 8, 13, 18 and 23."""
    return lowered_uuids(joined) is not None


def lowered_uuids(joined: str) -> str | None:
    """``joined`` in lower case if it holds only UUIDs (as :func:`uuids`), else None.

    Two C calls rather than the pattern: every byte mapped to its class (lower-case hex digit,
    hyphen, other), then compared with the classes of that many UUIDs. A regex walks every
    character in Python's engine, three times the time for a transaction's seven ids. Ids
    already in lower case, as most producers write them, are not lowered again.
    """
    count = len(joined) // 36
    shape = _UUID_SHAPES[count] if count < len(_UUID_SHAPES) else _UUID_SHAPE * count
    if joined.encode().translate(_UUID_CLASSES) == shape:
        return joined
    if not joined.isascii():  # str.lower maps no other character onto a hex digit, but be plain
        return None
    lowered = joined.lower()
    return lowered if lowered.encode().translate(_UUID_CLASSES) == shape else None


_UUID_CLASSES: Final = bytes(
    ord("x") if b in _LOWER_HEX_DIGITS else b if b == ord("-") else ord("?") for b in range(256)
)
_UUID_SHAPE: Final = b"xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
_UUID_SHAPES: Final = [_UUID_SHAPE * n for n in range(16)]  # up to a transaction of 6 legs


def operation_asset(value: str, asset_code: str, where: str) -> None:
    """An operation's asset is its transaction's (``asset_code``, already valid)."""
    if value != asset_code:
        if not _ASSET_MATCH(value):
            fail(
                where,
                "asset_code",
                "must be 1-10 upper-case letters or digits, starting with a letter",
            )
        fail(where, "asset_code", f"{value} != transaction asset {asset_code}")


def amount(value: Any, positive: bool, where: str = "", key: str = "amount") -> Decimal:
    """An exact decimal from a JSON string ("1050.25") or integer (1000), never a float."""
    kind = type(value)
    if kind is str and exact_decimal(value):
        parsed = Decimal(value)
        if positive and not parsed:
            fail(where, key, "must be > 0")
        return parsed
    if kind is int and 0 <= value < _AMOUNT_LIMIT:
        if positive and not value:
            fail(where, key, "must be > 0")
        return Decimal(value)
    _bad_amount(value, positive, where, key)


def exact_decimal(text: str) -> bool:
    """``text`` is an amount numeric(38,18) stores without rounding, as published.DECIMAL has it
    (tests/unit/test_amount_shape.py holds the two together): 1-20 ASCII digits, then a point
    and 1-18 more or nothing. One loop over the characters: compiled (setup.py), a third of the
    cost of the string methods that did it before."""
    size = len(text)
    if size > _MAX_AMOUNT_CHARS:
        return False
    point = -1
    for i in range(size):
        code = ord(text[i])
        if code == _POINT and point < 0:
            point = i
        elif code < _ZERO_CODE or code > _NINE_CODE:
            return False
    if point < 0:
        return 0 < size <= MAX_AMOUNT_INTEGER_DIGITS
    return (
        0 < point <= MAX_AMOUNT_INTEGER_DIGITS
        and 0 < size - point - 1 <= MAX_AMOUNT_FRACTION_DIGITS
    )


_MAX_AMOUNT_CHARS: Final = MAX_AMOUNT_INTEGER_DIGITS + 1 + MAX_AMOUNT_FRACTION_DIGITS
_POINT: Final = ord(".")
_ZERO_CODE: Final = ord("0")
_NINE_CODE: Final = ord("9")


def _bad_amount(value: Any, positive: bool, where: str, key: str) -> NoReturn:
    sign_error = "must be > 0" if positive else "must be >= 0"
    kind = type(value)
    if kind is int:
        fail(where, key, sign_error if value < 0 else "out of range")
    if kind is Decimal or kind is float:
        fail(where, key, "must be a decimal string or integer, not a float")
    if kind is not str:
        type_error(where, key, value, "a decimal string or integer")
    match = _NUMBER_MATCH(value)
    if match is None:
        fail(where, key, "invalid decimal (expected digits with an optional '.' fraction)")
    if match[1]:
        fail(where, key, sign_error)
    if len(match[2]) > MAX_AMOUNT_INTEGER_DIGITS:
        fail(where, key, "out of range")
    fail(where, key, f"more than {MAX_AMOUNT_FRACTION_DIGITS} decimal places")


def storable_text(value: str, key: str, twin: str | None = None) -> None:
    """PostgreSQL text holds no NUL and no lone surrogate (``twin``, the same text read with
    another stand-in for lone surrogates, differs where there was one)."""
    if "\x00" in value:
        fail("", key, "contains NUL")
    if twin is not None and twin != value:
        fail("", key, "invalid unicode")


def created_at(value: str) -> datetime:
    """Any ISO 8601 form ``datetime.fromisoformat`` reads, with a timezone; returned in UTC."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        fail("", "created_at", "invalid ISO 8601 datetime")
    tz = parsed.tzinfo
    if tz is UTC:  # "Z" or "+00:00": nothing to convert
        return parsed
    if tz is None or parsed.utcoffset() is None:
        fail("", "created_at", "timezone required")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+01:00
        fail("", "created_at", "out of range")


def document(value: str) -> tuple[str, str]:
    try:
        return normalize_document(value)
    except ValueError as exc:
        fail("", "document", str(exc))


# -- metadata: stored as jsonb, from compact JSON text with every number as sent -------------


class _Unstorable(BulkRecorderError):
    """A metadata number numeric cannot hold (turned into its RecordError)."""


_UNSTORABLE: Final = (
    f"number out of range (at most {MAX_METADATA_INTEGER_DIGITS} digits before the point and "
    f"{MAX_METADATA_FRACTION_DIGITS} after)"
)


def storable_number(number: Decimal) -> bool:
    """True if PostgreSQL's numeric holds ``number`` (a finite Decimal) as written, by
    ``str(number)`` or in the JSON that :func:`~.schema.json_number` read it from: its digits
    before the point, once the exponent is applied, and its scale (trailing zeros count, as
    numeric keeps them). One rule by value, whether the number is written plainly or with an
    exponent: ``1e1001`` and ``1`` followed by 1,001 zeros alike. And the exponent itself,
    which PostgreSQL bounds as written, even on a zero (``0e1073741823``): json_number gives a
    number written with an exponent past that bound a Decimal exponent past it too."""
    exponent = number.as_tuple().exponent
    assert isinstance(exponent, int)  # JSON has no NaN or Infinity
    if exponent < -MAX_METADATA_FRACTION_DIGITS or exponent > MAX_METADATA_EXPONENT:
        return False
    return not number or number.adjusted() < MAX_METADATA_INTEGER_DIGITS


def _bounded_decimal(text: str) -> Decimal:
    number = json_number(text)
    if not storable_number(number):
        raise _Unstorable
    return number


# Metadata fractions are rare: the hook costs nothing for the usual strings and integers.
_PARSE_METADATA: Final = msgspec.json.Decoder(float_hook=_bounded_decimal).decode
# Every integer as a Decimal, whatever its digits (see metadata_from_raw).
_PARSE_LONG_INTEGERS: Final = json.JSONDecoder(parse_int=Decimal, parse_float=json_number).decode


def metadata_from_raw(raw: msgspec.Raw) -> str | None:
    """The metadata of a body that passed the schema (so it is JSON without lone surrogates)."""
    try:
        value = _PARSE_METADATA(raw)
    except _Unstorable:
        return metadata(PARSE(raw))  # NUL is reported before the number
    except msgspec.ValidationError:
        # An integer over the interpreter's digit limit, which only explain's canonical body
        # holds: a number written with a fraction or an exponent but whole, re-encoded as an
        # integer (1.000e16380 as 1 and 16,380 zeros), as jsonb stores it too. (A body with a
        # run of digits that long skips the first pass; explain refuses such an integer.)
        return metadata(_PARSE_LONG_INTEGERS(bytes(raw).decode()))
    if value is None:
        return None
    if type(value) is not dict:
        type_error("", "metadata", value, "an object or null")
    text = ENCODE(value)
    decoded = text.decode()
    # msgspec writes NUL as \u0000. (Searched in the str: `in` on bytes first tries the needle
    # as an int and raises inside, four times the cost of the search.)
    if "\\u0000" in decoded and _contains_nul(value):
        fail("", "metadata", "contains NUL")
    _check_size(text)
    return decoded


def metadata(value: Any, twin: Any = MISSING) -> str | None:
    """The metadata as parsed from any JSON (explain's path), every rule in the old order;
    ``twin`` as for storable_text."""
    if value is None:
        return None
    if type(value) is not dict:
        type_error("", "metadata", value, "an object or null")
    if _contains_nul(value):
        fail("", "metadata", "contains NUL")
    if _unstorable_number(value):
        fail("", "metadata", _UNSTORABLE)
    text = ENCODE(value)
    if twin is not MISSING and ENCODE(twin) != text:
        fail("", "metadata", "invalid unicode")
    return _sized(text)


def _check_size(text: bytes) -> None:
    if len(text) > MAX_METADATA_BYTES:
        fail("", "metadata", f"larger than {MAX_METADATA_BYTES} bytes serialized")


def _sized(text: bytes) -> str:
    _check_size(text)
    return text.decode()


def _children(node: Any) -> Any:
    return node.values() if type(node) is dict else node


def _unstorable_number(root: Any) -> bool:
    stack = [root]
    while stack:
        node = stack.pop()
        kind = type(node)
        if kind is dict or kind is list:
            stack.extend(_children(node))
        elif kind is Decimal and not storable_number(node):
            return True
    return False


def _contains_nul(root: Any) -> bool:
    """True if any string or key anywhere in ``root`` holds a NUL character."""
    stack = [root]
    while stack:
        node = stack.pop()
        if type(node) is dict:
            for k, v in node.items():
                if "\x00" in k:
                    return True
                stack.append(v)
        elif type(node) is list:
            stack.extend(node)
        elif type(node) is str and "\x00" in node:
            return True
    return False
