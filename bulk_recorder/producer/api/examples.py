"""What /docs shows for each answer: an example of that very answer.

Swagger UI draws an example from a response's schema when it has none, so every problem answer
showed the ``Problem`` model's 422. Each answer here is one the API gives, with its own status;
``tests/unit/test_openapi_examples.py`` validates each against its schema.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, Final

TRANSACTION_ID: Final = "0193a7c2-5f1e-7d4a-9b8c-2e4f6a8b0c2a"
JOB_ID: Final = "0193a7c2-6a00-7b1c-8d2e-3f4a5b6c7d8e"

# The detail of each problem answer, as the API words it.
PROBLEM_DETAILS: Final[dict[int, str]] = {
    400: "Idempotency-Key must be 1 to 255 printable ASCII characters",
    401: "an API key is required: Authorization: Bearer <key>",
    403: "this API key lacks the scope transactions:write",
    404: f"no credit-annotation job {JOB_ID}",
    408: "request body timeout: nothing received for 30 s; send the body without pauses",
    409: f"transaction {TRANSACTION_ID} was already accepted with other content",
    413: "body too large (1048577 bytes > 1048576)",
    415: "Content-Type must be application/json, not text/plain",
    422: "amount: more than 18 decimal places",
    503: "database unavailable; retry later",
}


def problem_example(status: int, detail: str | None = None) -> dict[str, Any]:
    """The problem+json body of ``status`` (RFC 9457)."""
    return {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail or PROBLEM_DETAILS[status],
    }


TRANSACTION_ACCEPTED: Final = {"id": TRANSACTION_ID, "status": "accepted", "mode": "async"}
TRANSACTION_RECORDED: Final = {"id": TRANSACTION_ID, "status": "recorded", "mode": "sync"}

JOB_ACCEPTED: Final = {
    "id": JOB_ID,
    "status": "accepted",
    "accepted": 299_998,
    "rejected": 2,
    "rejections": [
        {"line": 17, "reason": "document: invalid CPF check digits"},
        {"line": 90_211, "reason": "invalid JSON"},
    ],
    "rejections_truncated": False,
    "status_url": f"/v1/credit-annotation-jobs/{JOB_ID}",
}

JOB_REFUSED: Final = {
    **problem_example(422, "no valid line in the job"),
    "rejected": 1,
    "rejections": [{"line": 1, "reason": "invalid JSON"}],
    "rejections_truncated": False,
}

JOB_STATUS: Final = {
    "id": JOB_ID,
    "status": "recording",
    "accepted": 299_998,
    "rejected": 2,
    "published": 299_998,
    "unsent": 0,
    "oldest_unsent_age_s": None,
    "last_published_at": "2026-12-06T12:00:41.250000Z",
    "recorded": 212_004,
    "dead_lettered": 0,
    "progress": 0.7067,
    "created_at": "2026-12-06T12:00:03.840000Z",
    "completed_at": None,
}


def attach_nullable(document: dict[str, Any]) -> None:
    """The examples holding nulls, set on the generated document (FastAPI drops the nulls of
    a route decorator's examples, and the job's status always has some)."""
    answer = document["paths"]["/v1/credit-annotation-jobs/{job_id}"]["get"]["responses"]["200"]
    answer["content"]["application/json"]["example"] = JOB_STATUS
