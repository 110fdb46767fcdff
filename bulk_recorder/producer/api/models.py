"""The API's answers, and how the request bodies appear in the OpenAPI document.

The request bodies are the record schema itself (:mod:`bulk_recorder.records.schema`, the msgspec
structs ``decode()`` checks them against), published as ``TransactionIn``, ``OperationIn`` and
``CreditAnnotationIn``: the document cannot drift from what the API and the recorder accept.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, Field

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
