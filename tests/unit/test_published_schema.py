"""The OpenAPI document says what the API accepts, checked in process and fast: bodies drawn from
the document (schemathesis, deterministic) are fed to what the API runs on them -- ``decode``
and the job intake -- once the rules no schema can state are met the way the document says.
A schema-valid body refused for any other reason is a rule the document fails to state.
The same promise, over HTTP against a real API process: tests/integration/test_api_fuzz.py.
"""

from __future__ import annotations

import json
import re
import uuid
from decimal import Decimal, localcontext
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, assume, given, settings

from bulk_recorder.producer.api import create_app
from bulk_recorder.producer.api.job_bodies import EXAMPLE_LINES, csv_example, ndjson_example
from bulk_recorder.producer.api.models import TRANSACTION_EXAMPLE
from bulk_recorder.producer.ingest import JobIntake
from bulk_recorder.producer.parsers import CONTENT_TYPES, parser_for
from bulk_recorder.records import MAX_OPERATIONS, RecordError, decode
from bulk_recorder.records.contract import MAX_AMOUNT_INTEGER_DIGITS
from bulk_recorder.records.published import BLANK_CHARS, NOT_BLANK_TEXT
from settings import load_settings
from tests.integration.fuzz_checks import LINE_REJECTIONS, with_check_digits_in_body

SPEC = create_app(load_settings(database_url="postgresql://spec/spec")).openapi()
SCHEMA = schemathesis.openapi.from_dict(SPEC)
DRAWS = settings(
    max_examples=60,  # drawing from the document's patterns is slow: ~0.1 s a body
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def intake(body: bytes, fmt: str) -> JobIntake:
    job = JobIntake(
        str(uuid.UUID(int=1)), parser_for(fmt, 1 << 20), max_body_bytes=1 << 20, max_lines=10**6
    )
    job.feed(body)
    job.finish()
    return job


# -- the pieces ------------------------------------------------------------------------------------


def test_blank_is_what_str_isspace_says_for_every_code_point() -> None:
    everything = "".join(map(chr, range(0x110000)))
    assert set(re.findall(f"[{BLANK_CHARS}]", everything)) == {c for c in everything if c.isspace()}


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("a", True),
        (" a ", True),
        ("", False),
        (" \t\u00a0\u3000", False),
        ("\x1c", False),
        ("\ufeff", True),
        ("a\x00", False),
    ],
)
def test_not_blank_reads_as_the_validation_does(text: str, valid: bool) -> None:
    assert bool(re.search(NOT_BLANK_TEXT, text)) is valid


def test_every_example_in_the_document_is_accepted() -> None:
    decode(json.dumps(TRANSACTION_EXAMPLE).encode(), "transaction")
    bodies = {
        "json": json.dumps(list(EXAMPLE_LINES)).encode(),
        "ndjson": ndjson_example().encode(),
        "csv": csv_example().encode(),
    }
    for fmt, body in bodies.items():
        job = intake(body, fmt)
        assert (job.accepted, job.rejections) == (len(EXAMPLE_LINES), []), fmt


# -- bodies drawn from the document ----------------------------------------------------------


def with_unstated_transaction_rules(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` made to meet what the document says no schema states: integer amounts spelled as
    integers, distinct ids, one asset, debits = credits = amount (a leg added to balance)."""
    tx_asset = body["asset_code"]
    seen = {body["id"].lower()}
    sums = {"DEBIT": Decimal(0), "CREDIT": Decimal(0)}
    with localcontext() as exact:
        exact.prec = 100  # 20 + 18 digits, summed a thousand times: no rounding
        for n, op in enumerate(body["operations"]):
            if isinstance(op["amount"], float):
                op["amount"] = int(op["amount"])
            if op["id"].lower() in seen:
                op["id"] = str(uuid.UUID(int=n + 1))
            seen.add(op["id"].lower())
            op["asset_code"] = tx_asset
            sums[op["type"]] += Decimal(str(op["amount"]))
        debits, credits = sums["DEBIT"], sums["CREDIT"]
        if debits != credits:
            leg = {
                "id": str(uuid.UUID(int=10**6)),
                "account_id": str(uuid.UUID(int=2)),
                "type": "CREDIT" if debits > credits else "DEBIT",
                "amount": format(abs(debits - credits), "f"),
                "asset_code": tx_asset,
            }
            body["operations"].append(leg)
        total = max(debits, credits)
    assume(len(body["operations"]) <= MAX_OPERATIONS)
    assume(total < 10**MAX_AMOUNT_INTEGER_DIGITS)
    body["amount"] = format(total, "f")
    return body


@DRAWS
@given(case=SCHEMA["/v1/transactions"]["POST"].as_strategy())
def test_a_transaction_the_document_allows_is_accepted(case: Any) -> None:
    body = with_unstated_transaction_rules(case.body)
    try:
        decode(json.dumps(body).encode(), "transaction")
    except RecordError as exc:
        pytest.fail(f"refused: {exc.reason}: {json.dumps(body)[:2000]}")


@pytest.mark.parametrize("fmt", ["json", "ndjson", "csv"])
def test_a_job_the_document_allows_is_accepted_line_by_line(fmt: str) -> None:
    """Each of the document's job formats, drawn on its own: one strategy over all three let
    a change elsewhere in the document leave a format undrawn in a derandomized run."""
    formats: set[str] = set()

    def drawn_in_format(case: Any) -> bool:
        return bool(CONTENT_TYPES[case.media_type] == fmt)

    strategy: Any = SCHEMA["/v1/credit-annotation-jobs"]["POST"].as_strategy()

    @settings(DRAWS, max_examples=20)  # 20 a format: the 60 the three shared before
    @given(case=strategy.filter(drawn_in_format))
    def check(case: Any) -> None:
        formats.add(CONTENT_TYPES[case.media_type])
        body = with_check_digits_in_body(case.body)
        raw = json.dumps(body).encode() if fmt == "json" else body.encode()
        job = intake(raw, fmt)
        unexplained = [
            (n, reason)
            for n, reason in job.rejections
            if not any(rule.fullmatch(reason) for rule in LINE_REJECTIONS)
        ]
        assert not unexplained, raw[:2000]
        assert job.accepted + job.rejected > 0

    check()
    assert formats == {fmt}
