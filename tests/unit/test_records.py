"""decode(): message body + AMQP type -> validated record, or RecordError with a short reason."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bulk_recorder.records import (
    DEFAULT_MAX_BODY_BYTES,
    RECORD_TYPES,
    CreditAnnotation,
    Operation,
    RecordError,
    Transaction,
    decode,
)
from bulk_recorder.records import validation as records
from bulk_recorder.records.schema import STRICT_DECODERS

TX_ID = "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a7b"
ORG_ID = "0193a3c4-0000-7000-8000-000000000001"
LEDGER_ID = "0193a3c4-0000-7000-8000-000000000002"
OP1_ID = "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a01"
OP2_ID = "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a02"
ACC1_ID = "0193a3c4-0000-7000-8000-0000000000a1"
ACC2_ID = "0193a3c4-0000-7000-8000-0000000000a2"
ANN_ID = "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a7c"
JOB_ID = "0193a3c4-0000-7000-8000-0000000000f1"

DROP = object()  # an override value meaning "remove this field"


def _apply(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    for key, value in overrides.items():
        if value is DROP:
            base.pop(key, None)
        else:
            base[key] = value
    return base


def op(
    op_id: str = OP1_ID, type_: str = "DEBIT", amount: Any = "150.00", **overrides: Any
) -> dict[str, Any]:
    base = {
        "id": op_id,
        "account_id": ACC1_ID if type_ == "DEBIT" else ACC2_ID,
        "type": type_,
        "asset_code": "BRL",
    }
    return _apply(base, {"amount": amount, **overrides})


def tx(**overrides: Any) -> dict[str, Any]:
    base = {
        "id": TX_ID,
        "organization_id": ORG_ID,
        "ledger_id": LEDGER_ID,
        "description": "invoice 42",
        "status": "APPROVED",
        "asset_code": "BRL",
        "amount": "150.00",
        "created_at": "2026-11-29T12:00:00Z",
        "metadata": {"channel": "pix"},
        "operations": [op(OP1_ID, "DEBIT"), op(OP2_ID, "CREDIT")],
    }
    return _apply(base, overrides)


def ann(**overrides: Any) -> dict[str, Any]:
    base = {
        "id": ANN_ID,
        "job_id": JOB_ID,
        "document": "529.982.247-25",
        "kind": "RESTRICTION",
        "creditor": "Banco Exemplo S.A.",
        "amount": "1200.00",
        "occurred_on": "2026-11-20",
        "reason": "overdue installment",
    }
    return _apply(base, overrides)


def enc(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def decode_tx(obj: Any) -> Transaction:
    record = decode(enc(obj), "transaction")
    assert isinstance(record, Transaction)
    return record


def decode_ann(obj: Any) -> CreditAnnotation:
    record = decode(enc(obj), "credit_annotation")
    assert isinstance(record, CreditAnnotation)
    return record


def reason(body: bytes, record_type: str | None = "transaction", **kwargs: Any) -> str:
    with pytest.raises(RecordError) as info:
        decode(body, record_type, **kwargs)
    assert info.value.reason == str(info.value)
    assert info.value.reason.isascii()
    assert len(info.value.reason) <= 200
    return info.value.reason


def tx_reason(**overrides: Any) -> str:
    return reason(enc(tx(**overrides)), "transaction")


def ann_reason(**overrides: Any) -> str:
    return reason(enc(ann(**overrides)), "credit_annotation")


# --------------------------------------------------------------------------- happy paths


def test_transaction_decoded() -> None:
    record = decode_tx(tx())
    assert record == Transaction(
        id=TX_ID,
        organization_id=ORG_ID,
        ledger_id=LEDGER_ID,
        description="invoice 42",
        status="APPROVED",
        asset_code="BRL",
        amount=Decimal("150.00"),
        created_at=datetime(2026, 11, 29, 12, 0, tzinfo=UTC),
        metadata='{"channel":"pix"}',
        operations=(
            Operation(OP1_ID, ACC1_ID, "DEBIT", Decimal("150.00"), "BRL"),
            Operation(OP2_ID, ACC2_ID, "CREDIT", Decimal("150.00"), "BRL"),
        ),
    )
    assert record.record_type == Transaction.record_type == "transaction"
    assert type(record.amount) is Decimal
    assert str(record.amount) == "150.00"  # scale kept as sent


def test_transaction_optional_fields_absent() -> None:
    record = decode_tx(tx(description=DROP, created_at=DROP, metadata=DROP))
    assert record.description is None
    assert record.created_at is None
    assert record.metadata is None


def test_transaction_optional_fields_null() -> None:
    record = decode_tx(tx(description=None, created_at=None, metadata=None))
    assert (record.description, record.created_at, record.metadata) == (None, None, None)


def test_unknown_fields_ignored() -> None:
    body = tx(extra={"deep": [1, 2, {"x": None}]}, type="credit_annotation")
    body["operations"][0]["note"] = "ignored"
    assert decode_tx(body).id == TX_ID


def test_amqp_type_is_authoritative() -> None:
    # The body claims to be a transaction; the property says credit_annotation.
    assert isinstance(decode(enc(ann(type="transaction")), "credit_annotation"), CreditAnnotation)


def test_uuids_lowercased() -> None:
    operations = [op(OP1_ID.upper(), "DEBIT", account_id=ACC1_ID.upper()), op(OP2_ID, "CREDIT")]
    record = decode_tx(tx(id=TX_ID.upper(), organization_id=ORG_ID.upper(), operations=operations))
    assert record.id == TX_ID
    assert record.organization_id == ORG_ID
    assert record.operations[0].id == OP1_ID
    assert record.operations[0].account_id == ACC1_ID


def test_records_are_frozen() -> None:
    record = decode_tx(tx())
    with pytest.raises(AttributeError):  # immutable type: frozen msgspec Structs
        record.status = "PENDING"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        record.operations[0].amount = Decimal(1)  # type: ignore[misc]
    assert not hasattr(record, "__dict__")  # slots


@pytest.mark.parametrize(
    ("document", "normalized", "document_type"),
    [
        ("529.982.247-25", "52998224725", "CPF"),
        ("52998224725", "52998224725", "CPF"),
        ("11.222.333/0001-81", "11222333000181", "CNPJ"),
        ("12.ABC.345/01DE-35", "12ABC34501DE35", "CNPJ"),
        ("12.abc.345/01de-35", "12ABC34501DE35", "CNPJ"),
    ],
)
def test_credit_annotation_decoded(document: str, normalized: str, document_type: str) -> None:
    record = decode_ann(ann(document=document))
    assert record == CreditAnnotation(
        id=ANN_ID,
        job_id=JOB_ID,
        document=normalized,
        document_type=document_type,
        kind="RESTRICTION",
        creditor="Banco Exemplo S.A.",
        amount=Decimal("1200.00"),
        occurred_on=date(2026, 11, 20),
        reason="overdue installment",
    )
    assert record.record_type == "credit_annotation"


@pytest.mark.parametrize("job_id", [None, DROP])
def test_credit_annotation_without_job_or_reason(job_id: Any) -> None:
    record = decode_ann(ann(job_id=job_id, reason=DROP, kind="RELEASE"))
    assert record.job_id is None
    assert record.reason is None
    assert record.kind == "RELEASE"


def test_credit_annotation_job_id_lowercased() -> None:
    assert decode_ann(ann(job_id=JOB_ID.upper())).job_id == JOB_ID


@pytest.mark.parametrize("amount", ["0", "0.00", 0])
def test_credit_annotation_zero_amount_allowed(amount: Any) -> None:
    assert decode_ann(ann(amount=amount)).amount == 0


def test_record_types() -> None:
    assert RECORD_TYPES == ("transaction", "credit_annotation")
    assert DEFAULT_MAX_BODY_BYTES == 1_048_576


# --------------------------------------------------------------------------- type property


@pytest.mark.parametrize("record_type", [None, ""])
def test_missing_type_property(record_type: str | None) -> None:
    assert reason(enc(tx()), record_type) == "missing type property"


def test_unknown_type() -> None:
    assert reason(enc(tx()), "foo") == "unknown type: foo"


def test_unknown_type_truncated_and_ascii() -> None:
    text = reason(b"{}", "t\u00e9" * 500)
    assert text.startswith("unknown type: t\\xe9t\\xe9")
    assert len(text) <= 200


def test_unknown_type_control_characters_escaped() -> None:
    assert reason(b"{}", "a\r\nb\x00") == "unknown type: a\\r\\nb\\x00"


@pytest.mark.parametrize("record_type", ["Transaction", "transaction ", "credit-annotation"])
def test_type_property_is_exact(record_type: str) -> None:
    assert reason(enc(tx()), record_type).startswith("unknown type: ")


# --------------------------------------------------------------------------- body and JSON


def test_body_too_large() -> None:
    body = enc(tx())
    assert reason(body, max_bytes=100) == f"body too large ({len(body)} bytes > 100)"
    assert decode(body, "transaction", max_bytes=len(body)).id == TX_ID


def test_default_max_body() -> None:
    body = b" " * (DEFAULT_MAX_BODY_BYTES + 1)
    assert reason(body) == f"body too large ({DEFAULT_MAX_BODY_BYTES + 1} bytes > 1048576)"


@pytest.mark.parametrize(
    "body",
    [b"\xff", b'{"id": "\xc3"}', b"\xed\xa0\x80", b'{"a": "\xed\xa0\x80"}', b"\xc0\xaf"],
)
def test_not_utf8(body: bytes) -> None:
    assert reason(body) == "body is not valid UTF-8"


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b" ",
        b"{",
        b'{"id": }',
        b"{'id': 1}",
        b'{"a": 1} trailing',
        b'{"a": 1}{"b": 2}',
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b'{"a": "raw\x01control"}',
        b"\xef\xbb\xbf{}",  # UTF-8 byte order mark
        b'{"a": 1' + b"0" * 5000 + b"}",  # integer beyond the interpreter's digit limit
    ],
)
def test_invalid_json(body: bytes) -> None:
    assert reason(body) == "invalid JSON"


@pytest.mark.parametrize("body", [b"[]", b"[{}]", b"1", b'"x"', b"null", b"true", b"1.5"])
def test_body_must_be_object(body: bytes) -> None:
    assert reason(body) == "body must be a JSON object"


def _nested_metadata(levels: int) -> dict[str, Any]:
    """A metadata object whose innermost level is `levels` deep in the body (body = level 1)."""
    node: dict[str, Any] = {}
    for _ in range(levels - 2):
        node = {"n": node}
    return node


def test_nesting_at_limit_accepted() -> None:
    record = decode_tx(tx(metadata=_nested_metadata(32)))
    assert record.metadata is not None
    assert record.metadata.count("{") == 31


@pytest.mark.parametrize("levels", [33, 100, 900])
def test_nesting_too_deep(levels: int) -> None:
    assert "nesting" in tx_reason(metadata=_nested_metadata(levels))


def test_nesting_in_ignored_field_counts_too() -> None:
    body = b'{"x": ' + b"[" * 40 + b"]" * 40 + b"}"
    assert reason(body) == "JSON nesting deeper than 32 levels"


@pytest.mark.parametrize(("levels", "accepted"), [(32, True), (33, False)])
def test_nesting_inside_an_operation_counts_the_operation(levels: int, accepted: bool) -> None:
    """The body (1), the operations array (2) and the operation (3) are on the path to an
    operation's extra field: 33 levels there are refused like 33 in metadata. The fast path
    discounts the sibling operations' objects, never the one on the path."""
    body = tx(metadata=None)  # no other brackets: the bound's fast path decides alone
    body["operations"][0]["extra"] = _nested_metadata(levels - 2)
    if accepted:
        assert decode_tx(body).operations[0].id == OP1_ID
    else:
        assert reason(enc(body), "transaction") == "JSON nesting deeper than 32 levels"


def _fewest_bytes(levels: int, shape: str) -> bytes:
    """The smallest compact metadata whose innermost level is ``levels`` deep in the body (the
    body is level 1, the metadata object level 2): an array level takes 2 bytes (``[]``), an
    object level 5 (``{"":`` and ``}``), or 2 for the innermost ``{}``."""
    pattern = {"arrays": "[", "objects": "{", "mixed": "[{"}[shape]
    kinds = "{" + "".join(pattern[i % len(pattern)] for i in range(levels - 2))
    node = b""
    for kind in reversed(kinds):
        if kind == "[":
            node = b"[" + node + b"]"
        elif node:
            node = b'{"":' + node + b"}"
        else:
            node = b"{}"
    return node


def test_fewest_bytes_of_33_levels() -> None:
    """The depth check's fast path skips metadata under 2 * 32 bytes: 33 levels take 67 in
    arrays, 157 in objects."""
    assert len(_fewest_bytes(33, "arrays")) == 67
    assert _fewest_bytes(5, "arrays") == b'{"":[[[]]]}'
    assert _fewest_bytes(4, "objects") == b'{"":{"":{}}}'
    assert _fewest_bytes(5, "mixed") == b'{"":[{"":[]}]}'
    assert [len(_fewest_bytes(33, shape)) for shape in ("objects", "mixed")] == [157, 112]


@pytest.mark.parametrize("shape", ["arrays", "objects", "mixed"])
@pytest.mark.parametrize(("levels", "accepted"), [(31, True), (32, True), (33, False), (40, False)])
@pytest.mark.parametrize("unknown_field", [False, True], ids=["first-pass", "explain"])
def test_metadata_nesting_at_the_bound_in_the_fewest_bytes(
    shape: str, levels: int, accepted: bool, unknown_field: bool
) -> None:
    """32 levels in the whole body, however few the bytes: metadata of 33 levels in arrays, 67
    bytes, was recorded when the fast path's byte bound assumed object levels (5 bytes each)."""
    metadata = _fewest_bytes(levels, shape)
    body = _with_metadata(metadata, unknown_field=unknown_field)
    if accepted:
        assert decode(body, "transaction").metadata == metadata.decode()  # type: ignore[union-attr]
    else:
        assert reason(body) == "JSON nesting deeper than 32 levels"


def test_nesting_beyond_parser_recursion_limit() -> None:
    body = b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert reason(body) == "JSON nesting deeper than 32 levels"


def test_many_brackets_but_shallow_is_fine() -> None:
    metadata = {f"k{i}": [{"v": [i]}] for i in range(200)}
    assert decode_tx(tx(metadata=metadata)).metadata is not None


# --------------------------------------------------------------------------- required fields

TX_REQUIRED = ["id", "organization_id", "ledger_id", "status", "asset_code", "amount", "operations"]
OP_REQUIRED = ["id", "account_id", "type", "amount", "asset_code"]
ANN_REQUIRED = ["id", "document", "kind", "creditor", "amount", "occurred_on"]


@pytest.mark.parametrize("field", TX_REQUIRED)
def test_transaction_field_missing(field: str) -> None:
    assert tx_reason(**{field: DROP}) == f"{field}: missing"


@pytest.mark.parametrize("field", OP_REQUIRED)
def test_operation_field_missing(field: str) -> None:
    operations = [op(OP1_ID, "DEBIT"), op(OP2_ID, "CREDIT", **{field: DROP})]
    assert tx_reason(operations=operations) == f"operations[1].{field}: missing"


@pytest.mark.parametrize("field", ANN_REQUIRED)
def test_annotation_field_missing(field: str) -> None:
    assert ann_reason(**{field: DROP}) == f"{field}: missing"


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("id", 123, "id: must be a string, not a number"),
        ("id", None, "id: must be a string, not null"),
        ("organization_id", ["x"], "organization_id: must be a string, not an array"),
        ("ledger_id", {}, "ledger_id: must be a string, not an object"),
        ("status", True, "status: must be a string, not a boolean"),
        ("asset_code", 1, "asset_code: must be a string, not a number"),
        ("description", 5, "description: must be a string, not a number"),
        ("created_at", 1700000000, "created_at: must be a string, not a number"),
        ("metadata", [1], "metadata: must be an object or null, not an array"),
        ("metadata", "{}", "metadata: must be an object or null, not a string"),
        ("operations", {}, "operations: must be an array, not an object"),
        ("operations", None, "operations: must be an array, not null"),
        ("amount", None, "amount: must be a decimal string or integer, not null"),
        ("amount", True, "amount: must be a decimal string or integer, not a boolean"),
        ("amount", [1], "amount: must be a decimal string or integer, not an array"),
    ],
)
def test_transaction_wrong_json_type(field: str, value: Any, expected: str) -> None:
    assert tx_reason(**{field: value}) == expected


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("job_id", 7, "job_id: must be a string, not a number"),
        ("document", 52998224725, "document: must be a string, not a number"),
        ("kind", None, "kind: must be a string, not null"),
        ("creditor", None, "creditor: must be a string, not null"),
        ("creditor", 1, "creditor: must be a string, not a number"),
        ("occurred_on", 20261120, "occurred_on: must be a string, not a number"),
        ("occurred_on", None, "occurred_on: must be a string, not null"),
        ("reason", False, "reason: must be a string, not a boolean"),
    ],
)
def test_annotation_wrong_json_type(field: str, value: Any, expected: str) -> None:
    assert ann_reason(**{field: value}) == expected


# --------------------------------------------------------------------------- UUIDs


@pytest.mark.parametrize(
    "value",
    [
        "",
        "0193a3c45b6e7f809a1b2c3d4e5f6a7b",  # no hyphens
        "{0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a7b}",
        "urn:uuid:0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a7b",
        "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a7g",
        "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a7",
        "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a7b0",
        "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a7b\n",
        " 0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a7b",
        "0193a3c45-b6e-7f80-9a1b-2c3d4e5f6a7b",
        "\uff10193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a7b",  # fullwidth zero
    ],
)
@pytest.mark.parametrize("field", ["id", "organization_id", "ledger_id"])
def test_invalid_uuid(field: str, value: str) -> None:
    assert tx_reason(**{field: value}) == f"{field}: invalid UUID"


@pytest.mark.parametrize("field", ["id", "account_id"])
def test_invalid_operation_uuid(field: str) -> None:
    operations = [op(OP1_ID, "DEBIT", **{field: "nope"}), op(OP2_ID, "CREDIT")]
    assert tx_reason(operations=operations) == f"operations[0].{field}: invalid UUID"


@pytest.mark.parametrize("field", ["id", "job_id"])
def test_invalid_annotation_uuid(field: str) -> None:
    assert ann_reason(**{field: "1234"}) == f"{field}: invalid UUID"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", "job_id: invalid UUID"),
        (0, "job_id: must be a string, not a number"),
        (False, "job_id: must be a string, not a boolean"),
        ([], "job_id: must be a string, not an array"),
        ({}, "job_id: must be a string, not an object"),
    ],
)
def test_only_null_or_absent_means_no_job_a_falsy_job_id_is_rejected(
    value: Any, expected: str
) -> None:
    assert ann_reason(job_id=value) == expected


# --------------------------------------------------------------------------- enumerations


@pytest.mark.parametrize("status", ["PENDING", "APPROVED", "CANCELED"])
def test_valid_status(status: str) -> None:
    assert decode_tx(tx(status=status)).status == status


@pytest.mark.parametrize("status", ["approved", "CANCELLED", "", " APPROVED", "DONE"])
def test_invalid_status(status: str) -> None:
    assert tx_reason(status=status) == "status: must be one of APPROVED, CANCELED, PENDING"


@pytest.mark.parametrize("kind", ["restriction", "RELEASED", ""])
def test_invalid_kind(kind: str) -> None:
    assert ann_reason(kind=kind) == "kind: must be one of RELEASE, RESTRICTION"


@pytest.mark.parametrize("type_", ["debit", "Credit", "TRANSFER", ""])
def test_invalid_operation_type(type_: str) -> None:
    operations = [op(OP1_ID, "DEBIT"), op(OP2_ID, "CREDIT", type=type_)]
    assert tx_reason(operations=operations) == "operations[1].type: must be one of CREDIT, DEBIT"


# --------------------------------------------------------------------------- asset codes


@pytest.mark.parametrize("asset", ["BRL", "USD", "X", "A123456789", "BTC2"])
def test_valid_asset_code(asset: str) -> None:
    operations = [op(OP1_ID, "DEBIT", asset_code=asset), op(OP2_ID, "CREDIT", asset_code=asset)]
    record = decode_tx(tx(asset_code=asset, operations=operations))
    assert record.asset_code == asset
    assert {o.asset_code for o in record.operations} == {asset}


@pytest.mark.parametrize("asset", ["brl", "1BR", "", "ABCDEFGHIJK", "BR-L", "BRL ", "ÇBR"])
def test_invalid_asset_code(asset: str) -> None:
    assert tx_reason(asset_code=asset).startswith("asset_code: must be 1-10 upper-case")


def test_operation_asset_mismatch() -> None:
    operations = [op(OP1_ID, "DEBIT"), op(OP2_ID, "CREDIT", asset_code="USD")]
    assert (
        tx_reason(operations=operations) == "operations[1].asset_code: USD != transaction asset BRL"
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("usd", "operations[0].asset_code: must be 1-10 upper-case"),
        (3, "operations[0].asset_code: must be a string, not a number"),
        (None, "operations[0].asset_code: must be a string, not null"),
    ],
)
def test_operation_asset_invalid(value: Any, expected: str) -> None:
    operations = [op(OP1_ID, "DEBIT", asset_code=value), op(OP2_ID, "CREDIT")]
    assert tx_reason(operations=operations).startswith(expected)


# --------------------------------------------------------------------------- amounts

VALID_AMOUNTS = [
    ("150.00", Decimal("150.00")),
    ("1", Decimal(1)),
    ("0.000000000000000001", Decimal("1E-18")),
    ("99999999999999999999", Decimal("99999999999999999999")),
    (
        "99999999999999999999.999999999999999999",
        Decimal("99999999999999999999.999999999999999999"),
    ),
    ("007.50", Decimal("7.50")),
    (1000, Decimal(1000)),
    (1, Decimal(1)),
    (2**64, Decimal(2**64)),  # beyond 64-bit integers: stays exact
    (10**20 - 1, Decimal(10**20 - 1)),
]


@pytest.mark.parametrize(("value", "expected"), VALID_AMOUNTS)
def test_valid_amounts(value: Any, expected: Decimal) -> None:
    operations = [op(OP1_ID, "DEBIT", value), op(OP2_ID, "CREDIT", value)]
    record = decode_tx(tx(amount=value, operations=operations))
    assert record.amount == expected
    assert record.operations[0].amount == expected
    assert str(record.amount) == str(expected)  # exact digits, nothing rounded


@pytest.mark.parametrize(("value", "expected"), VALID_AMOUNTS)
def test_valid_annotation_amounts(value: Any, expected: Decimal) -> None:
    assert decode_ann(ann(amount=value)).amount == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"150.1", "must be a decimal string or integer, not a float"),
        (b"150.0", "must be a decimal string or integer, not a float"),
        (b"1e3", "must be a decimal string or integer, not a float"),
        (b"1E+2", "must be a decimal string or integer, not a float"),
        (b"-0.5", "must be a decimal string or integer, not a float"),
        (b"0", "must be > 0"),
        (b"-0", "must be > 0"),
        (b"-1", "must be > 0"),
        (b'"0"', "must be > 0"),
        (b'"0.000"', "must be > 0"),
        (b'"-5"', "must be > 0"),
        (b'"-5.25"', "must be > 0"),
        (b'"1e3"', "invalid decimal"),
        (b'"+1"', "invalid decimal"),
        (b'" 1"', "invalid decimal"),
        (b'"1 "', "invalid decimal"),
        (b'"1."', "invalid decimal"),
        (b'".5"', "invalid decimal"),
        (b'"1,50"', "invalid decimal"),
        (b'"1_000"', "invalid decimal"),
        (b'"NaN"', "invalid decimal"),
        (b'"Infinity"', "invalid decimal"),
        (b'""', "invalid decimal"),
        (b'"\\u0661\\u0662"', "invalid decimal"),  # Arabic-Indic digits
        (b'"100000000000000000000"', "out of range"),
        (b"100000000000000000000", "out of range"),
        (b'"1.0000000000000000001"', "more than 18 decimal places"),
    ],
)
def test_invalid_transaction_amount(raw: bytes, expected: str) -> None:
    body = enc(tx(amount="__AMOUNT__")).replace(b'"__AMOUNT__"', raw)
    assert reason(body).startswith(f"amount: {expected}")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", "operations[1].amount: must be > 0"),
        (-3, "operations[1].amount: must be > 0"),
        (1.5, "operations[1].amount: must be a decimal string or integer, not a float"),
        ("12345678901234567890.1234567890123456789", "operations[1].amount: more than 18"),
    ],
)
def test_invalid_operation_amount(value: Any, expected: str) -> None:
    operations = [op(OP1_ID, "DEBIT"), op(OP2_ID, "CREDIT", value)]
    assert tx_reason(operations=operations).startswith(expected)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (-1, "amount: must be >= 0"),
        ("-1", "amount: must be >= 0"),
        ("-0.01", "amount: must be >= 0"),
        (0.0, "amount: must be a decimal string or integer, not a float"),
        (10**20, "amount: out of range"),
        ("1e2", "amount: invalid decimal"),
    ],
)
def test_invalid_annotation_amount(value: Any, expected: str) -> None:
    assert ann_reason(amount=value).startswith(expected)


# --------------------------------------------------------------------------- operations


@pytest.mark.parametrize("count", [0, 1])
def test_too_few_operations(count: int) -> None:
    operations = [op(OP1_ID, "DEBIT")][:count]
    assert tx_reason(operations=operations) == "operations: at least 2 required"


def _balanced_operations(count: int) -> list[dict[str, Any]]:
    half = count // 2
    return [
        op(f"00000000-0000-4000-8000-{i:012x}", "DEBIT" if i < half else "CREDIT", "1")
        for i in range(count)
    ]


def test_max_operations_accepted() -> None:
    record = decode_tx(tx(amount=500, operations=_balanced_operations(1000)))
    assert len(record.operations) == 1000


def test_too_many_operations() -> None:
    assert tx_reason(operations=_balanced_operations(1002)) == "operations: at most 1000 allowed"


@pytest.mark.parametrize(
    ("value", "kind"), [("x", "a string"), (None, "null"), ([], "an array"), (1, "a number")]
)
def test_operation_must_be_object(value: Any, kind: str) -> None:
    operations = [op(OP1_ID, "DEBIT"), value]
    assert tx_reason(operations=operations) == f"operations[1]: must be an object, not {kind}"


def test_debits_must_equal_credits() -> None:
    operations = [op(OP1_ID, "DEBIT", "150.00"), op(OP2_ID, "CREDIT", "140.00")]
    assert tx_reason(operations=operations) == "debits 150.00 != credits 140.00"


def test_only_debits() -> None:
    operations = [op(OP1_ID, "DEBIT", "75.00"), op(OP2_ID, "DEBIT", "75.00")]
    assert tx_reason(operations=operations) == "debits 150.00 != credits 0"


def test_sums_must_equal_amount() -> None:
    assert tx_reason(amount="160.00") == "debits 150.00 and credits 150.00 != amount 160.00"


def test_sum_reason_never_uses_exponent() -> None:
    operations = [op(OP1_ID, "DEBIT", "0.0000001"), op(OP2_ID, "CREDIT", "0.0000002")]
    assert tx_reason(amount="0.0000001", operations=operations) == (
        "debits 0.0000001 != credits 0.0000002"
    )


def test_sums_are_exact_decimals() -> None:
    operations = [
        op(OP1_ID, "DEBIT", "0.1"),
        op("0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a03", "DEBIT", "0.2"),
        op(OP2_ID, "CREDIT", "0.3"),
    ]
    assert decode_tx(tx(amount="0.30", operations=operations)).amount == Decimal("0.30")


def test_sums_beyond_default_decimal_precision() -> None:
    # 38 significant digits: the default 28-digit context would round these sums.
    big = "99999999999999999999.999999999999999999"
    operations = [
        op(OP1_ID, "DEBIT", "50000000000000000000.000000000000000001"),
        op(
            "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a03",
            "DEBIT",
            "49999999999999999999.999999999999999998",
        ),
        op(OP2_ID, "CREDIT", big),
    ]
    assert decode_tx(tx(amount=big, operations=operations)).amount == Decimal(big)
    operations[0]["amount"] = "50000000000000000000.000000000000000002"
    assert tx_reason(amount=big, operations=operations).startswith(
        "debits 100000000000000000000.000000000000000000 != credits"
    )


def test_different_scales_compare_equal() -> None:
    operations = [op(OP1_ID, "DEBIT", 150), op(OP2_ID, "CREDIT", "150.000")]
    assert decode_tx(tx(amount="150.0", operations=operations)).amount == 150


def test_duplicate_operation_ids() -> None:
    operations = [op(OP1_ID, "DEBIT"), op(OP1_ID.upper(), "CREDIT")]
    assert tx_reason(operations=operations) == "operations[1].id: duplicate"


def test_operation_id_equal_to_transaction_id() -> None:
    operations = [op(TX_ID, "DEBIT"), op(OP2_ID, "CREDIT")]
    assert tx_reason(operations=operations) == "operations[0].id: same as the transaction id"


def test_first_error_reported_in_field_order() -> None:
    assert tx_reason(id="bad", status="bad", operations=[]) == "id: invalid UUID"


# --------------------------------------------------------------------------- created_at


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-11-29T12:00:00Z", datetime(2026, 11, 29, 12, tzinfo=UTC)),
        ("2026-11-29T12:00:00+00:00", datetime(2026, 11, 29, 12, tzinfo=UTC)),
        ("2026-11-29T09:00:00-03:00", datetime(2026, 11, 29, 12, tzinfo=UTC)),
        ("2026-11-30T01:30:00.123456+13:30", datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)),
        ("2026-11-29 12:00:00.5Z", datetime(2026, 11, 29, 12, 0, 0, 500000, tzinfo=UTC)),
    ],
)
def test_created_at_converted_to_utc(value: str, expected: datetime) -> None:
    created_at = decode_tx(tx(created_at=value)).created_at
    assert created_at == expected
    assert created_at is not None
    assert created_at.tzinfo is UTC


@pytest.mark.parametrize("value", ["2026-11-29T12:00:00", "2026-11-29", "2026-11-29T12:00"])
def test_created_at_needs_timezone(value: str) -> None:
    assert tx_reason(created_at=value) == "created_at: timezone required"


@pytest.mark.parametrize(
    "value", ["", "yesterday", "2026-13-01T00:00:00Z", "2026-11-29T25:00:00Z", "29/11/2026"]
)
def test_created_at_invalid(value: str) -> None:
    assert tx_reason(created_at=value) == "created_at: invalid ISO 8601 datetime"


def test_created_at_out_of_range() -> None:
    assert tx_reason(created_at="0001-01-01T00:00:00+01:00") == "created_at: out of range"


# --------------------------------------------------------------------------- occurred_on


@pytest.mark.parametrize(
    "value",
    ["2026-02-30", "20261120", "2026-11-20T00:00:00", "2026-1-20", "26-11-20", "", "2026-11-20 "],
)
def test_occurred_on_invalid(value: str) -> None:
    assert ann_reason(occurred_on=value) == "occurred_on: invalid date (expected YYYY-MM-DD)"


def test_occurred_on_leap_day() -> None:
    assert decode_ann(ann(occurred_on="2028-02-29")).occurred_on == date(2028, 2, 29)


# --------------------------------------------------------------------------- text fields


@pytest.mark.parametrize(
    ("field", "limit"), [("description", 1000), ("creditor", 200), ("reason", 1000)]
)
def test_text_length_limits(field: str, limit: int) -> None:
    builder, record_type = (tx, "transaction") if field == "description" else (ann, RECORD_TYPES[1])
    record = decode(enc(builder(**{field: "é" * limit})), record_type)
    assert getattr(record, field) == "é" * limit
    too_long = enc(builder(**{field: "x" * (limit + 1)}))
    assert reason(too_long, record_type) == f"{field}: longer than {limit} characters"


@pytest.mark.parametrize("field", ["description", "creditor", "reason"])
@pytest.mark.parametrize("value", ["\x00", "abc\x00", "\x00def"])
def test_text_nul_rejected(field: str, value: str) -> None:
    if field == "description":
        assert tx_reason(**{field: value}) == f"{field}: contains NUL"
    else:
        assert ann_reason(**{field: value}) == f"{field}: contains NUL"


@pytest.mark.parametrize("field", ["description", "creditor", "reason"])
@pytest.mark.parametrize("escape", ["\\ud800", "\\uDFFF", "x\\udc00y", "\\ud83d"])
def test_text_lone_surrogate_rejected(field: str, escape: str) -> None:
    builder, record_type = (
        (tx, "transaction") if field == "description" else (ann, "credit_annotation")
    )
    body = enc(builder(**{field: "__TEXT__"})).replace(b"__TEXT__", escape.encode())
    assert reason(body, record_type) == f"{field}: invalid unicode"


def test_surrogate_pair_is_fine() -> None:
    body = enc(tx(description="__TEXT__")).replace(b"__TEXT__", b"smile \\ud83d\\ude00")
    assert decode(body, "transaction").description == "smile \U0001f600"  # type: ignore[union-attr]


def test_escaped_backslash_before_u_is_not_a_surrogate() -> None:
    record = decode_tx(tx(description="path \\ud800 literally"))
    assert record.description == "path \\ud800 literally"


@pytest.mark.parametrize("value", ["", " ", "\t\n "])
def test_creditor_blank(value: str) -> None:
    assert ann_reason(creditor=value) == "creditor: must not be blank"


def test_empty_description_and_reason_kept() -> None:
    assert decode_tx(tx(description="")).description == ""
    assert decode_ann(ann(reason="")).reason == ""


# --------------------------------------------------------------------------- metadata


def test_metadata_reserialized_compactly() -> None:
    metadata = '{ "b" : [1, 2.5, null, true], "a": {"ç": "ão"}, "big": 1%s }' % ("0" * 30)
    body = enc(tx(metadata="__M__")).replace(b'"__M__"', metadata.encode())
    record = decode(body, "transaction")
    assert record.metadata == (  # type: ignore[union-attr]
        '{"b":[1,2.5,null,true],"a":{"ç":"ão"},"big":1000000000000000000000000000000}'
    )


def test_empty_metadata_object() -> None:
    assert decode_tx(tx(metadata={})).metadata == "{}"


@pytest.mark.parametrize(
    "metadata",
    [{"a": "\x00"}, {"\x00": 1}, {"a": [{"b": ["x\x00y"]}]}, {"a": {"k\x00": None}}],
)
def test_metadata_nul_rejected(metadata: dict[str, Any]) -> None:
    assert tx_reason(metadata=metadata) == "metadata: contains NUL"


def test_metadata_literal_backslash_u0000_is_fine() -> None:
    record = decode_tx(tx(metadata={"a": "\\u0000"}))
    assert record.metadata == '{"a":"\\\\u0000"}'


@pytest.mark.parametrize(
    "raw", [b'{"a": "\\ud800"}', b'{"\\udfff": 1}', b'{"a": [{"b": "x\\udbffy"}]}']
)
def test_metadata_lone_surrogate_rejected(raw: bytes) -> None:
    body = enc(tx(metadata="__M__")).replace(b'"__M__"', raw)
    assert reason(body) == "metadata: invalid unicode"


@pytest.mark.parametrize(
    ("raw", "stored"),
    [
        (b'{"x": 0.30000000000000000001}', '{"x":0.30000000000000000001}'),
        (b'{"x": 1e400, "y": [1.5, {"z": -2.50}]}', '{"x":1E+400,"y":[1.5,{"z":-2.50}]}'),
        (b'{"x": 1, "s": "caf\xc3\xa9"}', '{"x":1,"s":"caf\u00e9"}'),
    ],
)
def test_metadata_numbers_are_kept_exactly(raw: bytes, stored: str) -> None:
    body = enc(tx(metadata="__M__")).replace(b'"__M__"', raw)
    record = decode(body, "transaction")
    assert isinstance(record, Transaction)
    assert record.metadata == stored
    assert json.loads(record.metadata, parse_float=Decimal) == json.loads(raw, parse_float=Decimal)


NUMBER_OUT_OF_RANGE = (
    "metadata: number out of range (at most 131072 digits before the point and 16383 after)"
)


def test_metadata_number_with_absurd_exponent_rejected() -> None:
    body = enc(tx(metadata="__M__")).replace(b'"__M__"', b'{"x": 1e999999}')
    assert reason(body) == NUMBER_OUT_OF_RANGE


def _with_metadata(raw: bytes, *, unknown_field: bool) -> bytes:
    """A transaction whose metadata is ``raw``; with an unknown field, which fails the first
    pass (it refuses unknown fields), so that explain's parse reads the metadata."""
    body = tx(metadata="__M__")
    if unknown_field:
        body["note"] = 1
    return enc(body).replace(b'"__M__"', raw)


# Where a metadata number sits: an object, an array, arrays and objects mixed.
NUMBER_PLACES = ['{"x": %s}', '{"x": [%s]}', '{"x": [1, {"y": [[%s]]}]}']
# Exponents beyond Decimal's own range (Emax 999999999999999999): each sign of exponent and of
# mantissa, zeros, and an exponent of 5,000 digits (a digit run that long skips the first pass).
BEYOND_DECIMAL = [
    "1e99999999999999999999",
    "-1e99999999999999999999",
    "1E-99999999999999999999",
    "-1.5e-99999999999999999999",
    "0e99999999999999999999",
    "-0.000E+99999999999999999999",
    "0e-99999999999999999999",
    "1e" + "9" * 5000,
]


@pytest.mark.parametrize("number", BEYOND_DECIMAL, ids=lambda n: n[:26])
@pytest.mark.parametrize("place", NUMBER_PLACES, ids=["object", "array", "mixed"])
@pytest.mark.parametrize("unknown_field", [False, True], ids=["first-pass", "explain"])
def test_metadata_exponent_beyond_decimal_is_out_of_range_not_a_bug(
    number: str, place: str, unknown_field: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Once ``internal error while decoding: InvalidOperation`` and a WARNING per message: the
    reason meant for a bug. It is the documented reason, and nothing is logged."""
    body = _with_metadata((place % number).encode(), unknown_field=unknown_field)
    with caplog.at_level(logging.WARNING):
        assert reason(body) == NUMBER_OUT_OF_RANGE
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# (number, whether PostgreSQL 15 stores it): the exponent as written is bounded at
# 1,073,741,822 either way, zeros included (tests/integration/test_metadata_numbers.py puts
# the same kind of numbers to the server).
EXPONENT_BOUND = [
    ("0e1073741822", True),
    ("0e1073741823", False),
    ("0e1073741824", False),
    ("-0E+1073741822", True),
    ("-0E+1073741823", False),
    ("0.000e1073741822", True),  # Decimal reads 0E+1073741819: the exponent as written counts
    ("0.000e1073741823", False),
    ("0.0e1073741824", False),
    ("0e+0001073741822", True),
    ("0e00000000000000000001073741823", False),
    ("0.000e-16380", True),  # a zero's negative exponent is bounded by its scale, sooner
    ("0.000e-16381", False),
    ("0e-1073741822", False),
    ("0e-1073741823", False),
    ("1e1073741822", False),
    ("1e-1073741823", False),
]


@pytest.mark.parametrize(("number", "stored"), EXPONENT_BOUND)
@pytest.mark.parametrize("place", NUMBER_PLACES, ids=["object", "array", "mixed"])
@pytest.mark.parametrize("unknown_field", [False, True], ids=["first-pass", "explain"])
def test_metadata_exponent_bounded_as_postgresql_reads_it(
    number: str, stored: bool, place: str, unknown_field: bool
) -> None:
    """``0e1073741823`` once passed (zero has no digits to count) and PostgreSQL refused it
    on every delivery: 202 from the API, then the DLQ."""
    body = _with_metadata((place % number).encode(), unknown_field=unknown_field)
    if stored:
        assert decode(body, "transaction").metadata is not None  # type: ignore[union-attr]
    else:
        assert reason(body) == NUMBER_OUT_OF_RANGE


@pytest.mark.parametrize("place", NUMBER_PLACES, ids=["object", "array", "mixed"])
def test_metadata_whole_number_written_with_a_long_fraction_is_kept(place: str) -> None:
    """A run of 16,380 digits sends the body to explain, whose canonical body writes
    1.000...e16380 as the integer it is (as jsonb stores it), past the interpreter's digit
    limit: once ``internal error while decoding: ValidationError``."""
    number = "1." + "0" * 16_380 + "e16380"
    for unknown_field in (False, True):
        body = _with_metadata((place % number).encode(), unknown_field=unknown_field)
        record = decode(body, "transaction")
        assert isinstance(record, Transaction)
        assert record.metadata == (place % ("1" + "0" * 16_380)).replace(" ", "")


def test_an_amount_with_an_exponent_beyond_decimal_is_a_float() -> None:
    body = enc(tx(amount="__A__")).replace(b'"__A__"', b"1e99999999999999999999")
    assert reason(body) == "amount: must be a decimal string or integer, not a float"


def test_metadata_size_limit() -> None:
    # {"k":"..."} is 8 bytes of JSON around the value.
    assert decode_tx(tx(metadata={"k": "x" * (65_536 - 8)})).metadata is not None
    assert tx_reason(metadata={"k": "x" * (65_536 - 7)}) == (
        "metadata: larger than 65536 bytes serialized"
    )


def test_metadata_size_limit_counts_utf8_bytes() -> None:
    # 40,000 characters but 80,000 bytes of UTF-8.
    assert tx_reason(metadata={"k": "é" * 40_000}) == "metadata: larger than 65536 bytes serialized"


# --------------------------------------------------------------------------- documents


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ("529.982.247-26", "document: invalid CPF check digits"),
        ("11.222.333/0001-82", "document: invalid CNPJ check digits"),
        ("12.ABC.345/01DE-36", "document: invalid CNPJ check digits"),
        ("111.111.111-11", "document: invalid CPF (all characters identical)"),
        ("123", "document: must be a CPF (11 digits) or CNPJ (14 characters)"),
        ("", "document: must be a CPF (11 digits) or CNPJ (14 characters)"),
        ("5299822472A", "document: must be a CPF (11 digits) or CNPJ (14 characters)"),
    ],
)
def test_invalid_document(document: str, expected: str) -> None:
    assert ann_reason(document=document) == expected


# --------------------------------------------------------------------------- RecordError


def test_record_error_is_value_error_with_reason() -> None:
    error = RecordError("invalid JSON")
    assert isinstance(error, ValueError)
    assert error.reason == "invalid JSON" == str(error)


def test_record_error_reason_is_short_and_ascii() -> None:
    error = RecordError("ü" * 300)
    assert error.reason.isascii()
    assert len(error.reason) == 200
    assert error.reason.endswith("...")


def test_unexpected_exception_becomes_record_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:  # a bug inside decode: the strict pass's decoder raising what it never does
        def decode(self, body: bytes) -> Transaction:
            raise KeyError("bug")

    monkeypatch.setitem(STRICT_DECODERS, "transaction", Broken())
    assert tx_reason() == "internal error while decoding: KeyError"


# --------------------------------------------------------------------------- properties

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)

TX_KEYS = [*TX_REQUIRED, "description", "created_at", "metadata"]
ANN_KEYS = [*ANN_REQUIRED, "job_id", "reason"]


def _check_outcome(body: bytes, record_type: str | None) -> None:
    try:
        record = decode(body, record_type)
    except RecordError as exc:
        error_reason = exc.reason
    else:
        assert record.record_type == record_type
        return
    assert error_reason.isascii()
    assert 0 < len(error_reason) <= 200


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300), st.sampled_from([*RECORD_TYPES, None, "", "other"]))
def test_arbitrary_bytes_only_raise_record_error(body: bytes, record_type: str | None) -> None:
    _check_outcome(body, record_type)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(json_values, st.sampled_from(RECORD_TYPES))
def test_arbitrary_json_only_raises_record_error(value: Any, record_type: str) -> None:
    _check_outcome(json.dumps(value).encode(), record_type)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_valid_records_only_raise_record_error(data: st.DataObject) -> None:
    record_type = data.draw(st.sampled_from(RECORD_TYPES))
    body = tx() if record_type == "transaction" else ann()
    keys = TX_KEYS if record_type == "transaction" else ANN_KEYS
    for key in data.draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)):
        body[key] = data.draw(json_values)
    if record_type == "transaction" and data.draw(st.booleans()):
        operation = body["operations"]
        if isinstance(operation, list) and operation and isinstance(operation[0], dict):
            operation[0][data.draw(st.sampled_from(OP_REQUIRED))] = data.draw(json_values)
    _check_outcome(json.dumps(body).encode(), record_type)


@settings(max_examples=200)
@given(
    st.text(alphabet="0123456789.-+eE ", max_size=45)
    | st.integers(min_value=-(10**22), max_value=10**22)
)
def test_amount_accepted_only_when_exact(value: str | int) -> None:
    try:
        amount = decode_ann(ann(amount=value)).amount
    except RecordError as exc:
        error_reason = exc.reason
    else:
        assert amount >= 0
        assert amount == Decimal(value)
        assert re.fullmatch(r"[0-9]{1,20}(\.[0-9]{1,18})?", str(value))
        return
    assert error_reason.startswith("amount: ")


@pytest.mark.parametrize("encoding", [None, "", "identity", "utf-8", "UTF-8", "utf8", "Identity"])
def test_content_encodings_of_plain_utf8_json_are_accepted(encoding: str | None) -> None:
    records.check_content_encoding(encoding)


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "latin-1", "utf-16", "x\r\n\xe9"])
def test_other_content_encodings_are_refused_by_name(encoding: str) -> None:
    with pytest.raises(RecordError) as info:
        records.check_content_encoding(encoding)
    text = info.value.reason
    assert text.startswith("body: content_encoding ")  # counted as a decode failure
    assert text.isascii()
    assert text.isprintable()
    assert "not supported" in text
    if encoding.isalnum() or "-" in encoding:
        assert f"{encoding!r}" in text
