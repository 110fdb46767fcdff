"""The record contract (docs/messages.md): record types, their limits, and the immutable
records ``decode`` returns.

The records are frozen msgspec Structs: built in C from positional arguments (a frozen
dataclass sets each field through ``object.__setattr__``, five times the cost), compared and
hashed by value like the dataclasses they replace, and without GC tracking (``gc=False``): a
record holds only text, numbers, dates and a tuple of operations, so it can never be part of a
reference cycle."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any, ClassVar, Final, TypeAlias

import msgspec

from bulk_recorder.exceptions import BulkRecorderError

RECORD_TYPES: tuple[str, ...] = ("transaction", "credit_annotation")
DEFAULT_MAX_BODY_BYTES = 1_048_576
# jsonb keeps numbers as numeric: PostgreSQL's numeric holds at most so many digits before the
# decimal point and after it (its scale as written, trailing zeros included). A metadata number
# beyond either is refused here rather than by PostgreSQL later, whatever its spelling.
MAX_METADATA_INTEGER_DIGITS: Final = 131_072
MAX_METADATA_FRACTION_DIGITS: Final = 16_383
# And before counting digits, PostgreSQL 15 refuses an exponent as written of INT_MAX / 2
# (1,073,741,823) or more either way, even on a zero, which has no digits to count:
# 0e1073741822 is stored, 0e1073741823 and 0.000e1073741823 are refused.
MAX_METADATA_EXPONENT: Final = 1_073_741_822

MAX_DEPTH: Final = 32  # nesting levels of objects/arrays, the body's own object being level 1
MAX_OPERATIONS: Final = 1000
MAX_REASON_LEN: Final = 200
MAX_DESCRIPTION_LEN: Final = 1000
MAX_CREDITOR_LEN: Final = 200
MAX_ANNOTATION_REASON_LEN: Final = 1000
MAX_METADATA_BYTES: Final = 65_536
# An amount is exact: what numeric(38,18) stores without rounding.
MAX_AMOUNT_INTEGER_DIGITS: Final = 20
MAX_AMOUNT_FRACTION_DIGITS: Final = 18

TRANSACTION_STATUSES: Final = frozenset({"PENDING", "APPROVED", "CANCELED"})
ANNOTATION_KINDS: Final = frozenset({"RESTRICTION", "RELEASE"})
OPERATION_TYPES: Final = frozenset({"DEBIT", "CREDIT"})


class RecordError(BulkRecorderError, ValueError):
    """A message that cannot be decoded or validated.

    ``reason`` is short (at most 200 characters), ASCII-only and meant for the
    ``x-bulk-recorder-error`` header of the dead-lettered message, e.g. ``'invalid JSON'``,
    ``'unknown type: foo'`` or ``'operations[1].amount: must be > 0'``.
    """

    reason: str

    def __init__(self, reason: str) -> None:
        if not (reason.isascii() and reason.isprintable()):  # it may quote a header or a value
            reason = reason.encode("unicode_escape").decode("ascii")
        if len(reason) > MAX_REASON_LEN:
            reason = reason[: MAX_REASON_LEN - 3] + "..."
        super().__init__(reason)
        self.reason = reason


class Operation(msgspec.Struct, frozen=True, gc=False):
    """One double-entry leg of a :class:`Transaction` (table ``operations``)."""

    id: str  # canonical lowercase hyphenated UUID text
    account_id: str
    type: str  # "DEBIT" | "CREDIT"
    amount: Decimal
    asset_code: str


class Transaction(msgspec.Struct, frozen=True, gc=False):
    """A ledger transaction with its operations (tables ``transactions`` and ``operations``)."""

    id: str
    organization_id: str
    ledger_id: str
    description: str | None
    status: str  # PENDING | APPROVED | CANCELED
    asset_code: str
    amount: Decimal
    created_at: datetime | None  # tz-aware, in UTC; None when absent
    metadata: str | None  # compact JSON text of the metadata object (jsonb), None when absent/null
    operations: tuple[Operation, ...]
    record_type: ClassVar[str] = "transaction"


class CreditAnnotation(msgspec.Struct, frozen=True, gc=False):
    """A credit restriction or release for a CPF or CNPJ (table ``credit_annotations``)."""

    id: str
    job_id: str | None
    document: str  # normalized: no punctuation, upper case, e.g. "52998224725", "12ABC34501DE35"
    document_type: str  # "CPF" | "CNPJ"
    kind: str  # RESTRICTION | RELEASE
    creditor: str
    amount: Decimal
    occurred_on: date
    reason: str | None
    record_type: ClassVar[str] = "credit_annotation"


Record: TypeAlias = Transaction | CreditAnnotation

JsonObject: TypeAlias = dict[str, Any]
