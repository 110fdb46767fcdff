"""Record types and ``decode()``: one AMQP message body -> one validated, immutable record.

The AMQP ``type`` property names the record type (docs/messages.md); the body is one JSON
object. ``decode`` either returns a :data:`Record` ready for the writer or raises
:class:`RecordError` whose ``reason`` is short enough for the dead-letter header.

This is the hot path (one call per message). msgspec decodes the body into the structs of
:mod:`bulk_recorder.records.schema` and checks types, patterns, enumerations and lengths in the
same pass, in C; then the rules no schema states run in Python (:mod:`.rules`, and the sums
here). A body that fails the pass goes to :mod:`.explain`, which finds the first failure in field
order and words it as the contract does.
"""

from __future__ import annotations

import logging
import sys
from decimal import Decimal
from typing import Any, Final

import msgspec

from bulk_recorder.exceptions import BulkRecorderError
from bulk_recorder.records import exact, explain, rules
from bulk_recorder.records.contract import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_DEPTH,
    RECORD_TYPES,
    CreditAnnotation,
    Operation,
    Record,
    RecordError,
    Transaction,
)
from bulk_recorder.records.schema import (
    BODY_DECODERS,
    STRICT_DECODERS,
    CreditAnnotationIn,
    StrictTransactionIn,
    TransactionIn,
)

__all__ = ["check_content_encoding", "decode"]

logger = logging.getLogger(__name__)

# An integer over the interpreter's digit limit is not JSON we accept, even in a field nobody
# reads (where msgspec's pass skips it unconverted): a run that long sends the body to explain.
_MAX_DIGITS: Final = sys.get_int_max_str_digits() or 4300
# Digits to "0", all else to "x": a run is then found by substring search, which skips ahead
# (a regex tries every position: 10 ms in a 1 MB body).
_DIGITS_AS_ZERO: Final = bytes.maketrans(
    bytes(range(256)), bytes(0x30 if 0x30 <= b <= 0x39 else 0x78 for b in range(256))
)
_LONG_RUN: Final = b"0" * (_MAX_DIGITS + 1)


def _has_long_digit_run(body: bytes) -> bool:
    return len(body) > _MAX_DIGITS and _LONG_RUN in body.translate(_DIGITS_AS_ZERO)


_PASS_ERRORS: Final = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)
_ZERO: Final = exact.ZERO
_add: Final = exact.add


def _at(offset: int) -> str:
    """The field prefix of the operation whose ids start at ``offset`` in the joined ids."""
    return f"operations[{(offset - 108) // 72}]."


class _Explain(BulkRecorderError):
    """The pass found a failure it cannot word in field order: explain walks the body."""


def _transaction(wire: TransactionIn) -> Transaction:
    """The rules no schema states, in field order (the schema's all passed)."""
    ops = wire.operations
    ids = [wire.id, wire.organization_id, wire.ledger_id]
    for op in ops:
        ids.append(op.id)
        ids.append(op.account_id)
    lowered = rules.lowered_uuids("".join(ids))
    if lowered is None:
        raise _Explain
    joined: str = lowered
    tx_id = joined[:36]
    description = wire.description
    if description is not None and "\x00" in description:
        rules.storable_text(description, "description")
    asset_code = wire.asset_code
    raw_amount = wire.amount
    amount = rules.amount(raw_amount, True)
    created_at = None if wire.created_at is None else rules.created_at(wire.created_at)
    metadata = rules.metadata_from_raw(wire.metadata)

    operations: list[Operation] = []
    seen_ids = {tx_id}
    # A side's sum, None until its first leg, whose amount is taken as it is (ZERO + x is x,
    # digit for digit): a leg per side, the usual transaction, costs no exact addition.
    debits: Decimal | None = None
    credits: Decimal | None = None
    at = 108  # where the operations' ids start in `joined`, 72 characters each
    for op in ops:
        op_id = joined[at : at + 36]
        if op_id in seen_ids:
            raise _Explain  # "duplicate" or "same as the transaction id", at its index
        seen_ids.add(op_id)
        op_raw = op.amount  # most legs carry the transaction's amount: its Decimal is reused
        op_amount = amount if op_raw == raw_amount else rules.amount(op_raw, True, _at(at))
        if op.asset_code != asset_code:
            rules.operation_asset(op.asset_code, asset_code, _at(at))
        op_type = op.type
        if op_type == "DEBIT":
            debits = op_amount if debits is None else _add(debits, op_amount)
        else:
            credits = op_amount if credits is None else _add(credits, op_amount)
        operations.append(
            Operation(op_id, joined[at + 36 : at + 72], op_type, op_amount, asset_code)
        )
        at += 72

    _balanced(debits, credits, amount)
    return Transaction(
        tx_id,
        joined[36:72],
        joined[72:108],
        description,
        wire.status,
        asset_code,
        amount,
        created_at,
        metadata,
        tuple(operations),
    )


def _balanced(debits: Decimal | None, credits: Decimal | None, amount: Decimal) -> None:
    """Debits sum to credits sum to the amount (a side without legs sums to zero)."""
    debits = _ZERO if debits is None else debits
    credits = _ZERO if credits is None else credits
    if debits != credits:
        raise RecordError(f"debits {debits:f} != credits {credits:f}")
    if debits != amount:
        raise RecordError(f"debits {debits:f} and credits {credits:f} != amount {amount:f}")


def _credit_annotation(wire: CreditAnnotationIn) -> CreditAnnotation:
    """The rules no schema states, in field order (the schema's all passed)."""
    job_id = wire.job_id
    lowered = rules.lowered_uuids(wire.id if job_id is None else wire.id + job_id)
    if lowered is None:
        raise _Explain
    ids: str = lowered
    document, document_type = rules.document(wire.document)
    if "\x00" in wire.creditor:
        rules.storable_text(wire.creditor, "creditor")
    amount = rules.amount(wire.amount, False)
    reason = wire.reason
    if reason is not None and "\x00" in reason:
        rules.storable_text(reason, "reason")
    return CreditAnnotation(
        ids[:36],
        ids[36:] or None,
        document,
        document_type,
        wire.kind,
        wire.creditor,
        amount,
        wire.occurred_on,
        reason,
    )


_TYPES: Final = frozenset(RECORD_TYPES)


def _build(record_type: str, wire: Any) -> Record:
    """The record of ``record_type`` (one of RECORD_TYPES) from a body that passed a pass. A
    direct call, not through a table: compiled, it is a C call instead of a Python one."""
    if record_type == "transaction":
        return _transaction(wire)
    return _credit_annotation(wire)


def _nests_too_deep(wire: Any) -> bool:
    """False when a body that passed the strict pass cannot nest deeper than MAX_DEPTH: it has
    no unknown field, so only a transaction's metadata (level 2) nests past its operations
    (levels 2 and 3), and the metadata cannot reach level MAX_DEPTH + 1 with fewer than
    MAX_DEPTH opening brackets, nor so in fewer than twice as many bytes: a level of arrays
    takes 2 (``[]``), of objects 5 (``{"":`` and ``}``), so the fewest, ``{"":[[...]]}``, take
    2 * MAX_DEPTH + 3. (Brackets in strings count too: explain's check_depth then walks the
    parsed JSON.)"""
    if type(wire) is not StrictTransactionIn or len(wire.metadata) < 2 * MAX_DEPTH:
        return False
    metadata = bytes(wire.metadata)
    return metadata.count(b"{") + metadata.count(b"[") >= MAX_DEPTH


def _decode(body: bytes, record_type: str, max_bytes: int) -> Record:
    size = len(body)
    if size > max_bytes:
        raise RecordError(f"body too large ({size} bytes > {max_bytes})")
    if not body.isascii():
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            raise RecordError("body is not valid UTF-8") from None
    if size <= _MAX_DIGITS or not _has_long_digit_run(body):
        try:
            wire = STRICT_DECODERS[record_type].decode(body)
            if _nests_too_deep(wire):
                explain.check_depth(body)
            return _build(record_type, wire)
        except (*_PASS_ERRORS, _Explain):
            pass
    # Raises the first failure in field order, or gives the body canonically re-encoded (with
    # any unknown fields: the lenient pass skips them).
    body = explain.canonical_body(body, record_type)
    return _build(record_type, BODY_DECODERS[record_type].decode(body))


# content_encoding values under which the body is what the contract says, UTF-8 JSON
PLAIN_ENCODINGS: Final = frozenset({"identity", "utf-8", "utf8"})


def check_content_encoding(encoding: str | None) -> None:
    """Raise :class:`RecordError` unless the AMQP ``content_encoding`` leaves the body as the
    contract's UTF-8 JSON: absent, empty, ``identity`` or ``utf-8`` (any case). Anything else
    (gzip, deflate, latin-1) is refused by name, whatever the body: nothing is decompressed or
    transcoded, and a body labelled gzip but sent plain is a publisher's bug, not a record."""
    if encoding and encoding.lower() not in PLAIN_ENCODINGS:
        raise RecordError(
            f"body: content_encoding {encoding[:40]!r} is not supported "
            "(send uncompressed UTF-8 JSON: identity or utf-8)"
        )


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
    if record_type not in _TYPES:
        raise RecordError(f"unknown type: {record_type[:64]}")
    try:
        return _decode(body, record_type, max_bytes)
    except RecordError:
        raise
    except Exception as exc:  # a bug here must dead-letter one message, not kill the consumer
        logger.warning("unexpected error decoding a %s message: %r", record_type, exc)
        logger.debug("decode failure", exc_info=True)
        raise RecordError(f"internal error while decoding: {type(exc).__name__}") from exc
