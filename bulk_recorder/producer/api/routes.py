"""The routes: each handler checks the request, then hands it to its module
(:mod:`.transactions`, :mod:`.jobs`).
"""

from __future__ import annotations

import logging
import uuid
from typing import Annotated, Any, Final, cast

from fastapi import FastAPI, Header, Path, Request
from fastapi.responses import PlainTextResponse, Response

from bulk_recorder.infra.errors import DB_ERRORS
from bulk_recorder.infra.metrics import exposition
from bulk_recorder.producer.api.auth import AUTH_RESPONSES, JobReader, JobWriter, TransactionWriter
from bulk_recorder.producer.api.body import checked_idempotency_key, media_type_of, read_limited
from bulk_recorder.producer.api.context import ApiContext
from bulk_recorder.producer.api.examples import (
    JOB_ACCEPTED,
    JOB_REFUSED,
    TRANSACTION_ACCEPTED,
    TRANSACTION_RECORDED,
    problem_example,
)
from bulk_recorder.producer.api.job_bodies import job_request_body
from bulk_recorder.producer.api.job_status import JobStatus
from bulk_recorder.producer.api.jobs import accept_job, job_status
from bulk_recorder.producer.api.models import (
    IDEMPOTENCY_DOC,
    TRANSACTION_BODY,
    JobAccepted,
    TransactionAccepted,
)
from bulk_recorder.producer.api.problems import ApiError, json_response, problem_responses
from bulk_recorder.producer.api.transactions import accept_transaction
from bulk_recorder.producer.outbox import outbox_stats, record_stats
from bulk_recorder.producer.parsers import CONTENT_TYPES
from bulk_recorder.records import RecordError, Transaction, decode

log = logging.getLogger(__name__)

KEY_REUSED: Final = "Idempotency-Key was already used for a different request body"
NOT_A_UUID: Final = "Input should be a valid UUID, invalid character: found `x` at 0"

# Each route's error answers in the OpenAPI document: problem+json, with their causes.
TRANSACTION_ERRORS: Final[dict[int | str, dict[str, Any]]] = {
    **problem_responses(
        {
            400: "a malformed Idempotency-Key",
            409: "the id was accepted with other content",
            413: None,
            415: None,
            422: "invalid transaction, or key reused",
            503: "the database is unreachable",
        },
        examples={
            422: {
                "invalid": {"value": problem_example(422)},
                "key reused": {"value": problem_example(422, KEY_REUSED)},
            }
        },
    ),
    **AUTH_RESPONSES,
}
JOB_ERRORS: Final[dict[int | str, dict[str, Any]]] = {
    **problem_responses(
        {
            400: "the body cannot be split into lines",
            408: "the body came too slowly",
            413: None,
            415: None,
            422: "no line is valid (JobRefused), or key reused (Problem)",
            503: "the database is unreachable",
        },
        schemas={422: ("JobRefused", "Problem")},
        examples={
            422: {
                "no valid line": {"value": JOB_REFUSED},
                "key reused": {"value": problem_example(422, KEY_REUSED)},
            }
        },
    ),
    **AUTH_RESPONSES,
}
JOB_STATUS_ERRORS: Final[dict[int | str, dict[str, Any]]] = {
    **problem_responses(
        {
            404: "no such job, or another client's job",
            422: "the id is not a UUID",
            503: "the database is unreachable",
        },
        examples={
            422: {"not a UUID": {"value": problem_example(422, "path.job_id: " + NOT_A_UUID)}}
        },
    ),
    **AUTH_RESPONSES,
}


# The job's status, from the id of the 202 (OpenAPI links: clients and fuzzers follow them).
JOB_LINKS: Final = {
    "status": {
        "operationRef": "#/paths/~1v1~1credit-annotation-jobs~1{job_id}/get",
        "parameters": {"job_id": "$response.body#/id"},
        "description": "The job's status and progress.",
    }
}


def add_operation_routes(app: FastAPI, ctx: ApiContext) -> None:
    """``/healthz``, ``/readyz`` and ``/metrics``."""

    @app.get(
        "/healthz",
        response_class=PlainTextResponse,
        tags=["operations"],
        operation_id="getLiveness",
        summary="Liveness: the process is alive",
        response_description="alive: `ok`",
    )
    async def healthz() -> str:
        """The process is alive."""
        return "ok\n"

    @app.get(
        "/readyz",
        operation_id="getReadiness",
        summary="Readiness: the database answers",
        response_description="ready: `database up`",
        response_class=PlainTextResponse,
        tags=["operations"],
        responses={
            503: {
                "description": "database unreachable (a probe: plain text, as every role's)",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    )
    async def readyz() -> Response:
        """Ready to accept work: the database answers (the broker is not needed)."""
        try:
            async with ctx.db.acquire(timeout=2) as conn:
                await conn.fetchval("SELECT 1", timeout=2)
        except (ApiError, *DB_ERRORS) as exc:
            log.debug("not ready: %s", exc)
            return PlainTextResponse("database down\n", status_code=503)
        return PlainTextResponse("database up\n")

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        tags=["operations"],
        operation_id="getMetrics",
        summary="Prometheus metrics",
        response_description="the text format, or OpenMetrics when asked (`Accept`)",
    )
    async def metrics_endpoint(request: Request) -> Response:
        """Prometheus metrics; outbox backlog and oldest age are read at scrape time."""
        try:
            async with ctx.db.acquire(timeout=2) as conn:
                record_stats(ctx.metrics, await outbox_stats(conn))
        except (ApiError, *DB_ERRORS) as exc:
            log.debug("outbox stats unavailable: %s", exc)
        body, headers = exposition(
            ctx.metrics.registry,
            request.headers.get("accept", ""),
            request.headers.get("accept-encoding", ""),
        )
        return Response(body, headers=headers)


def add_transaction_routes(app: FastAPI, ctx: ApiContext) -> None:
    """``POST /v1/transactions``."""
    settings = ctx.settings

    @app.post(
        "/v1/transactions",
        operation_id="createTransaction",
        summary="Record a transaction",
        tags=["transactions"],
        status_code=202,
        response_model=TransactionAccepted,
        openapi_extra=TRANSACTION_BODY,
        responses={
            202: {
                "description": "accepted (async mode): stored with its outbox row, recorded soon",
                "content": {"application/json": {"example": TRANSACTION_ACCEPTED}},
            },
            201: {
                "model": TransactionAccepted,
                "description": "recorded (sync mode): written with its operations and balances",
                "content": {"application/json": {"example": TRANSACTION_RECORDED}},
            },
            **TRANSACTION_ERRORS,
        },
    )
    async def post_transaction(
        request: Request,
        principal: TransactionWriter,
        idempotency_key: Annotated[
            str | None, Header(alias="Idempotency-Key", description=IDEMPOTENCY_DOC)
        ] = None,
    ) -> Response:
        """Accept one transaction: 202 (async, via the outbox) or 201 (sync, written now)."""
        key = checked_idempotency_key(idempotency_key)
        media = media_type_of(request)
        if media is not None and media != "application/json" and not media.endswith("+json"):
            raise ApiError(415, f"Content-Type must be application/json, not {media}")
        limit = settings.bulk_recorder_max_message_bytes
        body = await read_limited(request, limit, settings)
        try:
            record = decode(body, "transaction", max_bytes=limit)
        except RecordError as exc:
            raise ApiError(422, exc.reason) from None
        assert isinstance(record, Transaction)
        return await accept_transaction(ctx, record, body, key, principal.client)


def add_job_routes(app: FastAPI, ctx: ApiContext) -> None:
    """``POST /v1/credit-annotation-jobs`` and ``GET /v1/credit-annotation-jobs/{id}``."""

    @app.post(
        "/v1/credit-annotation-jobs",
        operation_id="createCreditAnnotationJob",
        summary="Submit a credit-annotation job",
        tags=["credit annotation jobs"],
        status_code=202,
        response_model=JobAccepted,
        openapi_extra=job_request_body(ctx.max_job_lines),
        responses={
            202: {
                "description": "accepted: its valid lines go to the outbox",
                "links": JOB_LINKS,
                "content": {"application/json": {"example": JOB_ACCEPTED}},
            },
            **JOB_ERRORS,
        },
    )
    async def post_job(
        request: Request,
        principal: JobWriter,
        idempotency_key: Annotated[
            str | None, Header(alias="Idempotency-Key", description=IDEMPOTENCY_DOC)
        ] = None,
    ) -> Response:
        """Accept a run of credit annotations: every valid line is stored with its outbox row in
        one database transaction; invalid lines are listed with their numbers and reasons."""
        key = checked_idempotency_key(idempotency_key)
        media = media_type_of(request)
        fmt = CONTENT_TYPES.get(media or "")
        if fmt is None:
            accepted = ", ".join(CONTENT_TYPES)
            raise ApiError(415, f"Content-Type must be one of {accepted}; got {media or 'none'}")
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            raise ApiError(415, f"Content-Encoding {encoding} is not supported; send identity")
        return await accept_job(ctx, request, fmt, cast(str, media), key, principal.client)

    @app.get(
        "/v1/credit-annotation-jobs/{job_id}",
        operation_id="getCreditAnnotationJob",
        summary="Read a job's status and progress",
        tags=["credit annotation jobs"],
        response_model=JobStatus,
        responses={
            # its example (with nulls, which FastAPI drops from a decorator's) is set by the
            # app's openapi(): examples.attach_nullable
            200: {"description": "the job's status and counts"},
            **JOB_STATUS_ERRORS,
        },
    )
    async def get_job(
        job_id: Annotated[uuid.UUID, Path()],
        principal: JobReader,
    ) -> Response:
        """Status and progress of a job (poll it to draw a progress bar): the client's own
        jobs, or every job for an admin key."""
        return json_response(200, await job_status(ctx, job_id, principal))
