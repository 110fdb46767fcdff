"""The decoder before msgspec (hand-written field checks on the stdlib ``json``), kept verbatim as
the oracle of ``test_decode_differential.py``: the new decoder must give every body the same
verdict and the same reason. It is not used by the service.

Kept as code rather than frozen as a corpus of verdicts so that hypothesis can keep drawing new
bodies against it: a golden file can only replay the bodies it froze.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal
from operator import mul
from typing import Any, Final, NoReturn

from bulk_recorder.records import exact
from bulk_recorder.records.contract import (
    ANNOTATION_KINDS,
    DEFAULT_MAX_BODY_BYTES,
    MAX_ANNOTATION_REASON_LEN,
    MAX_CREDITOR_LEN,
    MAX_DEPTH,
    MAX_DESCRIPTION_LEN,
    MAX_METADATA_BYTES,
    MAX_METADATA_EXPONENT,
    MAX_METADATA_FRACTION_DIGITS,
    MAX_METADATA_INTEGER_DIGITS,
    MAX_OPERATIONS,
    OPERATION_TYPES,
    TRANSACTION_STATUSES,
    CreditAnnotation,
    JsonObject,
    Operation,
    Record,
    RecordError,
    Transaction,
)

# ---------------------------------------------------------------------------------------------
# Documents (documents.py as it was)

CPF: Final = "CPF"
CNPJ: Final = "CNPJ"

# Punctuation accepted (and dropped) in formatted documents, e.g. "12.ABC.345/01DE-35".
_STRIP_TABLE: Final = str.maketrans("", "", ".-/ ")
# A formatted CNPJ has 18 characters; anything much longer is not a document (and is not worth
# scanning).
_MAX_RAW_LEN: Final = 64

_CPF_RE: Final = re.compile(r"[0-9]{11}")
_CNPJ_RE: Final = re.compile(r"[0-9A-Z]{12}[0-9]{2}")

_CPF_W1: Final[tuple[int, ...]] = (10, 9, 8, 7, 6, 5, 4, 3, 2)
_CPF_W2: Final[tuple[int, ...]] = (11, 10, 9, 8, 7, 6, 5, 4, 3, 2)
_CNPJ_W1: Final[tuple[int, ...]] = (5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2)
_CNPJ_W2: Final[tuple[int, ...]] = (6, 5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2)

FORMAT_ERROR: Final = "must be a CPF (11 digits) or CNPJ (14 characters)"


def _check_digit(codes: bytes, weights: tuple[int, ...]) -> int:
    """DV for ``codes`` (ASCII codes of the characters): sum of (code - 48) * weight, mod 11."""
    # sum((c - 48) * w) == sum(c * w) - 48 * sum(w): one C-level pass, no per-character Python.
    total = sum(map(mul, codes, weights)) - 48 * sum(weights)
    remainder = total % 11
    return 0 if remainder < 2 else 11 - remainder


def _valid(codes: bytes, w1: tuple[int, ...], w2: tuple[int, ...]) -> bool:
    n = len(w1)
    return codes[n] - 48 == _check_digit(codes, w1) and codes[n + 1] - 48 == _check_digit(codes, w2)


def normalize_document(raw: str) -> tuple[str, str]:
    """Return ``(normalized, "CPF" | "CNPJ")`` for a CPF or CNPJ, formatted or not.

    ``normalized`` has no punctuation and is upper case: ``"529.982.247-25"`` becomes
    ``("52998224725", "CPF")`` and ``"12.abc.345/01de-35"`` becomes ``("12ABC34501DE35", "CNPJ")``.
    Raises ``ValueError`` with a short, ASCII message (no field name) when the text is not a
    document, its check digits are wrong or all its characters are the same.
    """
    if len(raw) > _MAX_RAW_LEN or not raw.isascii():
        raise ValueError(FORMAT_ERROR)
    doc = raw.translate(_STRIP_TABLE).upper()
    if len(doc) == 11 and _CPF_RE.fullmatch(doc):
        kind, w1, w2 = CPF, _CPF_W1, _CPF_W2
    elif len(doc) == 14 and _CNPJ_RE.fullmatch(doc):
        kind, w1, w2 = CNPJ, _CNPJ_W1, _CNPJ_W2
    else:
        raise ValueError(FORMAT_ERROR)
    if doc.count(doc[0]) == len(doc):
        raise ValueError(f"invalid {kind} (all characters identical)")
    if not _valid(doc.encode("ascii"), w1, w2):
        raise ValueError(f"invalid {kind} check digits")
    return doc, kind


# ---------------------------------------------------------------------------------------------
# Parsing

_MISSING: Final = object()

_UUID_MATCH: Final = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
).fullmatch
_ASSET_MATCH: Final = re.compile(r"[A-Z][A-Z0-9]{0,9}").fullmatch
# Exactly what numeric(38,18) stores without rounding: 20 integer digits, 18 decimals.
_AMOUNT_MATCH: Final = re.compile(r"[0-9]{1,20}(?:\.[0-9]{1,18})?").fullmatch
# Looser shape, only used to explain why an amount failed the strict pattern.
_NUMBER_MATCH: Final = re.compile(r"(-?)([0-9]+)(?:\.([0-9]+))?").fullmatch
_DATE_MATCH: Final = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}").fullmatch
# A JSON escape of a UTF-16 surrogate (\uD800-\uDFFF): the only way a lone surrogate can get
# into a decoded string, since the body itself was valid UTF-8.
_SURROGATE_ESCAPE_SEARCH: Final = re.compile(r"\\u[dD][89abcdefABCDEF]").search

_AMOUNT_LIMIT: Final = 10**20
_ZERO: Final = exact.ZERO
# Sums of up to 1000 amounts of 20 + 18 digits need 42 digits: far beyond the default 28.
_sum_add: Final = exact.add


def _reject_constant(name: str) -> NoReturn:
    """NaN and +-Infinity are not JSON (and jsonb refuses them)."""
    raise ValueError(f"{name} is not valid JSON")


def _json_number(text: str) -> Decimal:
    """A JSON number with a fraction or exponent as a Decimal. PostgreSQL reads the exponent
    as written and refuses one beyond MAX_METADATA_EXPONENT either way, even on a zero (and
    Decimal cannot hold 1e99999999999999999999): such a number becomes a zero with the first
    exponent refused, which the metadata rule refuses and an amount calls a float."""
    mantissa, _, exponent = text.upper().partition("E")
    written = exponent.lstrip("+-").lstrip("0")
    if len(written) > len(str(MAX_METADATA_EXPONENT)) or int(written or 0) > MAX_METADATA_EXPONENT:
        refused = MAX_METADATA_EXPONENT + 1
        return Decimal((mantissa[0] == "-", (0,), -refused if exponent[0] == "-" else refused))
    return Decimal(text)


# Prebuilt: json.loads/json.dumps with keyword arguments build a new decoder/encoder per call.
# JSON numbers with a fraction or exponent become Decimal, never float: a float would round
# metadata such as 0.30000000000000000001 silently (PostgreSQL's jsonb keeps it exact), and an
# amount given as a JSON number is refused anyway. The hook runs only for such tokens.
_JSON_DECODE: Final[Callable[[str], Any]] = json.JSONDecoder(
    parse_constant=_reject_constant, parse_float=_json_number
).decode
# Compact, UTF-8 kept as is; allow_nan=False turns an overflowed number (inf) into ValueError.
_METADATA_ENCODE: Final[Callable[[Any], str]] = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode


def _depth_exceeds(root: Any, limit: int) -> bool:
    """True if objects/arrays in ``root`` nest deeper than ``limit`` levels (no recursion)."""
    stack: list[tuple[Any, int]] = [(root, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        if depth > limit:
            return True
        children = node.values() if type(node) is dict else node
        for child in children:
            if type(child) is dict or type(child) is list:
                push((child, depth + 1))
    return False


def _parse(body: bytes, max_bytes: int) -> tuple[JsonObject, bool, bool]:
    """Body -> (JSON object, may contain NUL, may contain lone surrogates)."""
    size = len(body)
    if size > max_bytes:
        raise RecordError(f"body too large ({size} bytes > {max_bytes})")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise RecordError("body is not valid UTF-8") from None
    try:
        data = _JSON_DECODE(text)
    except RecursionError:
        raise RecordError(f"JSON nesting deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # json.JSONDecodeError, NaN/Infinity, integers over 4300 digits
        raise RecordError("invalid JSON") from None
    if type(data) is not dict:
        raise RecordError("body must be a JSON object")
    # Cheap bound first: nesting can't exceed the number of opening brackets.
    if text.count("{") + text.count("[") > MAX_DEPTH and _depth_exceeds(data, MAX_DEPTH):
        raise RecordError(f"JSON nesting deeper than {MAX_DEPTH} levels")
    escapes = "\\u" in text
    maybe_nul = escapes and "\\u0000" in text
    maybe_surrogate = escapes and _SURROGATE_ESCAPE_SEARCH(text) is not None
    return data, maybe_nul, maybe_surrogate


# ---------------------------------------------------------------------------------------------
# Field checks. Each returns the clean value or raises RecordError; `where` is the prefix of the
# field name in messages ("" or "operations[3].").


def _fail(where: str, key: str, message: str) -> NoReturn:
    raise RecordError(f"{where}{key}: {message}")


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        Decimal: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _type_error(where: str, key: str, value: Any, expected: str) -> NoReturn:
    if value is _MISSING:
        _fail(where, key, "missing")
    _fail(where, key, f"must be {expected}, not {_kind_of(value)}")


def _uuid(obj: JsonObject, key: str, where: str = "") -> str:
    value = obj.get(key, _MISSING)
    if type(value) is str and _UUID_MATCH(value):
        return value.lower()
    if type(value) is str:
        _fail(where, key, "invalid UUID")
    _type_error(where, key, value, "a string")


def _opt_uuid(obj: JsonObject, key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    return _uuid(obj, key)


def _choice(obj: JsonObject, key: str, allowed: frozenset[str], where: str = "") -> str:
    value = obj.get(key, _MISSING)
    if type(value) is str and value in allowed:
        return value
    if type(value) is str:
        _fail(where, key, "must be one of " + ", ".join(sorted(allowed)))
    _type_error(where, key, value, "a string")


def _asset(obj: JsonObject, key: str, where: str = "") -> str:
    value = obj.get(key, _MISSING)
    if type(value) is str and _ASSET_MATCH(value):
        return value
    _bad_asset(where, key, value)


def _bad_asset(where: str, key: str, value: Any) -> NoReturn:
    if type(value) is str:
        _fail(where, key, "must be 1-10 upper-case letters or digits, starting with a letter")
    _type_error(where, key, value, "a string")


def _amount(obj: JsonObject, key: str, positive: bool, where: str = "") -> Decimal:
    """An exact decimal from a JSON string ("1050.25") or integer (1000), never a float."""
    value = obj.get(key, _MISSING)
    kind = type(value)
    if kind is str and _AMOUNT_MATCH(value):
        amount = Decimal(value)
        if positive and not amount:
            _fail(where, key, "must be > 0")
        return amount
    if kind is int and 0 <= value < _AMOUNT_LIMIT:
        if positive and not value:
            _fail(where, key, "must be > 0")
        return Decimal(value)
    _bad_amount(where, key, value, positive)


def _bad_amount(where: str, key: str, value: Any, positive: bool) -> NoReturn:
    sign_error = "must be > 0" if positive else "must be >= 0"
    kind = type(value)
    if kind is int:
        _fail(where, key, sign_error if value < 0 else "out of range")
    if kind is Decimal or kind is float:
        _fail(where, key, "must be a decimal string or integer, not a float")
    if kind is not str:
        _type_error(where, key, value, "a decimal string or integer")
    match = _NUMBER_MATCH(value)
    if match is None:
        _fail(where, key, "invalid decimal (expected digits with an optional '.' fraction)")
    if match[1]:
        _fail(where, key, sign_error)
    if len(match[2]) > 20:
        _fail(where, key, "out of range")
    _fail(where, key, "more than 18 decimal places")


def _text(
    obj: JsonObject, key: str, max_len: int, maybe_surrogate: bool, *, blank_ok: bool = True
) -> str:
    value = obj.get(key, _MISSING)
    if type(value) is not str:
        _type_error("", key, value, "a string")
    if len(value) > max_len:
        _fail("", key, f"longer than {max_len} characters")
    if "\x00" in value:
        _fail("", key, "contains NUL")
    if maybe_surrogate and not _encodable(value):
        _fail("", key, "invalid unicode")
    if not blank_ok and not value.strip():
        _fail("", key, "must not be blank")
    return value


def _opt_text(obj: JsonObject, key: str, max_len: int, maybe_surrogate: bool) -> str | None:
    if obj.get(key) is None:
        return None
    return _text(obj, key, max_len, maybe_surrogate)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _created_at(obj: JsonObject) -> datetime | None:
    value = obj.get("created_at")
    if value is None:
        return None
    if type(value) is not str:
        _type_error("", "created_at", value, "a string")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        _fail("", "created_at", "invalid ISO 8601 datetime")
    if parsed.utcoffset() is None:
        _fail("", "created_at", "timezone required")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+01:00
        _fail("", "created_at", "out of range")


def _occurred_on(obj: JsonObject) -> date:
    value = obj.get("occurred_on", _MISSING)
    if type(value) is not str:
        _type_error("", "occurred_on", value, "a string")
    if _DATE_MATCH(value):
        try:
            return date.fromisoformat(value)
        except ValueError:
            pass
    _fail("", "occurred_on", "invalid date (expected YYYY-MM-DD)")


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


def _metadata(obj: JsonObject, maybe_nul: bool, maybe_surrogate: bool) -> str | None:
    value = obj.get("metadata")
    if value is None:
        return None
    if type(value) is not dict:
        _type_error("", "metadata", value, "an object or null")
    if maybe_nul and _contains_nul(value):
        _fail("", "metadata", "contains NUL")
    try:
        text = _METADATA_ENCODE(value)
    except TypeError:  # it holds Decimal numbers: write them digit for digit
        text = _exact_json(value)
    if maybe_surrogate and not _encodable(text):
        _fail("", "metadata", "invalid unicode")
    if len(text) > MAX_METADATA_BYTES or (
        not text.isascii() and len(text.encode("utf-8")) > MAX_METADATA_BYTES
    ):
        _fail("", "metadata", f"larger than {MAX_METADATA_BYTES} bytes serialized")
    return text


def _exact_json(value: Any) -> str:
    """Compact JSON like ``_METADATA_ENCODE``, writing Decimal numbers exactly as parsed."""
    kind = type(value)
    if kind is Decimal:
        text = str(value)
        mantissa, _, exp = text.upper().partition("E")
        digits, _, fraction = mantissa.lstrip("-").partition(".")
        point = int(exp or 0) - len(fraction)  # value: (digits + fraction) * 10**point
        significant = (digits + fraction).lstrip("0")
        whole = max(0, len(significant) + point) if significant else 0
        if (
            -point > MAX_METADATA_FRACTION_DIGITS
            or whole > MAX_METADATA_INTEGER_DIGITS
            or point > MAX_METADATA_EXPONENT  # a zero: PostgreSQL bounds its exponent too
        ):
            _fail(
                "",
                "metadata",
                f"number out of range (at most {MAX_METADATA_INTEGER_DIGITS} digits before the "
                f"point and {MAX_METADATA_FRACTION_DIGITS} after)",
            )
        return text
    if kind is dict:
        items = (f"{_METADATA_ENCODE(k)}:{_exact_json(v)}" for k, v in value.items())
        return "{" + ",".join(items) + "}"
    if kind is list:
        return "[" + ",".join(_exact_json(v) for v in value) + "]"
    return _METADATA_ENCODE(value)


logger = logging.getLogger("bulk_recorder.records")  # the name logs have always carried

# ---------------------------------------------------------------------------------------------
# Record builders


def _operations_array(obj: JsonObject) -> list[Any]:
    raw_ops = obj.get("operations", _MISSING)
    if type(raw_ops) is not list:
        _type_error("", "operations", raw_ops, "an array")
    if len(raw_ops) < 2:
        _fail("", "operations", "at least 2 required")
    if len(raw_ops) > MAX_OPERATIONS:
        _fail("", "operations", f"at most {MAX_OPERATIONS} allowed")
    return raw_ops


def _transaction(obj: JsonObject, maybe_nul: bool, maybe_surrogate: bool) -> Transaction:
    tx_id = _uuid(obj, "id")
    organization_id = _uuid(obj, "organization_id")
    ledger_id = _uuid(obj, "ledger_id")
    description = _opt_text(obj, "description", MAX_DESCRIPTION_LEN, maybe_surrogate)
    status = _choice(obj, "status", TRANSACTION_STATUSES)
    asset_code = _asset(obj, "asset_code")
    amount = _amount(obj, "amount", True)
    created_at = _created_at(obj)
    metadata = _metadata(obj, maybe_nul, maybe_surrogate)

    raw_ops = _operations_array(obj)
    operations: list[Operation] = []
    seen_ids = {tx_id}
    debits = credits = _ZERO
    for index, raw in enumerate(raw_ops):
        where = f"operations[{index}]."
        if type(raw) is not dict:
            _type_error("", f"operations[{index}]", raw, "an object")
        op_id = _uuid(raw, "id", where)
        if op_id in seen_ids:
            _fail(where, "id", "same as the transaction id" if op_id == tx_id else "duplicate")
        seen_ids.add(op_id)
        account_id = _uuid(raw, "account_id", where)
        op_type = _choice(raw, "type", OPERATION_TYPES, where)
        op_amount = _amount(raw, "amount", True, where)
        op_asset = raw.get("asset_code", _MISSING)
        if op_asset != asset_code:  # equal to the (valid) transaction asset is the happy path
            if type(op_asset) is not str or not _ASSET_MATCH(op_asset):
                _bad_asset(where, "asset_code", op_asset)
            _fail(where, "asset_code", f"{op_asset} != transaction asset {asset_code}")
        if op_type == "DEBIT":
            debits = _sum_add(debits, op_amount)
        else:
            credits = _sum_add(credits, op_amount)
        operations.append(Operation(op_id, account_id, op_type, op_amount, asset_code))

    if debits != credits:
        raise RecordError(f"debits {debits:f} != credits {credits:f}")
    if debits != amount:
        raise RecordError(f"debits {debits:f} and credits {credits:f} != amount {amount:f}")

    return Transaction(
        tx_id,
        organization_id,
        ledger_id,
        description,
        status,
        asset_code,
        amount,
        created_at,
        metadata,
        tuple(operations),
    )


def _credit_annotation(obj: JsonObject, maybe_nul: bool, maybe_surrogate: bool) -> CreditAnnotation:
    annotation_id = _uuid(obj, "id")
    job_id = _opt_uuid(obj, "job_id")
    raw_document = obj.get("document", _MISSING)
    if type(raw_document) is not str:
        _type_error("", "document", raw_document, "a string")
    try:
        document, document_type = normalize_document(raw_document)
    except ValueError as exc:
        _fail("", "document", str(exc))
    kind = _choice(obj, "kind", ANNOTATION_KINDS)
    creditor = _text(obj, "creditor", MAX_CREDITOR_LEN, maybe_surrogate, blank_ok=False)
    amount = _amount(obj, "amount", False)
    occurred_on = _occurred_on(obj)
    reason = _opt_text(obj, "reason", MAX_ANNOTATION_REASON_LEN, maybe_surrogate)
    return CreditAnnotation(
        annotation_id,
        job_id,
        document,
        document_type,
        kind,
        creditor,
        amount,
        occurred_on,
        reason,
    )


_BUILDERS: Final[dict[str, Callable[[JsonObject, bool, bool], Record]]] = {
    "transaction": _transaction,
    "credit_annotation": _credit_annotation,
}


def decode(
    body: bytes, record_type: str | None, *, max_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> Record:
    """Decode and validate one message body.

    ``record_type`` is the AMQP ``type`` property and is authoritative (a ``type`` field in the
    body, if any, is ignored). Raises :class:`RecordError` and nothing else: unknown or missing
    type, oversized body, bad UTF-8, bad JSON, nesting deeper than 32 levels, or a record that
    breaks the rules of docs/messages.md.
    """
    if not record_type:
        raise RecordError("missing type property")
    builder = _BUILDERS.get(record_type)
    if builder is None:
        raise RecordError(f"unknown type: {record_type[:64]}")
    try:
        obj, maybe_nul, maybe_surrogate = _parse(body, max_bytes)
        return builder(obj, maybe_nul, maybe_surrogate)
    except RecordError:
        raise
    except Exception as exc:  # a bug here must dead-letter one message, not kill the consumer
        logger.warning("unexpected error decoding a %s message: %r", record_type, exc)
        logger.debug("decode failure", exc_info=True)
        raise RecordError(f"internal error while decoding: {type(exc).__name__}") from exc
