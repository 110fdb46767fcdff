"""Record types and ``decode()``: one AMQP message body -> one validated, immutable record.

The AMQP ``type`` property names the record type (docs/messages.md); the body is one JSON
object. ``decode`` either returns a :data:`Record` ready for the writer or raises
:class:`RecordError` whose ``reason`` is short enough for the dead-letter header.

This is the hot path (one call per message), so validation is written by hand: precompiled regex
``fullmatch`` instead of ``uuid.UUID()``, no exceptions on the happy path, ``Decimal`` built only
after the text has passed its regex, and field names for error messages formatted only when
something is wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from bulk_recorder.records.contract import (
    ANNOTATION_KINDS,
    DEFAULT_MAX_BODY_BYTES,
    MAX_ANNOTATION_REASON_LEN,
    MAX_CREDITOR_LEN,
    MAX_DESCRIPTION_LEN,
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
from bulk_recorder.records.documents import normalize_document
from bulk_recorder.records.fields import (  # the package's own helpers
    _ASSET_MATCH,
    _MISSING,
    _ZERO,
    _amount,
    _asset,
    _bad_asset,
    _choice,
    _created_at,
    _fail,
    _metadata,
    _occurred_on,
    _opt_text,
    _opt_uuid,
    _parse,
    _sum_add,
    _text,
    _type_error,
    _uuid,
)

__all__ = ["decode"]

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
