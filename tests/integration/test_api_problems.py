"""One error format for the whole ingest API: every 4xx and 5xx it answers is
``application/problem+json`` (RFC 9457) with ``type``, ``title``, ``status`` and ``detail``, and
``detail`` says exactly what it said before problem+json, so that clients reading ``detail`` keep
working. Extra members of a body (a refused job's rejected lines) stay, as extension members."""

from __future__ import annotations

import uuid
from http import HTTPStatus
from typing import Any

import httpx
import pytest

from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.producer.api import create_app
from consumer.tools.generator import Generator
from tests.integration.producer_support import api_client, bearer, ndjson, provision_key

pytestmark = [pytest.mark.postgres]

PROBLEM = "application/problem+json"
JOBS = "/v1/credit-annotation-jobs"
NDJSON = {"content-type": "application/x-ndjson"}


def assert_problem(response: httpx.Response, status: int, detail: str) -> dict[str, Any]:
    """The answer is ``status`` as problem+json, and its ``detail`` is ``detail``."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["detail"] == detail, body  # what clients read, unchanged
    assert response.headers["content-type"] == PROBLEM, (status, response.headers)
    assert body["type"] == "about:blank"
    assert body["title"] == HTTPStatus(status).phrase
    assert body["status"] == status
    return dict(body)


async def test_every_error_answer_is_problem_json_with_the_detail_clients_read(
    make_settings,
) -> None:
    settings = make_settings(bulk_recorder_max_message_bytes=1024)
    gen = Generator.create(20)
    tx = gen.transaction()
    changed = {**tx, "description": "other"}
    job = uuid.uuid4()
    async with api_client(settings, max_job_lines=3) as (client, _):
        answers = {
            "415": await client.post(
                "/v1/transactions", content=b"{}", headers={"content-type": "text/plain"}
            ),
            "400": await client.post("/v1/transactions", json=tx, headers={"Idempotency-Key": ""}),
            "413": await client.post(
                "/v1/transactions",
                content=b" " * 2000,
                headers={"content-type": "application/json"},
            ),
            "422 record": await client.post("/v1/transactions", content=b"[]"),
            "404 job": await client.get(f"{JOBS}/{job}"),
            "422 path": await client.get(f"{JOBS}/not-a-uuid"),
            "404 route": await client.get("/v1/nothing"),
            "405": await client.put("/v1/transactions"),
            "413 lines": await client.post(
                JOBS, content=ndjson([gen.credit_annotation() for _ in range(4)]), headers=NDJSON
            ),
            "422 job": await client.post(JOBS, content=ndjson([{"a": 1}]), headers=NDJSON),
        }
        assert (await client.post("/v1/transactions", json=tx)).status_code in (201, 202)
        answers["409"] = await client.post("/v1/transactions", json=changed)

    assert_problem(answers["415"], 415, "Content-Type must be application/json, not text/plain")
    assert_problem(
        answers["400"], 400, "Idempotency-Key must be 1 to 255 printable ASCII characters"
    )
    assert_problem(answers["413"], 413, "body too large (2000 bytes > 1024)")
    assert_problem(answers["422 record"], 422, "body must be a JSON object")
    assert_problem(answers["404 job"], 404, f"no credit-annotation job {job}")
    assert_problem(
        answers["422 path"],
        422,
        "path.job_id: Input should be a valid UUID, invalid character: found `n` at 0",
    )
    assert_problem(answers["404 route"], 404, "Not Found")
    assert_problem(answers["405"], 405, "Method Not Allowed")
    assert answers["405"].headers["allow"] == "POST"
    assert_problem(answers["413 lines"], 413, "a job has at most 3 lines")
    refused = assert_problem(answers["422 job"], 422, "no valid line in the job")
    assert refused["rejected"] == 1  # the rejected lines stay, as extension members
    assert [r["line"] for r in refused["rejections"]] == [1]
    assert refused["rejections_truncated"] is False
    assert_problem(
        answers["409"], 409, f"transaction {tx['id']} was already accepted with other content"
    )


async def test_auth_refusals_and_an_unreachable_database_are_problem_json(make_settings) -> None:
    settings = make_settings()
    key = await provision_key(settings.database_url, "reader", ["jobs:read"])
    async with api_client(settings) as (client, _):
        missing = await client.get(f"{JOBS}/{uuid.uuid4()}", headers={"Authorization": ""})
        denied = await client.post("/v1/transactions", json={}, headers=bearer(key))
    assert_problem(missing, 401, "the Authorization header must be Bearer <API key>")
    assert_problem(denied, 403, "this API key lacks the scope transactions:write")

    # No lifespan: the pool never opens, as when the database is away at start-up.
    for auth in ("on", "off"):
        app = create_app(make_settings(api_auth=auth), metrics=Metrics())
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
            down = await client.post(JOBS, content=b"", headers={**NDJSON, **bearer(key)})
        assert_problem(down, 503, "database unavailable; retry later")
        assert down.headers["retry-after"] == "1"


async def test_an_unexpected_failure_is_a_500_problem(make_settings) -> None:
    app = create_app(make_settings(api_auth="off"), metrics=Metrics())

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as client:
        answer = await client.get("/boom")
    assert_problem(answer, 500, "Internal Server Error")


async def test_the_openapi_document_says_every_error_answer_is_problem_json(
    make_settings,
) -> None:
    async with api_client(make_settings()) as (client, _):
        spec = (await client.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    assert {"type", "title", "status", "detail"} <= set(schemas["Problem"]["properties"])
    # The probes answer plain text, as the recorder's and the relay's: a probe reads the status.
    readyz = spec["paths"].pop("/readyz")["get"]["responses"]["503"]
    assert set(readyz["content"]) == {"text/plain"}
    errors = {
        f"{method.upper()} {path} {code}": answer
        for path, methods in spec["paths"].items()
        for method, operation in methods.items()
        for code, answer in operation["responses"].items()
        if code[0] in "45"
    }
    assert len(errors) > 15  # every /v1 route documents its errors
    not_problem = {
        where: sorted(answer.get("content", {}))
        for where, answer in errors.items()
        if set(answer.get("content", {})) != {PROBLEM}
    }
    assert not_problem == {}
    # A job refused for its lines carries them; a reused key is a plain problem.
    refused = errors["POST /v1/credit-annotation-jobs 422"]["content"][PROBLEM]["schema"]
    assert refused == {
        "anyOf": [
            {"$ref": "#/components/schemas/JobRefused"},
            {"$ref": "#/components/schemas/Problem"},
        ]
    }
    assert "rejections" in schemas["JobRefused"]["properties"]
    assert "Retry-After" in errors["POST /v1/transactions 503"]["headers"]
