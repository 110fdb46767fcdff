"""What the schemathesis run of ``test_api_fuzz.py`` adds to its own, loaded by ``st run``
through ``SCHEMATHESIS_HOOKS``:

- the check :func:`schema_valid_requests_are_accepted`: a request the OpenAPI document calls
  valid is accepted (2xx), unless it breaks a rule no JSON Schema can state and the document's
  description names. Each allowed refusal is known by its status and its problem's ``detail``
  (for a job, every rejected line's ``reason``); any other refusal fails the run;
- the hook :func:`map_body`: a generated job line gets the check digits its document's shape
  calls for. Documents are checked first in a line, so a line with random check digits (almost
  all of them) would hide every rule after them; the digits stay digits, so the body stays
  schema-valid;
- the NDJSON media types sent as text, their schema being a string.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Final

import schemathesis

from bulk_recorder.producer.csv_lines import CSV_COLUMNS
from bulk_recorder.producer.parsers import CONTENT_TYPES
from bulk_recorder.records.documents import CNPJ_LEN, CPF_LEN, normalize_document

# The NDJSON bodies are text in the document (a string with a pattern): sent as they are.
for _media, _fmt in CONTENT_TYPES.items():
    if _fmt == "ndjson":
        schemathesis.serializer.alias(_media, "text/plain")

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
# JSON Schema's integer takes 1.0 and 1e2; the API wants an integer amount spelled as one.
FLOAT_AMOUNT: Final = re.compile(
    r"(operations\[\d+\]\.)?amount: must be a decimal string or integer, not a float"
)
REPEATED_LINE_ID: Final = re.compile(r"id: repeats line \d+")
# State: a key or an id already used with another body, a job that does not exist.
KEY_REUSED: Final = re.compile(r"Idempotency-Key was already used for a different request body")
ID_TAKEN: Final = re.compile(r"transaction \S+ was already accepted with other content")
NO_SUCH_JOB: Final = re.compile(r"no credit-annotation job \S+")

RULES: Final = {
    "sums": SUMS,
    "distinct operation ids": DISTINCT_OPERATION_IDS,
    "operation asset = transaction asset": SAME_ASSET,
    "check digits": CHECK_DIGITS,
    "integer amount spelled as a float": FLOAT_AMOUNT,
    "repeated line id": REPEATED_LINE_ID,
    "Idempotency-Key reused with another body": KEY_REUSED,
    "transaction id taken with other content": ID_TAKEN,
    "no such job": NO_SUCH_JOB,
}


def rule_of(reason: str) -> str:
    """The name of the unstated rule ``reason`` comes from, or the reason itself."""
    return next((name for name, rule in RULES.items() if rule.fullmatch(reason)), reason)


TRANSACTION_REFUSALS: Final = {
    409: (ID_TAKEN,),
    422: (SUMS, DISTINCT_OPERATION_IDS, SAME_ASSET, FLOAT_AMOUNT, KEY_REUSED),
}
LINE_REJECTIONS: Final = (CHECK_DIGITS, REPEATED_LINE_ID, FLOAT_AMOUNT)
JOB_REFUSALS: Final = {422: (KEY_REUSED,)}
JOB_STATUS_REFUSALS: Final[dict[int, tuple[re.Pattern[str], ...]]] = {404: (NO_SUCH_JOB,)}
REFUSALS: Final[dict[str, dict[int, tuple[re.Pattern[str], ...]]]] = {
    "POST /v1/transactions": TRANSACTION_REFUSALS,
    "GET /v1/credit-annotation-jobs/{job_id}": JOB_STATUS_REFUSALS,
}


_DOCUMENT_IN_LINE: Final = re.compile(r'"document":"([^"\\\\]*)"')
_CSV_DOCUMENT: Final = CSV_COLUMNS.index("document")
_CSV_HEADER: Final = ",".join(CSV_COLUMNS)


def with_check_digits(document: str) -> str:
    """``document`` with its last two characters of a CPF or CNPJ made its check digits."""
    places = [i for i, c in enumerate(document) if c.isascii() and c.isalnum()]
    if len(places) not in (CPF_LEN, CNPJ_LEN) or not document.isascii():
        return document
    chars = list(document)
    for digits in range(100):
        chars[places[-2]], chars[places[-1]] = str(digits // 10), str(digits % 10)
        candidate = "".join(chars)
        try:
            normalize_document(candidate)
        except ValueError:
            continue
        return candidate
    return document  # one repeated character: no digits make it a document


def with_check_digits_in_body(body: Any) -> Any:
    """A job body (JSON array, NDJSON or CSV text) with every document given its check digits."""
    if isinstance(body, list):
        return [
            {**line, "document": with_check_digits(line["document"])}
            if isinstance(line, dict) and isinstance(line.get("document"), str)
            else line
            for line in body
        ]
    if not isinstance(body, str):
        return body
    if body.startswith(_CSV_HEADER):
        rows = body.split("\n")
        for n, row in enumerate(rows[1:], 1):
            fields = row.split(",")
            if len(fields) == len(CSV_COLUMNS):
                fields[_CSV_DOCUMENT] = with_check_digits(fields[_CSV_DOCUMENT])
                rows[n] = ",".join(fields)
        return "\n".join(rows)
    return _DOCUMENT_IN_LINE.sub(lambda m: f'"document":"{with_check_digits(m[1])}"', body)


@schemathesis.hook
def map_body(ctx: Any, body: Any) -> Any:
    if ctx.operation is not None and ctx.operation.label == "POST /v1/credit-annotation-jobs":
        return with_check_digits_in_body(body)
    return body


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
    allowed = REFUSALS.get(label, {})
    detail = body.get("detail")
    if _matches(allowed.get(status, ()), detail):
        return None
    return f"{status} {detail!r}"


def allowed_reasons(body: dict[str, Any]) -> list[str]:
    """The reasons of a refusal: its detail, or its rejected lines' reasons."""
    reasons = [r.get("reason") for r in body.get("rejections", []) if isinstance(r, dict)]
    return [str(r) for r in reasons] or ([str(body["detail"])] if "detail" in body else [])


def _log_answer(label: str, response: Any, body: dict[str, Any], why: str | None) -> None:
    """Each answer to a schema-valid request, to the file FUZZ_ANSWERS names (the test counts
    them; schemathesis reports one failure of a kind)."""
    path = os.environ.get("FUZZ_ANSWERS")
    if not path:
        return
    sent = response.request.body or ""
    if isinstance(sent, bytes):
        sent = sent.decode(errors="replace")
    entry = {
        "operation": label,
        "status": response.status_code,
        "reasons": allowed_reasons(body) if response.status_code >= 300 or why else [],
        "refused": why,
        "request": sent[:2000] if why else None,
    }
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


@schemathesis.check
def schema_valid_requests_are_accepted(ctx: Any, response: Any, case: Any) -> bool | None:
    """A positive case gets 2xx, or a refusal for a rule the spec names but cannot state."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    body = _body(response)
    why = refusal_of_valid_request(case.operation.label, response.status_code, body)
    _log_answer(case.operation.label, response, body, why)
    if why is not None:
        raise AssertionError(f"schema-valid request refused: {why}")
    return None
