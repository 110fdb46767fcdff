"""The record contract (docs/messages.md) and its validation: what a valid message is.

``decode`` turns a message body into a :data:`Record` or raises :class:`RecordError`; documents
(CPF/CNPJ) are checked in :mod:`bulk_recorder.records.documents`. Imports only
``bulk_recorder.infra`` at most and the standard library: everything else builds on it.
"""

from bulk_recorder.records.contract import (
    DEFAULT_MAX_BODY_BYTES,
    MAX_DEPTH,
    MAX_OPERATIONS,
    RECORD_TYPES,
    CreditAnnotation,
    Operation,
    Record,
    RecordError,
    Transaction,
)
from bulk_recorder.records.validation import check_content_encoding, decode

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_DEPTH",
    "MAX_OPERATIONS",
    "RECORD_TYPES",
    "CreditAnnotation",
    "Operation",
    "Record",
    "RecordError",
    "Transaction",
    "check_content_encoding",
    "decode",
]
