"""The wire format of docs/messages.md as msgspec types: one schema, checked in C.

msgspec decodes a body into these structs and checks JSON types, required fields, enumerations,
UUID and asset-code patterns, text lengths and the number of operations in the same pass, so a
valid message costs one parse and no per-field Python. What no schema states stays in Python
(:mod:`bulk_recorder.records.rules`): CPF/CNPJ check digits, the double-entry sums, and the
exact-decimal rules of amounts -- which is why amounts are declared ``str | int`` here (a JSON
float never becomes a Python float: it fails this type and is explained as a float) and
metadata is kept as raw JSON text, re-read with every fraction as a ``Decimal``.

Field order is the order in which rules are checked and a failure reported
(:mod:`bulk_recorder.records.explain` walks the fields in this order).
"""

from __future__ import annotations

from datetime import date
from decimal import Decimal
from typing import Annotated, Any, Final, Literal

import msgspec

from bulk_recorder.records import published
from bulk_recorder.records.contract import (
    MAX_ANNOTATION_REASON_LEN,
    MAX_CREDITOR_LEN,
    MAX_DESCRIPTION_LEN,
    MAX_METADATA_EXPONENT,
    MAX_OPERATIONS,
)

__all__ = [
    "BODY_DECODERS",
    "ENCODE",
    "PARSE",
    "STRICT_DECODERS",
    "CreditAnnotationIn",
    "OperationIn",
    "TransactionIn",
    "json_number",
]

# msgspec patterns are searched, not matched: anchor both ends (\Z, since $ also matches before
# a final newline).
UUID_PATTERN: Final = f"^{published.UUID}\\Z"
ASSET_PATTERN: Final = f"^{published.ASSET}\\Z"
NOT_BLANK_PATTERN: Final = r"\S"  # \S is "not str.isspace()", the test str.strip() uses
# What the OpenAPI document publishes (:mod:`.published`): JSON Schema's regex dialect has no
# \Z, and its $ matches only at the end.
_PUBLISHED_UUID: Final = published.anchored(published.UUID)
_PUBLISHED_ASSET: Final = published.anchored(published.ASSET)

# msgspec checks a ``pattern`` by calling Python's re once per field: seven calls per
# transaction were two thirds of its pass. So the schema checks a UUID's length here and
# rules.uuids its shape, every id of a record at once (the pattern is published all the same).
Uuid = Annotated[
    str,
    msgspec.Meta(
        min_length=36,
        max_length=36,
        extra_json_schema={"format": "uuid", "pattern": _PUBLISHED_UUID},
    ),
]
AssetCode = Annotated[
    str,
    msgspec.Meta(
        pattern=ASSET_PATTERN, extra_json_schema=published.override({"pattern": _PUBLISHED_ASSET})
    ),
]
# An operation's asset must equal its transaction's (valid) one: rules.operation_asset.
OperationAsset = Annotated[str, msgspec.Meta(extra_json_schema={"pattern": _PUBLISHED_ASSET})]
# An exact decimal as a JSON string or integer; its digit limits and sign are rules.amount's.
Amount = Annotated[
    str | int,
    msgspec.Meta(
        examples=["150.00"],
        extra_json_schema=published.override(published.amount_schema(positive=False)),
    ),
]
PositiveAmount = Annotated[
    str | int,
    msgspec.Meta(
        examples=["150.00"],
        extra_json_schema=published.override(published.amount_schema(positive=True)),
    ),
]
# Text PostgreSQL can store (no NUL): rules.storable_text.
Text = msgspec.Meta(extra_json_schema={"pattern": published.TEXT})
Metadata = Annotated[
    msgspec.Raw,  # kept as sent; rules.metadata wants an object (or null) and keeps its numbers
    msgspec.Meta(
        description="A JSON object (or null), stored as jsonb with its numbers digit for digit.",
        extra_json_schema={
            "anyOf": [
                {"$ref": published.COMPONENT_REF.format(name="MetadataObject")},
                {"type": "null"},
            ]
        },
    ),
]


_DATE_TIME: Final = msgspec.Meta(
    extra_json_schema={"format": "date-time", "pattern": published.date_time_pattern()}
)


def _null() -> msgspec.Raw:
    return msgspec.Raw(b"null")


class OperationIn(msgspec.Struct, kw_only=True, gc=False):
    """One leg of a transaction."""

    id: Uuid
    account_id: Uuid
    type: Literal["DEBIT", "CREDIT"]
    amount: PositiveAmount
    asset_code: OperationAsset


class TransactionIn(msgspec.Struct, kw_only=True, gc=False):
    """A ledger transaction: debits sum to credits sum to ``amount``, every amount > 0."""

    id: Uuid
    organization_id: Uuid
    ledger_id: Uuid
    description: Annotated[str, msgspec.Meta(max_length=MAX_DESCRIPTION_LEN), Text] | None = None
    status: Literal["PENDING", "APPROVED", "CANCELED"]
    asset_code: AssetCode
    amount: PositiveAmount
    # ISO 8601 as datetime.fromisoformat reads it, with a timezone: rules.created_at.
    created_at: Annotated[str, _DATE_TIME] | None = None
    metadata: Metadata = msgspec.field(default_factory=_null)
    # Two equal legs share an id: uniqueItems is as far as JSON Schema can say "distinct ids".
    operations: Annotated[
        list[OperationIn],
        msgspec.Meta(
            min_length=2, max_length=MAX_OPERATIONS, extra_json_schema={"uniqueItems": True}
        ),
    ]


class CreditAnnotationIn(msgspec.Struct, kw_only=True, gc=False):
    """One job line. ``job_id`` is ignored: every line gets the job's id."""

    id: Uuid
    job_id: Uuid | None = None
    document: Annotated[  # the check digits: documents.normalize_document
        str,
        msgspec.Meta(
            description="CPF (11 digits) or CNPJ (14 characters, numeric or alphanumeric) with "
            "valid check digits; punctuation (. - / space) allowed. The pattern states the "
            "shape; the check digits no schema can state.",
            examples=["529.982.247-25", "12.ABC.345/01DE-35"],
            extra_json_schema={
                "pattern": published.anchored(published.DOCUMENT),
                "maxLength": published.MAX_DOCUMENT_LEN,
            },
        ),
    ]
    kind: Literal["RESTRICTION", "RELEASE"]
    creditor: Annotated[
        str,
        msgspec.Meta(
            max_length=MAX_CREDITOR_LEN,
            pattern=NOT_BLANK_PATTERN,
            description="Not blank: at least one character that is not white space.",
            extra_json_schema=published.override({"pattern": published.NOT_BLANK_TEXT}),
        ),
    ]
    amount: Amount
    occurred_on: Annotated[  # YYYY-MM-DD, a real date
        date, msgspec.Meta(extra_json_schema={"pattern": published.anchored(published.DATE)})
    ]
    reason: Annotated[str, msgspec.Meta(max_length=MAX_ANNOTATION_REASON_LEN), Text] | None = None


# The decode pass's own structs: the same fields, but an unknown one fails the pass (the body
# then goes to explain, which ignores it, as the contract does). msgspec skips an unknown
# field's value unread, however deep it nests; with none, the only JSON nested past the
# operations is the metadata, so the nesting bound is checked on it alone, not on the body.
class StrictOperationIn(OperationIn, kw_only=True, gc=False, forbid_unknown_fields=True):
    pass


class StrictTransactionIn(TransactionIn, kw_only=True, gc=False, forbid_unknown_fields=True):
    # Read-only here (the builders only read it): a list of the subclass is safe.
    operations: Annotated[  # type: ignore[assignment]
        list[StrictOperationIn], msgspec.Meta(min_length=2, max_length=MAX_OPERATIONS)
    ]


class StrictCreditAnnotationIn(
    CreditAnnotationIn, kw_only=True, gc=False, forbid_unknown_fields=True
):
    pass


# The first pass over a body (known fields only), and the pass over explain's canonical body
# (which keeps unknown fields).
STRICT_DECODERS: Final[dict[str, msgspec.json.Decoder[Any]]] = {
    "transaction": msgspec.json.Decoder(StrictTransactionIn),
    "credit_annotation": msgspec.json.Decoder(StrictCreditAnnotationIn),
}
BODY_DECODERS: Final[dict[str, msgspec.json.Decoder[Any]]] = {
    "transaction": msgspec.json.Decoder(TransactionIn),
    "credit_annotation": msgspec.json.Decoder(CreditAnnotationIn),
}


def json_number(text: str) -> Decimal:
    """A JSON number with a fraction or an exponent, as msgspec hands it over (the text as
    written, its syntax checked), as an exact Decimal: never a float.

    An exponent PostgreSQL refuses as written, beyond MAX_METADATA_EXPONENT either way, gives
    a zero with the first exponent it refuses (``0E+1073741823``, ``-0E-1073741823``): still a
    Decimal (an amount so written is still "a float"), one that no metadata rule stores, and
    no exception inside the parse, even for an exponent beyond Decimal's own range
    (``1e99999999999999999999``). Decimal alone would take ``0.000e1073741823`` for
    ``0e1073741820``, which PostgreSQL stores."""
    cut = text.find("e")
    if cut < 0:
        cut = text.find("E")
    # Fewer than 10 characters after the "e" cannot reach the bound.
    if cut >= 0 and len(text) - cut > _EXPONENT_DIGITS:
        digits = text[cut + 1 :].lstrip("+-").lstrip("0")
        if len(digits) > _EXPONENT_DIGITS or (
            len(digits) == _EXPONENT_DIGITS and digits > _MAX_EXPONENT_TEXT
        ):
            exponent = -_REFUSED_EXPONENT if text[cut + 1] == "-" else _REFUSED_EXPONENT
            return Decimal((text[0] == "-", (0,), exponent))
    return Decimal(text)


_MAX_EXPONENT_TEXT: Final = str(MAX_METADATA_EXPONENT)
_EXPONENT_DIGITS: Final = len(_MAX_EXPONENT_TEXT)
_REFUSED_EXPONENT: Final = MAX_METADATA_EXPONENT + 1

# Any JSON, every number with a fraction or exponent as an exact Decimal (json_number);
# integers stay int (msgspec refuses the ones over sys.get_int_max_str_digits(), as int() does).
PARSE: Final = msgspec.json.Decoder(float_hook=json_number).decode
# Compact JSON, UTF-8 kept as is, a Decimal written digit for digit as a number.
ENCODE: Final = msgspec.json.Encoder(decimal_format="number").encode
