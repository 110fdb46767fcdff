"""Answers other than success, in one format: ``application/problem+json`` (RFC 9457).

Every 4xx and 5xx the API answers (its own refusals, an API key refused, FastAPI's request
validation, an unknown route or method, a failure nobody expected) is a problem: ``type``
(``about:blank``: the status says what happened), ``title`` (the status's phrase), ``status``
and ``detail``, the one line clients have always read. A body with more to say keeps its other
members as extension members (a refused job's ``rejections``). 503 comes with ``Retry-After``.
The probes (``/readyz``) answer plain text, as the recorder's and the relay's do.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any, Final

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from bulk_recorder.exceptions import BulkRecorderError
from bulk_recorder.producer.api.examples import problem_example

log = logging.getLogger(__name__)

__all__ = [
    "CLOSE_CONNECTION",
    "PROBLEM_MEDIA_TYPE",
    "REPLAYED_HEADER",
    "RETRY_AFTER",
    "ApiError",
    "Problem",
    "answer_errors_as_problems",
    "json_response",
    "problem",
    "problem_responses",
]

PROBLEM_MEDIA_TYPE: Final = "application/problem+json"
REPLAYED_HEADER: Final = "Idempotent-Replayed"
# An answer given before the whole body was read: the server closes the connection rather than
# read (and drop) the rest of it.
CLOSE_CONNECTION: Final = {"Connection": "close"}
RETRY_AFTER: Final = {"Retry-After": "1"}


class ApiError(BulkRecorderError):
    """An answer other than success: status code, detail, optional extension members and
    headers."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.extra = extra or {}
        self.headers = headers


class Problem(BaseModel):
    """An ``application/problem+json`` body (RFC 9457)."""

    type: str = Field("about:blank", description="about:blank: the status says what happened")
    title: str = Field(description="the status's phrase", examples=["Unprocessable Entity"])
    status: int = Field(examples=[422])
    detail: str = Field(description="what was wrong, in one line")


def problem(
    status: int,
    detail: str,
    *,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> JSONResponse:
    """The problem+json answer ``status`` with ``detail``, and ``extra`` as extension members."""
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    body = Problem(title=title, status=status, detail=detail).model_dump()
    return JSONResponse(
        {**body, **(extra or {})},
        status_code=status,
        headers=headers,
        media_type=PROBLEM_MEDIA_TYPE,
    )


def json_response(status: int, body: BaseModel | dict[str, Any], **headers: str) -> JSONResponse:
    content = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
    return JSONResponse(content, status_code=status, headers=headers or None)


def problem_responses(
    described: dict[int, str | None],
    *,
    schemas: dict[int, tuple[str, ...]] | None = None,
    examples: dict[int, dict[str, dict[str, Any]]] | None = None,
) -> dict[int | str, dict[str, Any]]:
    """A route's error answers for the OpenAPI document: each status with its description
    (None: the status's phrase) and a problem+json body (``schemas`` names other components
    than ``Problem`` for some: any of them) with an example of that status (``examples`` gives
    named ones instead); 503 documents ``Retry-After``."""
    out: dict[int | str, dict[str, Any]] = {}
    for status, description in described.items():
        refs = [
            {"$ref": f"#/components/schemas/{name}"}
            for name in (schemas or {}).get(status, ("Problem",))
        ]
        media: dict[str, Any] = {"schema": refs[0] if len(refs) == 1 else {"anyOf": refs}}
        if examples and status in examples:
            media["examples"] = examples[status]
        else:
            media["example"] = problem_example(status)
        answer: dict[str, Any] = {
            "description": description or HTTPStatus(status).phrase,
            "content": {PROBLEM_MEDIA_TYPE: media},
        }
        if status == 503:
            answer["headers"] = {
                "Retry-After": {
                    "description": "seconds to wait before retrying",
                    "schema": {"type": "integer"},
                }
            }
        out[status] = answer
    return out


def answer_errors_as_problems(app: FastAPI) -> None:
    """Answer every error the app raises, FastAPI's and Starlette's own included, as a problem."""

    @app.exception_handler(ApiError)
    async def on_api_error(_request: Request, exc: ApiError) -> Response:
        return problem(exc.status, exc.detail, headers=exc.headers, extra=exc.extra)

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_request: Request, exc: RequestValidationError) -> Response:
        parts = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error.get("loc", ()))
            parts.append(f"{where}: {error.get('msg', 'invalid')}")
        return problem(422, "; ".join(parts) or "invalid request")

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(exc.headers) if exc.headers else None
        return problem(exc.status_code, str(exc.detail), headers=headers)

    @app.exception_handler(ClientDisconnect)
    async def on_disconnect(_request: Request, _exc: ClientDisconnect) -> Response:
        log.info("client disconnected before the body was complete; nothing stored")
        return problem(400, "the client disconnected before the body was complete")

    @app.exception_handler(Exception)
    async def on_failure(_request: Request, _exc: Exception) -> Response:
        # Starlette raises it on to the server, which logs it; the client gets no internals.
        return problem(500, HTTPStatus.INTERNAL_SERVER_ERROR.phrase)
