"""The API's answers, and how the request bodies appear in the OpenAPI document.

The request bodies are the record schema itself (:mod:`bulk_recorder.records.schema`, the msgspec
structs ``decode()`` checks them against, with the rules of
:mod:`bulk_recorder.records.published`), published as ``TransactionIn``, ``OperationIn`` and
``CreditAnnotationIn``: the document cannot drift from what the API and the recorder accept. A
job's NDJSON and CSV bodies are in :mod:`.job_bodies`.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, Field

from bulk_recorder.producer.api.body import MAX_IDEMPOTENCY_KEY_LEN
from bulk_recorder.producer.api.problems import Problem


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


TRANSACTION_EXAMPLE: Final[dict[str, Any]] = {
    "id": "0193a7c2-5f1e-7d4a-9b8c-2e4f6a8b0c2a",
    "organization_id": "0193a7c2-5f1e-7d4a-9b8c-2e4f6a8b0c2b",
    "ledger_id": "0193a7c2-5f1e-7d4a-9b8c-2e4f6a8b0c2c",
    "description": "Invoice 42",
    "status": "APPROVED",
    "asset_code": "BRL",
    "amount": "150.00",
    "created_at": "2026-11-30T12:00:00Z",
    "metadata": {"invoice": 42},
    "operations": [
        {
            "id": "0193a7c2-5f1e-7d4a-9b8c-2e4f6a8b0c2d",
            "account_id": "0193a7c2-5f1e-7d4a-9b8c-2e4f6a8b0c2e",
            "type": "DEBIT",
            "amount": "150.00",
            "asset_code": "BRL",
        },
        {
            "id": "0193a7c2-5f1e-7d4a-9b8c-2e4f6a8b0c2f",
            "account_id": "0193a7c2-5f1e-7d4a-9b8c-2e4f6a8b0c30",
            "type": "CREDIT",
            "amount": "150.00",
            "asset_code": "BRL",
        },
    ],
}
TRANSACTION_BODY: Final[dict[str, Any]] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {"$ref": "#/components/schemas/TransactionIn"},
                "example": TRANSACTION_EXAMPLE,
            }
        },
    }
}
IDEMPOTENCY_DOC = (
    f"Optional, 1 to {MAX_IDEMPOTENCY_KEY_LEN} printable ASCII characters (spaces around it are "
    "not part of it, as HTTP has it). A repeat with the same key gets the first outcome (header "
    "Idempotent-Replayed: true); the same key with a different body gets 422."
)
IDEMPOTENCY_SCHEMA: Final[dict[str, Any]] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_IDEMPOTENCY_KEY_LEN,
    "pattern": "^[\\u0021-\\u007e](?:[\\u0020-\\u007e]*[\\u0021-\\u007e])?$",
}
