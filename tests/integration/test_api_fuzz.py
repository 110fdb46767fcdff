"""Schemathesis against a real API process with a key: the OpenAPI document says what the API
accepts.

``st run`` reads ``/openapi.json`` from a running ``bulk-recorder api`` and sends the requests
it generates from it (examples, boundary values, random data; schema-valid and invalid), with a
fixed seed and a fixed number of cases an operation. Checks: no server error, every answer as
the document describes it (status, content type, headers, body), and
:func:`tests.integration.fuzz_checks.schema_valid_requests_are_accepted`: a request the
document calls valid is accepted, unless it breaks one of the rules no schema can state that
the document names (check digits, sums, distinct ids, state), known by their reasons.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, free_port
from tests.integration.fuzz_checks import rule_of
from tests.integration.producer_support import provision_key, running_api

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]

CONFIG = Path(__file__).with_name("schemathesis.toml")  # seed, phases, cases an operation
CHECKS = ",".join(
    (
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "schema_valid_requests_are_accepted",  # tests/integration/fuzz_checks.py
    )
)


async def run_schemathesis(base: str, key: str, out_dir: Path) -> tuple[int, str]:
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.integration.fuzz_checks",
        "FUZZ_ANSWERS": str(out_dir / "answers.jsonl"),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(CONFIG),
        "run",
        f"{base}/openapi.json",
        "--header",
        f"Authorization: Bearer {key}",
        "--checks",
        CHECKS,
        "--no-color",
        "--report",
        "json",
        "--report-json-path",
        str(out_dir / "report.json"),
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace")


async def test_schemathesis_finds_no_request_the_spec_and_the_api_disagree_on(
    make_settings, tmp_path: Path
) -> None:
    settings = make_settings(api_port=free_port())
    key = await provision_key(settings.database_url)
    base = f"http://127.0.0.1:{settings.api_port}"
    async with running_api(settings, tmp_path / "api.log"):
        started = time.monotonic()
        code, out = await run_schemathesis(base, key, tmp_path)
        took = time.monotonic() - started
    report = json.loads((tmp_path / "report.json").read_text())
    answers = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    print(out[-3000:])
    print(summary(report, answers, took))
    refused = [a for a in answers if a["refused"]]
    assert not refused, "\n".join(json.dumps(a) for a in refused[:20])
    assert code == 0, out[-20000:]
    # The run reached what it is for: valid jobs and transactions accepted, a job's status read.
    accepted = Counter(a["operation"] for a in answers if a["status"] < 300)
    assert accepted["POST /v1/transactions"] > 0
    assert accepted["POST /v1/credit-annotation-jobs"] > 0
    assert accepted["GET /v1/credit-annotation-jobs/{job_id}"] > 0
    assert report["test_cases"]["generated"] > 300


def summary(report: dict[str, Any], answers: list[dict[str, Any]], took: float) -> str:
    """The run's figures: cases, time, and the answers to schema-valid requests by outcome."""
    outcomes: Counter[tuple[str, str]] = Counter()
    for answer in answers:
        if answer["status"] < 300:
            outcome = str(answer["status"])
        else:
            reasons = {rule_of(reason) for reason in answer["reasons"]}
            outcome = f"{answer['status']} {' | '.join(sorted(reasons))[:120]}"
        outcomes[(answer["operation"], outcome)] += 1
    lines = [
        f"schemathesis: {report['test_cases']['generated']} cases generated in "
        f"{report['running_time']:.1f} s ({took:.1f} s with start-up); schema-valid answers:"
    ]
    lines += [f"  {n:5} {op}: {outcome}" for (op, outcome), n in sorted(outcomes.items())]
    return "\n".join(lines)
