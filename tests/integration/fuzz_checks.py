"""The check the schemathesis run of ``test_api_fuzz.py`` adds to its own: a request the OpenAPI
document calls valid is accepted (2xx), unless it breaks a rule no JSON Schema can state and
the document's description names. Loaded by ``st run`` through ``SCHEMATHESIS_HOOKS``.

Each allowed refusal is known by its status and its problem's ``detail`` (for a job, every
rejected line's ``reason``); any other refusal of a schema-valid request fails the run.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Final

import schemathesis

# Rules that compare values with each other or with what is stored, or do arithmetic: the
# descriptions of TransactionIn, CreditAnnotationIn and the operations say so.
SUMS: Final = re.compile(r"debits \S+ (and credits \S+ )?!= (credits|amount) \S+")
DISTINCT_OPERATION_IDS: Final = re.compile(
    r"operations\[\d+\]\.id: (duplicate|same as the transaction id)"
)
SAME_ASSET: Final = re.compile(r"operations\[\d+\]\.asset_code: \S+ != transaction asset \S+")
CHECK_DIGITS: Final = re.compile(
    r"document: invalid (CPF|CNPJ) (check digits|\(all characters identical\))"
)
REPEATED_LINE_ID: Final = re.compile(r"id: repeats line \d+")
# State: a key or an id already used with another body, a job that does not exist.
KEY_REUSED: Final = re.compile(r"Idempotency-Key was already used for a different request body")
ID_TAKEN: Final = re.compile(r"transaction \S+ was already accepted with other content")
NO_SUCH_JOB: Final = re.compile(r"no credit-annotation job \S+")

TRANSACTION_REFUSALS: Final = {
    409: (ID_TAKEN,),
    422: (SUMS, DISTINCT_OPERATION_IDS, SAME_ASSET, KEY_REUSED),
}
LINE_REJECTIONS: Final = (CHECK_DIGITS, REPEATED_LINE_ID)
JOB_REFUSALS: Final = {422: (KEY_REUSED,)}
JOB_STATUS_REFUSALS: Final = {404: (NO_SUCH_JOB,)}


def _body(response: Any) -> dict[str, Any]:
    try:
        body = json.loads(response.content)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _matches(patterns: tuple[re.Pattern[str], ...], text: object) -> bool:
    return isinstance(text, str) and any(p.fullmatch(text) for p in patterns)


def _unexplained_line_rejections(body: dict[str, Any]) -> list[Any]:
    return [
        r
        for r in body.get("rejections", [])
        if not _matches(LINE_REJECTIONS, r.get("reason") if isinstance(r, dict) else None)
    ]


def refusal_of_valid_request(label: str, status: int, body: dict[str, Any]) -> str | None:
    """Why this answer to a schema-valid request breaks the spec's promise; None if it keeps it."""
    if label == "POST /v1/credit-annotation-jobs":
        rejected = _unexplained_line_rejections(body)
        if rejected:  # in a 202 too: a valid line must not be refused
            return f"lines rejected for a rule the spec does not state: {rejected[:3]}"
        if 200 <= status < 300:
            return None
        detail = body.get("detail")
        if status == 422 and detail == "no valid line in the job" and body.get("rejections"):
            return None  # every line was refused for a rule no schema states
        if _matches(JOB_REFUSALS.get(status, ()), detail):
            return None
        return f"{status} {detail!r}"
    if 200 <= status < 300:
        return None
    allowed = {
        "POST /v1/transactions": TRANSACTION_REFUSALS,
        "GET /v1/credit-annotation-jobs/{job_id}": JOB_STATUS_REFUSALS,
    }.get(label, {})
    detail = body.get("detail")
    if _matches(allowed.get(status, ()), detail):
        return None
    return f"{status} {detail!r}"


def _log_refusal(label: str, why: str, response: Any) -> None:
    """Every refusal, to the file named by FUZZ_REFUSALS (schemathesis reports one a kind)."""
    path = os.environ.get("FUZZ_REFUSALS")
    if path:
        request = response.request
        body = request.body or ""
        if isinstance(body, bytes):
            body = body.decode(errors="replace")
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"operation": label, "why": why, "request": body[:2000]}) + "\n")


@schemathesis.check
def schema_valid_requests_are_accepted(ctx: Any, response: Any, case: Any) -> bool | None:
    """A positive case gets 2xx, or a refusal for a rule the spec names but cannot state."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    why = refusal_of_valid_request(case.operation.label, response.status_code, _body(response))
    if why is not None:
        _log_refusal(case.operation.label, why, response)
        raise AssertionError(f"schema-valid request refused: {why}")
    return None
