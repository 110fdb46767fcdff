"""The wire format of DESIGN.md section 4 as msgspec types: one schema, checked in C.

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

from bulk_recorder.records.contract import (
    MAX_ANNOTATION_REASON_LEN,
    MAX_CREDITOR_LEN,
    MAX_DESCRIPTION_LEN,
    MAX_OPERATIONS,
)

__all__ = [
    "BODY_DECODERS",
    "ENCODE",
    "PARSE",
    "CreditAnnotationWire",
    "OperationWire",
    "TransactionWire",
]

# msgspec patterns are searched, not matched: anchor both ends (\Z, since $ also matches before
# a final newline).
UUID_PATTERN: Final = (
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z"
)
ASSET_PATTERN: Final = r"^[A-Z][A-Z0-9]{0,9}\Z"
NOT_BLANK_PATTERN: Final = r"\S"  # \S is "not str.isspace()", the test str.strip() uses

# msgspec checks a ``pattern`` by calling Python's re once per field: seven calls per
# transaction were two thirds of its pass. So the schema checks a UUID's length here and
# rules.uuids its shape, every id of a record in one regex call (the pattern is published).
Uuid = Annotated[
    str, msgspec.Meta(min_length=36, max_length=36, extra_json_schema={"pattern": UUID_PATTERN})
]
AssetCode = Annotated[str, msgspec.Meta(pattern=ASSET_PATTERN)]
# An operation's asset must equal its transaction's (valid) one: rules.operation_asset.
OperationAsset = Annotated[str, msgspec.Meta(extra_json_schema={"pattern": ASSET_PATTERN})]
# An exact decimal as a JSON string or integer; its digit limits are rules.amount's.
Amount = str | int


class OperationWire(msgspec.Struct, kw_only=True, gc=False):
    id: Uuid
    account_id: Uuid
    type: Literal["DEBIT", "CREDIT"]
    amount: Amount
    asset_code: OperationAsset


class TransactionWire(msgspec.Struct, kw_only=True, gc=False):
    id: Uuid
    organization_id: Uuid
    ledger_id: Uuid
    description: Annotated[str, msgspec.Meta(max_length=MAX_DESCRIPTION_LEN)] | None = None
    status: Literal["PENDING", "APPROVED", "CANCELED"]
    asset_code: AssetCode
    amount: Amount
    created_at: str | None = None  # ISO 8601 as datetime.fromisoformat reads it: rules.created_at
    metadata: msgspec.Raw = msgspec.Raw(b"null")  # any JSON; rules.metadata wants an object
    operations: Annotated[
        list[OperationWire], msgspec.Meta(min_length=2, max_length=MAX_OPERATIONS)
    ]


class CreditAnnotationWire(msgspec.Struct, kw_only=True, gc=False):
    id: Uuid
    job_id: Uuid | None = None
    document: str  # CPF or CNPJ with check digits: documents.normalize_document
    kind: Literal["RESTRICTION", "RELEASE"]
    creditor: Annotated[str, msgspec.Meta(max_length=MAX_CREDITOR_LEN, pattern=NOT_BLANK_PATTERN)]
    amount: Amount
    occurred_on: date  # YYYY-MM-DD, a real date
    reason: Annotated[str, msgspec.Meta(max_length=MAX_ANNOTATION_REASON_LEN)] | None = None


BODY_DECODERS: Final[dict[str, msgspec.json.Decoder[Any]]] = {
    "transaction": msgspec.json.Decoder(TransactionWire),
    "credit_annotation": msgspec.json.Decoder(CreditAnnotationWire),
}
# Any JSON, every number with a fraction or exponent as an exact Decimal (never a float);
# integers stay int (msgspec refuses the ones over sys.get_int_max_str_digits(), as int() does).
PARSE: Final = msgspec.json.Decoder(float_hook=Decimal).decode
# Compact JSON, UTF-8 kept as is, a Decimal written digit for digit as a number.
ENCODE: Final = msgspec.json.Encoder(decimal_format="number").encode
