"""The slow path of ``decode``: why a body failed the one-pass decode, in the contract's words.

msgspec stops at the first error in the order the body's keys arrive and words it its own way;
the contract reports the first failure in field order (``id`` before ``status`` before
``operations``), with the reasons of docs/messages.md. So when the one pass fails, the body is
parsed again as any JSON, the body-level checks run (JSON, object, nesting), then each field is
checked alone against its type in :mod:`bulk_recorder.records.schema`, in the schema's order,
interleaved with the Python rules, and msgspec's message is mapped to ours.

Some bodies fail msgspec's pass yet are valid: a repeated key whose earlier value was invalid
(the last one counts, as in the stdlib) or a lone surrogate in a field nobody reads. When no
field fails, :func:`canonical_body` returns the body re-encoded from the parsed value, for the
one pass to decode.
"""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec
from msgspec import inspect

from bulk_recorder.records import rules
from bulk_recorder.records.contract import MAX_DEPTH, RecordError
from bulk_recorder.records.rules import MISSING, fail, kind_of, type_error
from bulk_recorder.records.schema import (
    ASSET_PATTERN,
    ENCODE,
    NOT_BLANK_PATTERN,
    PARSE,
    CreditAnnotationIn,
    OperationIn,
    TransactionIn,
)

__all__ = ["canonical_body", "check_depth", "sorted_json"]

_PATTERN_REASONS: Final = {  # a UUID's reason is _uuid's: its pattern is checked in rules
    ASSET_PATTERN: "must be 1-10 upper-case letters or digits, starting with a letter",
    NOT_BLANK_PATTERN: "must not be blank",
}
# A JSON escape of a UTF-16 surrogate: a pair, or one alone, or any other escape (consumed so
# that an escaped backslash before "u" is not read as an escape).
_ESCAPE: Final = re.compile(
    rb"\\(?:u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}"
    rb"|(u[dD][89a-fA-F][0-9a-fA-F]{2})|.)",
    re.DOTALL,
)
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]").search
_LENGTH: Final = re.compile(r"of length ([<>]=) ([0-9]+)").search


def _fields(struct: type[msgspec.Struct]) -> dict[str, tuple[Any, bool, inspect.Type]]:
    return {
        f.name: (f.type, f.required, inspect.type_info(f.type))
        for f in msgspec.structs.fields(struct)
    }


_SCHEMA: Final = {s: _fields(s) for s in (TransactionIn, OperationIn, CreditAnnotationIn)}
_TX, _OP, _ANN = _SCHEMA[TransactionIn], _SCHEMA[OperationIn], _SCHEMA[CreditAnnotationIn]


def canonical_body(body: bytes, record_type: str) -> bytes:
    """Raise the contract's reason for ``body`` (UTF-8 already checked), or return it re-encoded
    canonically if it breaks no field rule (the sums are left to the caller)."""
    tree, twin = _parse_any(body)
    if type(tree) is not dict:
        raise RecordError("body must be a JSON object")
    if body.count(b"{") + body.count(b"[") > MAX_DEPTH and _depth_exceeds(tree, MAX_DEPTH):
        raise RecordError(f"JSON nesting deeper than {MAX_DEPTH} levels")
    if record_type == "transaction":
        _transaction(tree, twin)
    else:
        _credit_annotation(tree, twin)
    return ENCODE(tree)


def check_depth(body: bytes) -> None:
    """Raise if ``body`` (JSON that msgspec's pass read) nests deeper than MAX_DEPTH."""
    if _depth_exceeds(PARSE(body), MAX_DEPTH):
        raise RecordError(f"JSON nesting deeper than {MAX_DEPTH} levels")


_ENCODE_SORTED: Final = msgspec.json.Encoder(decimal_format="number", order="sorted").encode


def sorted_json(body: bytes) -> bytes:
    """The body's JSON compact with sorted keys, every number as sent (``decode`` accepted it):
    the same bytes however the body is spaced or its keys ordered. (But for an exponent that
    PostgreSQL refuses, which only a field nobody reads can hold: written as ``json_number``
    reads it, a zero with the first exponent refused.)"""
    return _ENCODE_SORTED(_parse_any(body)[0])


def _parse_any(body: bytes) -> tuple[Any, Any]:
    """Any JSON, and its twin: None, or -- when the body holds lone surrogates, which msgspec
    refuses -- the same JSON read with each lone surrogate as another stand-in character. A
    string that differs between the two held a lone surrogate; one that is equal did not."""
    try:
        return PARSE(body), None
    except RecursionError:
        raise RecordError(f"JSON nesting deeper than {MAX_DEPTH} levels") from None
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # Validation: int digit limit
        if not (isinstance(exc, msgspec.DecodeError) and _SURROGATE_ESCAPE(body)):
            raise RecordError("invalid JSON") from None
    return _with_stand_in(body, rb"\ue000"), _with_stand_in(body, rb"\ue001")


def _with_stand_in(body: bytes, escape: bytes) -> Any:
    try:
        return PARSE(_ESCAPE.sub(lambda m: escape if m[1] else m[0], body))
    except RecursionError:
        raise RecordError(f"JSON nesting deeper than {MAX_DEPTH} levels") from None
    except (msgspec.DecodeError, msgspec.ValidationError):
        raise RecordError("invalid JSON") from None


def _depth_exceeds(root: Any, limit: int) -> bool:
    """True if objects/arrays in ``root`` nest deeper than ``limit`` levels (no recursion)."""
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if type(node) is dict else node:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return False


# -- one field against its schema type -------------------------------------------------------


def _field(
    obj: dict[str, Any], schema: dict[str, Any], key: str, where: str = "", invalid: str = ""
) -> Any:
    """The value of ``key`` if it passes its schema type; ``invalid`` words any failure that is
    not one of JSON type."""
    kind, required, info = schema[key]
    value = obj.get(key, MISSING)
    if value is MISSING:
        if required:
            fail(where, key, "missing")
        return None
    try:
        msgspec.convert(value, kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        if invalid and ", got `" not in message:
            fail(where, key, invalid)
        fail(where, key, _reason(info, value, message))
    return value


def _uuid(obj: dict[str, Any], schema: dict[str, Any], key: str, where: str = "") -> Any:
    value = _field(obj, schema, key, where, "invalid UUID")
    if value is not None and not rules.uuids(value):
        fail(where, key, "invalid UUID")
    return value


def _reason(info: inspect.Type, value: Any, message: str) -> str:
    """msgspec's message for one value against one type -> the contract's words."""
    info = _bare(info)
    if isinstance(info, inspect.UnionType):  # X | None: the value was not null
        info = _bare(next(t for t in info.types if not isinstance(t, inspect.NoneType)))
    if ", got `" in message:
        return f"must be {_expected(info)}, not {kind_of(value)}"
    if isinstance(info, inspect.LiteralType):
        return "must be one of " + ", ".join(sorted(map(str, info.values)))
    if isinstance(info, inspect.DateType):
        return "invalid date (expected YYYY-MM-DD)"
    length = _LENGTH(message)
    if length and isinstance(info, inspect.ListType):
        bound = length[2]
        return f"at least {bound} required" if length[1] == ">=" else f"at most {bound} allowed"
    if length:
        return f"longer than {length[2]} characters"
    if isinstance(info, inspect.StrType) and info.pattern in _PATTERN_REASONS:
        return _PATTERN_REASONS[info.pattern]
    return message  # pragma: no cover - a constraint added to the schema without its words


def _bare(info: inspect.Type) -> inspect.Type:
    """The type without its documentation (description, examples)."""
    return info.type if isinstance(info, inspect.Metadata) else info


def _expected(info: inspect.Type) -> str:
    if isinstance(info, inspect.ListType):
        return "an array"
    if isinstance(info, inspect.StructType | inspect.DictType):
        return "an object"
    return "a string"


def _text(obj: dict[str, Any], schema: dict[str, Any], key: str, twin: Any) -> None:
    value = _field(obj, schema, key)
    if value is not None:
        rules.storable_text(value, key, None if twin is None else twin.get(key))


# -- the records, field by field in schema order ---------------------------------------------


def _transaction(obj: dict[str, Any], twin: Any) -> None:
    tx_id = _uuid(obj, _TX, "id").lower()
    _uuid(obj, _TX, "organization_id")
    _uuid(obj, _TX, "ledger_id")
    _text(obj, _TX, "description", twin)
    _field(obj, _TX, "status")
    asset_code = _field(obj, _TX, "asset_code")
    rules.amount(obj.get("amount", MISSING), True)
    created_at = _field(obj, _TX, "created_at")
    if created_at is not None:
        rules.created_at(created_at)
    rules.metadata(obj.get("metadata"), MISSING if twin is None else twin.get("metadata"))
    _operations(obj, tx_id, asset_code)


def _operations(obj: dict[str, Any], tx_id: str, asset_code: str) -> None:
    raw_ops = obj.get("operations", MISSING)
    info = _bare(_TX["operations"][2])
    assert isinstance(info, inspect.ListType)
    if type(raw_ops) is not list:
        type_error("", "operations", raw_ops, "an array")
    if info.min_length is not None and len(raw_ops) < info.min_length:
        fail("", "operations", f"at least {info.min_length} required")
    if info.max_length is not None and len(raw_ops) > info.max_length:
        fail("", "operations", f"at most {info.max_length} allowed")
    seen_ids = {tx_id}
    for index, raw in enumerate(raw_ops):
        where = f"operations[{index}]."
        if type(raw) is not dict:
            type_error("", f"operations[{index}]", raw, "an object")
        op_id = _uuid(raw, _OP, "id", where).lower()
        if op_id in seen_ids:
            fail(where, "id", "same as the transaction id" if op_id == tx_id else "duplicate")
        seen_ids.add(op_id)
        _uuid(raw, _OP, "account_id", where)
        _field(raw, _OP, "type", where)
        rules.amount(raw.get("amount", MISSING), True, where)
        rules.operation_asset(_field(raw, _OP, "asset_code", where), asset_code, where)


def _credit_annotation(obj: dict[str, Any], twin: Any) -> None:
    _uuid(obj, _ANN, "id")
    _uuid(obj, _ANN, "job_id")
    rules.document(_field(obj, _ANN, "document"))
    _field(obj, _ANN, "kind")
    _text(obj, _ANN, "creditor", twin)
    rules.amount(obj.get("amount", MISSING), False)
    _field(obj, _ANN, "occurred_on")
    _text(obj, _ANN, "reason", twin)
