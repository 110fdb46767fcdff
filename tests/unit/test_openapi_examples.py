"""What /docs shows matches what the API answers: each operation's own title, and for every
answer an example of that answer (its own status, valid against its own schema).

Swagger UI draws an example from the schema when a response has none: every problem answer
then showed the ``Problem`` model's example, a 422, under 400, 401, 403, 409, 413, 415 and 503.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

import bulk_recorder
from bulk_recorder.producer.api import create_app
from settings import Settings

SUMMARIES = {
    ("get", "/healthz"): "Liveness: the process is alive",
    ("get", "/readyz"): "Readiness: the database answers",
    ("get", "/metrics"): "Prometheus metrics",
    ("post", "/v1/transactions"): "Record a transaction",
    ("post", "/v1/credit-annotation-jobs"): "Submit a credit-annotation job",
    ("get", "/v1/credit-annotation-jobs/{job_id}"): "Read a job's status and progress",
}
JSON_MEDIA = ("application/json", "application/problem+json")


def _document() -> dict[str, Any]:
    return create_app(Settings()).openapi()


def _answers() -> list[tuple[str, str, str, dict[str, Any]]]:
    """(operation, status, media type, media object) of every JSON answer in the document."""
    found = []
    for path, item in _document()["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                for media, content in response.get("content", {}).items():
                    if media in JSON_MEDIA:
                        found.append((f"{method.upper()} {path}", status, media, content))
    return found


def _examples(content: dict[str, Any]) -> list[Any]:
    if "example" in content:
        return [content["example"]]
    return [example["value"] for example in content.get("examples", {}).values()]


def test_each_operation_has_its_own_title_not_fastapis_default() -> None:
    found = {
        (method, path): operation.get("summary")
        for path, item in _document()["paths"].items()
        for method, operation in item.items()
    }
    assert found == SUMMARIES


def test_the_documents_version_is_the_packages() -> None:
    assert _document()["info"]["version"] == bulk_recorder.__version__


def test_no_success_answer_reads_successful_response() -> None:
    for path, item in _document()["paths"].items():
        for method, operation in item.items():
            for status, response in operation["responses"].items():
                where = f"{method.upper()} {path} {status}"
                assert response["description"] != "Successful Response", where


@pytest.mark.parametrize(
    ("operation", "status", "media", "content"),
    _answers(),
    ids=[f"{o} {s}" for o, s, _, _ in _answers()],
)
def test_every_json_answer_has_an_example_of_itself(
    operation: str, status: str, media: str, content: dict[str, Any]
) -> None:
    examples = _examples(content)
    assert examples, f"{operation} {status}: no example (Swagger would draw one from the schema)"
    document = _document()
    schema = {**content["schema"], "components": document["components"]}
    for example in examples:
        jsonschema.validate(example, schema, cls=jsonschema.Draft202012Validator)
        if media == "application/problem+json":
            assert example["status"] == int(status), (operation, status, example)
            assert example["title"] == HTTPStatus(int(status)).phrase, (operation, example)


def test_the_transaction_answers_say_their_own_mode() -> None:
    responses = _document()["paths"]["/v1/transactions"]["post"]["responses"]
    (recorded,) = _examples(responses["201"]["content"]["application/json"])
    (accepted,) = _examples(responses["202"]["content"]["application/json"])
    assert (recorded["status"], recorded["mode"]) == ("recorded", "sync")
    assert (accepted["status"], accepted["mode"]) == ("accepted", "async")
