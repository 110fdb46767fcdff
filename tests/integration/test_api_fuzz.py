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
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, free_port, settings_env, wait_for
from tests.integration.producer_support import provision_key

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]

SEED = 20261201
MAX_EXAMPLES = 60  # an operation's random cases; the examples and boundary values come on top
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


@contextlib.asynccontextmanager
async def running_api(settings: Any, log_path: Path) -> AsyncIterator[str]:
    """``bulk-recorder api`` in a child process, ready; stopped with SIGTERM afterwards."""
    base = f"http://127.0.0.1:{settings.api_port}"
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "consumer.cli",
            "api",
            env=settings_env(settings),
            stdout=log_file,
            stderr=log_file,
        )
        try:
            async with httpx.AsyncClient(base_url=base, timeout=5) as client:

                async def up() -> bool:
                    try:
                        return (await client.get("/readyz")).status_code == 200
                    except httpx.TransportError:
                        return False

                await wait_for(up, timeout=30)
            yield base
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def run_schemathesis(base: str, key: str, out_dir: Path) -> tuple[int, str]:
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.integration.fuzz_checks",
        "FUZZ_REFUSALS": str(out_dir / "refusals.jsonl"),
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{base}/openapi.json",
        "--header",
        f"Authorization: Bearer {key}",
        "--seed",
        str(SEED),
        "--max-examples",
        str(MAX_EXAMPLES),
        "--workers",
        "1",
        "--checks",
        CHECKS,
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--continue-on-failure",
        "--max-failures",
        "50",
        "--request-timeout",
        "20",
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
    async with running_api(settings, tmp_path / "api.log") as base:
        started = time.monotonic()
        code, out = await run_schemathesis(base, key, tmp_path)
        took = time.monotonic() - started
    print(out[-6000:])
    refusals = tmp_path / "refusals.jsonl"
    if refusals.exists():
        for line in refusals.read_text().splitlines():
            print("REFUSED", line)
    print(f"schemathesis: {took:.1f} s")
    assert code == 0, out[-20000:]
    report = json.loads((tmp_path / "report.json").read_text())
    print(json.dumps(report.get("summary", report), indent=1)[:3000])
