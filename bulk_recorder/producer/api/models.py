"""The API's wire models: request bodies for the OpenAPI document, and the answers.

The wire format itself is validated by ``decode()``; these models document it.
"""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, Field

from bulk_recorder.producer.api.problems import Problem

Amount = Annotated[
    str | int,
    Field(
        description="Exact decimal as a JSON string or integer, at most 20 integer and 18 "
        "fractional digits; never a float.",
        examples=["150.00"],
    ),
]


class OperationIn(BaseModel):
    id: uuid.UUID
    account_id: uuid.UUID
    type: Literal["DEBIT", "CREDIT"]
    amount: Amount
    asset_code: str = Field(pattern=r"^[A-Z][A-Z0-9]{0,9}$", examples=["BRL"])


class TransactionIn(BaseModel):
    """A ledger transaction: debits sum to credits sum to ``amount``, every amount > 0."""

    id: uuid.UUID
    organization_id: uuid.UUID
    ledger_id: uuid.UUID
    description: str | None = None
    status: Literal["PENDING", "APPROVED", "CANCELED"]
    asset_code: str = Field(pattern=r"^[A-Z][A-Z0-9]{0,9}$", examples=["BRL"])
    amount: Amount
    created_at: datetime | None = None
    metadata: dict[str, Any] | None = None
    operations: list[OperationIn] = Field(min_length=2)


class CreditAnnotationIn(BaseModel):
    """One job line. ``job_id`` is ignored: every line gets the job's id."""

    id: uuid.UUID
    job_id: uuid.UUID | None = None
    document: str = Field(
        description="CPF (11 digits) or CNPJ (14 characters, numeric or alphanumeric) with "
        "valid check digits; punctuation allowed.",
        examples=["529.982.247-25", "12.ABC.345/01DE-35"],
    )
    kind: Literal["RESTRICTION", "RELEASE"]
    creditor: str
    amount: Amount
    occurred_on: date
    reason: str | None = None


class TransactionAccepted(BaseModel):
    id: str
    status: Literal["accepted", "recorded"] = Field(
        description="accepted: stored with an outbox row, recorded later (202); recorded: "
        "written with its operations and balance effects (201)."
    )
    mode: Literal["async", "sync"]


class LineRejection(BaseModel):
    line: int = Field(
        description="1-based: the physical line (NDJSON), the line where the record starts "
        "(CSV, header is line 1) or the element's position (JSON array)."
    )
    reason: str


class JobAccepted(BaseModel):
    id: str
    status: Literal["accepted"] = "accepted"
    accepted: int
    rejected: int
    rejections: list[LineRejection] = Field(description="The first rejected lines, in order.")
    rejections_truncated: bool
    status_url: str


class JobRefused(Problem):
    """422 for a job with no valid line: a problem, and the rejected lines as extension members."""

    rejected: int
    rejections: list[LineRejection]
    rejections_truncated: bool


TRANSACTION_BODY: Final[dict[str, Any]] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TransactionIn"}}},
    }
}
JOB_BODY: Final[dict[str, Any]] = {
    "requestBody": {
        "required": True,
        "description": "Streamed: JSON array of objects, NDJSON (one object a line) or CSV "
        "with a header row (columns id, job_id, document, kind, creditor, amount, "
        "occurred_on, reason; job_id and reason optional).",
        "content": {
            "application/json": {
                "schema": {
                    "type": "array",
                    "items": {"$ref": "#/components/schemas/CreditAnnotationIn"},
                }
            },
            "application/x-ndjson": {"schema": {"$ref": "#/components/schemas/CreditAnnotationIn"}},
            "text/csv": {"schema": {"type": "string"}},
        },
    }
}
IDEMPOTENCY_DOC = (
    "Optional, 1 to 255 printable ASCII characters. A repeat with the same key gets the "
    "first outcome (header Idempotent-Replayed: true); the same key with a different body "
    "gets 422."
)
