"""The ingest API: an ASGI app (FastAPI) that accepts transactions and credit-annotation jobs.

Routes (OpenAPI at ``/openapi.json``, browsable at ``/docs``):

- ``POST /v1/transactions``: one transaction message (DESIGN.md section 4), validated with
  :func:`bulk_recorder.records.decode` like the recorder does. ``RABBITMQ_TRANSACTION_ASYNC=true``:
  the request row and an outbox row are written in ONE database transaction, answer 202 (the
  relay publishes it, the recorder records it). ``false``: the transaction, its operations and
  its balance effects are written at once by :class:`PgWriter`, answer 201. Either way a repeat
  of the same id or ``Idempotency-Key`` is answered with the first outcome, never a second row.
- ``POST /v1/credit-annotation-jobs``: JSON array, NDJSON or CSV, streamed; each line validated
  with ``decode``; accepted lines are staged as they arrive (COPY, short transactions: see
  :mod:`bulk_recorder.job_staging`), and once the body is complete the job row and all its
  outbox rows are written in one database transaction; answer 202 with the job id, counts and
  rejected lines. Always asynchronous. Bounded: ``API_MAX_JOB_BYTES`` (413), every line counts
  toward the line limit (413), ``API_BODY_TIMEOUT_S`` and ``API_UPLOAD_TIMEOUT_S`` (408).
- ``GET /v1/credit-annotation-jobs/{id}``: status and progress.
- ``/healthz`` (alive), ``/readyz`` (database reachable), ``/metrics`` (Prometheus).

Bad input gets a 4xx with a precise ``detail``; an unreachable database gets 503 with
``Retry-After``. The broker is not needed to accept work: that is what the outbox is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Annotated, Any, Final, Literal, cast

import asyncpg
from fastapi import FastAPI, Header, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from bulk_recorder import pg_hosts
from bulk_recorder.errors import DataRejected, TransientDbError, classify, renew_if_server_gone
from bulk_recorder.ingest import CONTENT_TYPES, FormatError, JobIntake, TooManyLines, parser_for
from bulk_recorder.job_staging import JobStaging
from bulk_recorder.loadgen import uuid7
from bulk_recorder.metrics import Metrics
from bulk_recorder.migrate import migrate
from bulk_recorder.outbox import enqueue, notify, outbox_stats, record_stats
from bulk_recorder.records import RecordError, Transaction, decode
from bulk_recorder.writer import PgWriter, WriteResult
from settings import Settings

log = logging.getLogger(__name__)

__all__ = ["ApiError", "create_app"]

API_VERSION: Final = "1.0.0"
DEFAULT_MAX_JOB_LINES: Final = 1_000_000
MAX_IDEMPOTENCY_KEY_LEN: Final = 255
COPY_BATCH_ROWS: Final = 5_000  # accepted lines staged per COPY
FEED_SLICE_BYTES: Final = 16_384  # ~60 annotation lines, ~1 ms of validation
REPLAYED_HEADER: Final = "Idempotent-Replayed"
# A job's recorded count is a count(*) over its rows (300,000 at the end of the main job): one
# count a second per job serves any number of clients polling for a progress bar.
RECORDED_COUNT_TTL_S: Final = 1.0
_RECORDED_CACHE_MAX: Final = 10_000

# InternalClientError: what asyncpg raises on a connection the server has just terminated.
_DB_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    OSError,
    TimeoutError,
)


# -- OpenAPI models (the wire format is validated by decode(); these document it) -------------

Amount = Annotated[
    str | int,
    Field(
        description="Exact decimal as a JSON string or integer, at most 20 integer and 18 "
        "fractional digits; never a float.",
        examples=["150.00"],
    ),
]


class OperationIn(BaseModel):
    id: uuid.UUID
    account_id: uuid.UUID
    type: Literal["DEBIT", "CREDIT"]
    amount: Amount
    asset_code: str = Field(pattern=r"^[A-Z][A-Z0-9]{0,9}$", examples=["BRL"])


class TransactionIn(BaseModel):
    """A ledger transaction: debits sum to credits sum to ``amount``, every amount > 0."""

    id: uuid.UUID
    organization_id: uuid.UUID
    ledger_id: uuid.UUID
    description: str | None = None
    status: Literal["PENDING", "APPROVED", "CANCELED"]
    asset_code: str = Field(pattern=r"^[A-Z][A-Z0-9]{0,9}$", examples=["BRL"])
    amount: Amount
    created_at: datetime | None = None
    metadata: dict[str, Any] | None = None
    operations: list[OperationIn] = Field(min_length=2)


class CreditAnnotationIn(BaseModel):
    """One job line. ``job_id`` is ignored: every line gets the job's id."""

    id: uuid.UUID
    job_id: uuid.UUID | None = None
    document: str = Field(
        description="CPF (11 digits) or CNPJ (14 characters, numeric or alphanumeric) with "
        "valid check digits; punctuation allowed.",
        examples=["529.982.247-25", "12.ABC.345/01DE-35"],
    )
    kind: Literal["RESTRICTION", "RELEASE"]
    creditor: str
    amount: Amount
    occurred_on: date
    reason: str | None = None


class Problem(BaseModel):
    detail: str


class TransactionAccepted(BaseModel):
    id: str
    status: Literal["accepted", "recorded"] = Field(
        description="accepted: stored with an outbox row, recorded later (202); recorded: "
        "written with its operations and balance effects (201)."
    )
    mode: Literal["async", "sync"]


class LineRejection(BaseModel):
    line: int = Field(
        description="1-based: the physical line (NDJSON), the line where the record starts "
        "(CSV, header is line 1) or the element's position (JSON array)."
    )
    reason: str


class JobAccepted(BaseModel):
    id: str
    status: Literal["accepted"] = "accepted"
    accepted: int
    rejected: int
    rejections: list[LineRejection] = Field(description="The first rejected lines, in order.")
    rejections_truncated: bool
    status_url: str


class JobRefused(Problem):
    rejected: int
    rejections: list[LineRejection]
    rejections_truncated: bool


class JobStatus(BaseModel):
    id: str
    status: Literal["publishing", "recording", "completed"] = Field(
        description="publishing: rows still in the outbox; recording: all published, not all "
        "recorded yet; completed: recorded + dead_lettered == accepted."
    )
    accepted: int
    rejected: int
    published: int = Field(description="Outbox rows the relay published and confirmed.")
    recorded: int = Field(
        description="Lines recorded: credit_annotations rows carrying this job's id, plus the "
        "job's lines whose id was already recorded by another job (that row keeps its job id)."
    )
    dead_lettered: int = Field(
        description="Outbox rows the relay parked after the broker refused them repeatedly. "
        "Messages the recorder dead-letters are not counted here (see the DLQ)."
    )
    progress: float = Field(description="(recorded + dead_lettered) / accepted, 0 to 1.")
    created_at: datetime
    completed_at: datetime | None


_TRANSACTION_BODY: Final[dict[str, Any]] = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TransactionIn"}}},
    }
}
_JOB_BODY: Final[dict[str, Any]] = {
    "requestBody": {
        "required": True,
        "description": "Streamed: JSON array of objects, NDJSON (one object a line) or CSV "
        "with a header row (columns id, job_id, document, kind, creditor, amount, "
        "occurred_on, reason; job_id and reason optional).",
        "content": {
            "application/json": {
                "schema": {
                    "type": "array",
                    "items": {"$ref": "#/components/schemas/CreditAnnotationIn"},
                }
            },
            "application/x-ndjson": {"schema": {"$ref": "#/components/schemas/CreditAnnotationIn"}},
            "text/csv": {"schema": {"type": "string"}},
        },
    }
}
_IDEMPOTENCY_DOC = (
    "Optional, 1 to 255 printable ASCII characters. A repeat with the same key gets the "
    "first outcome (header Idempotent-Replayed: true); the same key with a different body "
    "gets 422."
)


class _Api(FastAPI):
    """FastAPI with the schemas of the raw (decode-validated) request bodies in components."""

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema:
            return self.openapi_schema
        schema = super().openapi()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (TransactionIn, CreditAnnotationIn):
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
        return schema


# -- errors -------------------------------------------------------------------------------------


class ApiError(Exception):
    """An answer other than success: status code, detail, optional extra body and headers."""

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


async def _db_failure(ctx: _Context, exc: BaseException) -> ApiError:
    """The answer to a database failure; a server that refuses writes gets the pool renewed."""
    await renew_if_server_gone(ctx.pool, exc)
    err = exc if isinstance(exc, DataRejected | TransientDbError) else classify(exc)
    if isinstance(err, DataRejected):
        status = 409 if err.reason.startswith("23505") else 422
        return ApiError(status, f"refused by the database: {err.reason}")
    log.warning("database unavailable: %s", err)
    log.debug("database failure", exc_info=exc)
    return ApiError(503, "database unavailable; retry later", headers={"Retry-After": "1"})


def _json(status: int, body: BaseModel | dict[str, Any], **headers: str) -> JSONResponse:
    content = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
    return JSONResponse(content, status_code=status, headers=headers or None)


def _idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not (0 < len(value) <= MAX_IDEMPOTENCY_KEY_LEN and value.isascii() and value.isprintable()):
        raise ApiError(
            400,
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} printable ASCII characters",
        )
    return value


def _media_type(request: Request) -> str | None:
    raw = request.headers.get("content-type")
    if raw is None:
        return None
    return raw.split(";", 1)[0].strip().lower()


def _canonical_hash(body: bytes) -> bytes:
    """sha256 of the body's JSON with sorted keys: the same request however it is spaced."""
    canonical = json.dumps(
        json.loads(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).digest()


# An answer given before the whole body was read: the server closes the connection rather than
# read (and drop) the rest of it.
_CLOSE: Final = {"Connection": "close"}


def _check_declared_length(request: Request, limit: int) -> None:
    """413 from Content-Length alone, before any of the body is read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"body too large ({declared} bytes > {limit})", headers=_CLOSE)


async def _body(request: Request, limit: int, settings: Settings) -> AsyncGenerator[bytes, None]:
    """The request body chunk by chunk, bounded: more than ``limit`` bytes is 413; nothing
    received for ``API_BODY_TIMEOUT_S``, or a body not complete ``API_UPLOAD_TIMEOUT_S`` after
    the first read, is 408. Use it under ``contextlib.aclosing``."""
    _check_declared_length(request, limit)
    idle, whole = settings.api_body_timeout_s, settings.api_upload_timeout_s
    loop = asyncio.get_running_loop()
    deadline = loop.time() + whole
    stream = request.stream()
    size = 0
    try:
        while True:
            left = deadline - loop.time()
            try:
                async with asyncio.timeout(min(idle, left)):
                    chunk = await anext(stream)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if idle < left:
                    reason = f"nothing received for {idle:g} s; send the body without pauses"
                else:
                    reason = f"the body was not complete within {whole:g} s"
                log.info("request body timeout after %d bytes: %s", size, reason)
                raise ApiError(408, f"request body timeout: {reason}", headers=_CLOSE) from None
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"body too large (more than {limit} bytes)", headers=_CLOSE)
            yield chunk
    finally:
        await stream.aclose()


async def _read_limited(request: Request, limit: int, settings: Settings) -> bytes:
    body = bytearray()
    async with contextlib.aclosing(_body(request, limit, settings)) as chunks:
        async for chunk in chunks:
            body += chunk
    return bytes(body)


# -- sync mode: PgWriter inside the request's transaction ----------------------------------------


class _Lent:
    def __init__(self, conn: asyncpg.pool.PoolConnectionProxy) -> None:
        self._conn = conn

    async def __aenter__(self) -> asyncpg.pool.PoolConnectionProxy:
        return self._conn

    async def __aexit__(self, *exc: object) -> None:
        return None


class _SameConnection:
    """Looks like a pool to :class:`PgWriter`: ``acquire()`` lends the request's connection, so
    the writer's transaction becomes a savepoint of the request's transaction and the request
    row commits with the transaction's rows, or neither does."""

    def __init__(self, conn: asyncpg.pool.PoolConnectionProxy) -> None:
        self._conn = conn

    def acquire(self) -> _Lent:
        return _Lent(self._conn)


# -- the app ----------------------------------------------------------------------------------


@dataclass
class _Context:
    settings: Settings
    metrics: Metrics
    max_job_lines: int
    pool_max_size: int
    pool: asyncpg.Pool | None = None
    recorded_cache: dict[uuid.UUID, tuple[float, int]] = field(default_factory=dict)
    # A job upload holds a pooled connection (its staging table's session, never an open
    # transaction) for as long as the client sends, within the body timeouts; at most half the
    # pool does, so that single transactions and status reads always find one.
    job_slots: asyncio.Semaphore = field(init=False)

    def __post_init__(self) -> None:
        self.job_slots = asyncio.Semaphore(max(1, self.pool_max_size // 2))

    @property
    def db(self) -> asyncpg.Pool:
        if self.pool is None:
            raise ApiError(503, "database unavailable; retry later", headers={"Retry-After": "1"})
        return self.pool


_INSERT_REQUEST = """
INSERT INTO transaction_requests (transaction_id, idempotency_key, request_hash, mode, status_code)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT DO NOTHING
RETURNING true
"""
_PRIOR_REQUEST = """
SELECT transaction_id::text AS id, idempotency_key, request_hash, mode, status_code
FROM transaction_requests
WHERE transaction_id = $1 OR idempotency_key = $2
ORDER BY (idempotency_key IS NOT DISTINCT FROM $2) DESC
LIMIT 1
"""
# Written once the body is complete, in the transaction that moves its staged lines into the
# outbox: a job is never visible before all its outbox rows are.
_INSERT_JOB = """
INSERT INTO credit_annotation_jobs (id, idempotency_key, content_type, accepted, rejected,
                                    rejections, rejections_truncated, request_hash)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING true
"""
_JOB_BY_KEY = "SELECT * FROM credit_annotation_jobs WHERE idempotency_key = $1"
_JOB_BY_ID = "SELECT * FROM credit_annotation_jobs WHERE id = $1"
# A job's recorded lines: its own rows, plus its lines whose id was already stored (under another
# job or none), which the recorder lists in credit_annotation_job_repeats.
_RECORDED = """
SELECT (SELECT count(*) FROM credit_annotations WHERE job_id = $1)
     + (SELECT count(*) FROM credit_annotation_job_repeats WHERE job_id = $1)
"""
_COMPLETE_JOB = """
UPDATE credit_annotation_jobs SET recorded = $2, completed_at = clock_timestamp()
WHERE id = $1 AND completed_at IS NULL
RETURNING completed_at
"""


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    max_job_lines: int = DEFAULT_MAX_JOB_LINES,
    pool_max_size: int = 10,
) -> FastAPI:
    """Build the ASGI app. The lifespan migrates the schema and opens the connection pool."""
    ctx = _Context(settings, metrics or Metrics(), max_job_lines, pool_max_size)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await migrate(settings.database_url)
        ctx.pool = await asyncpg.create_pool(
            settings.database_url,
            min_size=1,
            max_size=pool_max_size,
            command_timeout=60,
            connect=pg_hosts.connect,
        )
        mode = "async (outbox, 202)" if settings.rabbitmq_transaction_async else "sync (201)"
        log.info("ingest API ready: transactions %s", mode)
        try:
            yield
        finally:
            pool, ctx.pool = ctx.pool, None
            try:
                await asyncio.wait_for(pool.close(), 10)
            except TimeoutError:
                pool.terminate()

    app = _Api(
        title="bulk-recorder ingest API",
        version=API_VERSION,
        description=__doc__,
        lifespan=lifespan,
    )
    app.add_middleware(_MetricsMiddleware, metrics=ctx.metrics)

    @app.exception_handler(ApiError)
    async def on_api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            {"detail": exc.detail, **exc.extra}, status_code=exc.status, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        parts = []
        for error in exc.errors():
            where = ".".join(str(p) for p in error.get("loc", ()))
            parts.append(f"{where}: {error.get('msg', 'invalid')}")
        return JSONResponse({"detail": "; ".join(parts) or "invalid request"}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            {"detail": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(ClientDisconnect)
    async def on_disconnect(_request: Request, _exc: ClientDisconnect) -> Response:
        log.info("client disconnected before the body was complete; nothing stored")
        return Response(status_code=400)

    # -- health and metrics ------------------------------------------------------------------

    @app.get("/healthz", response_class=PlainTextResponse, tags=["operations"])
    async def healthz() -> str:
        """The process is alive."""
        return "ok\n"

    @app.get(
        "/readyz",
        response_class=PlainTextResponse,
        tags=["operations"],
        responses={503: {"description": "database unreachable"}},
    )
    async def readyz() -> Response:
        """Ready to accept work: the database answers (the broker is not needed)."""
        try:
            async with ctx.db.acquire(timeout=2) as conn:
                await conn.fetchval("SELECT 1", timeout=2)
        except (ApiError, *_DB_ERRORS) as exc:
            log.debug("not ready: %s", exc)
            return PlainTextResponse("database down\n", status_code=503)
        return PlainTextResponse("database up\n")

    @app.get("/metrics", response_class=PlainTextResponse, tags=["operations"])
    async def metrics_endpoint() -> Response:
        """Prometheus metrics; outbox backlog and oldest age are read at scrape time."""
        try:
            async with ctx.db.acquire(timeout=2) as conn:
                record_stats(ctx.metrics, await outbox_stats(conn))
        except (ApiError, *_DB_ERRORS) as exc:
            log.debug("outbox stats unavailable: %s", exc)
        return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # -- transactions ------------------------------------------------------------------------

    @app.post(
        "/v1/transactions",
        tags=["transactions"],
        status_code=202,
        response_model=TransactionAccepted,
        openapi_extra=_TRANSACTION_BODY,
        responses={
            201: {"model": TransactionAccepted, "description": "recorded (sync mode)"},
            400: {"model": Problem},
            409: {"model": Problem, "description": "the id was accepted with other content"},
            413: {"model": Problem},
            415: {"model": Problem},
            422: {"model": Problem, "description": "invalid transaction, or key reused"},
            503: {"model": Problem},
        },
    )
    async def post_transaction(
        request: Request,
        idempotency_key: Annotated[
            str | None, Header(alias="Idempotency-Key", description=_IDEMPOTENCY_DOC)
        ] = None,
    ) -> Response:
        """Accept one transaction: 202 (async, via the outbox) or 201 (sync, written now)."""
        key = _idempotency_key(idempotency_key)
        media = _media_type(request)
        if media is not None and media != "application/json" and not media.endswith("+json"):
            raise ApiError(415, f"Content-Type must be application/json, not {media}")
        limit = settings.bulk_recorder_max_message_bytes
        body = await _read_limited(request, limit, settings)
        try:
            record = decode(body, "transaction", max_bytes=limit)
        except RecordError as exc:
            raise ApiError(422, exc.reason) from None
        assert isinstance(record, Transaction)
        return await _accept_transaction(ctx, record, body, key)

    # -- credit-annotation jobs ----------------------------------------------------------------

    @app.post(
        "/v1/credit-annotation-jobs",
        tags=["credit annotation jobs"],
        status_code=202,
        response_model=JobAccepted,
        openapi_extra=_JOB_BODY,
        responses={
            400: {"model": Problem, "description": "the body cannot be split into lines"},
            413: {"model": Problem},
            415: {"model": Problem},
            422: {"model": JobRefused, "description": "no line is valid"},
            503: {"model": Problem},
        },
    )
    async def post_job(
        request: Request,
        idempotency_key: Annotated[
            str | None, Header(alias="Idempotency-Key", description=_IDEMPOTENCY_DOC)
        ] = None,
    ) -> Response:
        """Accept a run of credit annotations: every valid line is stored with its outbox row in
        one database transaction; invalid lines are listed with their numbers and reasons."""
        key = _idempotency_key(idempotency_key)
        media = _media_type(request)
        fmt = CONTENT_TYPES.get(media or "")
        if fmt is None:
            accepted = ", ".join(CONTENT_TYPES)
            raise ApiError(415, f"Content-Type must be one of {accepted}; got {media or 'none'}")
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":
            raise ApiError(415, f"Content-Encoding {encoding} is not supported; send identity")
        return await _accept_job(ctx, request, fmt, cast(str, media), key)

    @app.get(
        "/v1/credit-annotation-jobs/{job_id}",
        tags=["credit annotation jobs"],
        response_model=JobStatus,
        responses={404: {"model": Problem}, 422: {"model": Problem}, 503: {"model": Problem}},
    )
    async def get_job(job_id: Annotated[uuid.UUID, Path()]) -> Response:
        """Status and progress of a job (poll it to draw a progress bar)."""
        return _json(200, await _job_status(ctx, job_id))

    return app


# -- transactions ---------------------------------------------------------------------------


async def _accept_transaction(
    ctx: _Context, record: Transaction, body: bytes, key: str | None
) -> Response:
    async_mode = ctx.settings.rabbitmq_transaction_async
    mode: Literal["async", "sync"] = "async" if async_mode else "sync"
    status = 202 if async_mode else 201
    request_hash = _canonical_hash(body)
    prior: asyncpg.Record | None = None
    fresh = False
    try:
        async with ctx.db.acquire(timeout=10) as conn, conn.transaction():
            fresh = await conn.fetchval(_INSERT_REQUEST, record.id, key, request_hash, mode, status)
            if not fresh:
                prior = await conn.fetchrow(_PRIOR_REQUEST, record.id, key)
            elif async_mode:
                await enqueue(conn, "transaction", record.id, body)
                await notify(conn)
            else:
                writer = PgWriter(
                    cast(asyncpg.Pool, _SameConnection(conn)),
                    max_rows_per_insert=ctx.settings.bulk_recorder_max_rows_per_insert,
                )
                result: WriteResult = await writer.write([record])
                _count_rows(ctx.metrics, result)
    except ApiError:
        raise
    except (DataRejected, TransientDbError, *_DB_ERRORS) as exc:
        raise await _db_failure(ctx, exc) from None
    if prior is None:
        if fresh:
            return _json(status, TransactionAccepted(id=record.id, status=_word(status), mode=mode))
        # The conflicting row was rolled back between our insert and our look-up: rare; the
        # client may simply retry.
        raise ApiError(409, "a concurrent request for this transaction failed; retry")
    return _replay_transaction(prior, record, key, request_hash)


def _word(status: int) -> Literal["accepted", "recorded"]:
    return "accepted" if status == 202 else "recorded"


def _replay_transaction(
    prior: asyncpg.Record, record: Transaction, key: str | None, request_hash: bytes
) -> Response:
    same_body = bytes(prior["request_hash"]) == request_hash
    if key is not None and prior["idempotency_key"] == key:
        if not same_body or prior["id"] != record.id:
            raise ApiError(422, "Idempotency-Key was already used for a different request body")
    elif not same_body:
        raise ApiError(409, f"transaction {record.id} was already accepted with other content")
    status = int(prior["status_code"])
    out = TransactionAccepted(id=prior["id"], status=_word(status), mode=prior["mode"])
    return _json(status, out, **{REPLAYED_HEADER: "true"})


def _count_rows(metrics: Metrics, result: WriteResult) -> None:
    for table, counts in result.tables.items():
        metrics.rows_attempted.labels(table=table).inc(counts.attempted)
        metrics.rows_inserted.labels(table=table).inc(counts.inserted)
        metrics.rows_ignored.labels(table=table).inc(counts.ignored)


# -- jobs -----------------------------------------------------------------------------------


def _job_accepted(row: asyncpg.Record | dict[str, Any]) -> JobAccepted:
    rejections = row["rejections"]
    if isinstance(rejections, str):
        rejections = json.loads(rejections)
    job_id = str(row["id"])
    return JobAccepted(
        id=job_id,
        accepted=row["accepted"],
        rejected=row["rejected"],
        rejections=[LineRejection(line=r[0], reason=r[1]) for r in rejections],
        rejections_truncated=row["rejections_truncated"],
        status_url=f"/v1/credit-annotation-jobs/{job_id}",
    )


def _replay_job(row: asyncpg.Record, request_hash: bytes) -> Response:
    if row["request_hash"] is None or bytes(row["request_hash"]) != request_hash:
        raise ApiError(422, "Idempotency-Key was already used for a different request body")
    accepted = _job_accepted(row)
    return _json(202, accepted, Location=accepted.status_url, **{REPLAYED_HEADER: "true"})


async def _accept_job(
    ctx: _Context, request: Request, fmt: str, media: str, key: str | None
) -> Response:
    limit = ctx.settings.api_max_job_bytes
    _check_declared_length(request, limit)  # before a slot or a connection is taken
    hasher = hashlib.sha256(fmt.encode() + b"\0")
    if key is not None:
        try:
            async with ctx.db.acquire(timeout=10) as conn:
                prior = await conn.fetchrow(_JOB_BY_KEY, key)
        except _DB_ERRORS as exc:
            raise await _db_failure(ctx, exc) from None
        if prior is not None:
            async with contextlib.aclosing(_body(request, limit, ctx.settings)) as chunks:
                async for chunk in chunks:
                    hasher.update(chunk)
            return _replay_job(prior, hasher.digest())
    if ctx.job_slots.locked():
        raise ApiError(
            503, "too many job uploads in progress; retry later", headers={"Retry-After": "5"}
        )
    async with ctx.job_slots:
        return await _store_job(ctx, request, fmt, media, key, hasher)


async def _stage_body(
    ctx: _Context, request: Request, intake: JobIntake, staging: JobStaging, hasher: Any
) -> None:
    """Read, validate and stage the whole body; the intake then holds the job's counts."""
    body = _body(request, ctx.settings.api_max_job_bytes, ctx.settings)
    async with contextlib.aclosing(body) as chunks:
        async for chunk in chunks:
            hasher.update(chunk)
            # Validation is CPU work on the event loop: a slice at a time, with a turn of the
            # loop in between, so other requests wait ~1 ms rather than a whole chunk.
            for start in range(0, len(chunk), FEED_SLICE_BYTES):
                intake.feed(chunk[start : start + FEED_SLICE_BYTES])
                await asyncio.sleep(0)
            if len(intake.rows) >= COPY_BATCH_ROWS:
                await staging.add(intake.take_rows())
    intake.finish()
    if intake.accepted == 0:
        raise _no_valid_line(intake)
    rows = intake.take_rows()
    if rows:
        await staging.add(rows)
    await staging.flush()


async def _store_job(
    ctx: _Context,
    request: Request,
    fmt: str,
    media: str,
    key: str | None,
    hasher: Any,
) -> Response:
    s = ctx.settings
    job_id = uuid7()
    intake = JobIntake(
        job_id,
        parser_for(fmt, s.bulk_recorder_max_message_bytes),
        max_body_bytes=s.bulk_recorder_max_message_bytes,
        max_lines=ctx.max_job_lines,
    )
    started = time.perf_counter()
    body_done = started
    prior: asyncpg.Record | None = None
    try:
        async with ctx.db.acquire(timeout=10) as conn:
            staging = JobStaging(conn)
            await staging.open()
            try:
                await _stage_body(ctx, request, intake, staging, hasher)
                body_done = time.perf_counter()
                async with conn.transaction():
                    stored = await conn.fetchval(
                        _INSERT_JOB,
                        job_id,
                        key,
                        media,
                        intake.accepted,
                        intake.rejected,
                        json.dumps(intake.rejections),
                        intake.rejections_truncated,
                        hasher.digest(),
                    )
                    if stored:
                        await staging.publish(job_id)
                        await notify(conn)
                    else:  # another upload with this key completed first: answer with its job
                        prior = await conn.fetchrow(_JOB_BY_KEY, key)
            except BaseException:
                await staging.discard()
                raise
            if prior is not None:
                await staging.discard()
                return _replay_job(prior, hasher.digest())
    except FormatError as exc:
        raise ApiError(400, str(exc)) from None
    except TooManyLines as exc:
        raise ApiError(413, str(exc), headers=_CLOSE) from None
    except (ApiError, ClientDisconnect):
        raise
    except (DataRejected, TransientDbError, *_DB_ERRORS) as exc:
        raise await _db_failure(ctx, exc) from None
    ctx.metrics.api_job_lines.labels(outcome="accepted").inc(intake.accepted)
    ctx.metrics.api_job_lines.labels(outcome="rejected").inc(intake.rejected)
    done = time.perf_counter()
    log.info(
        "job %s accepted: %d lines accepted, %d rejected, in %.2f s (body %.2f s, outbox %.2f s)",
        job_id,
        intake.accepted,
        intake.rejected,
        done - started,
        body_done - started,
        done - body_done,
    )
    accepted = JobAccepted(
        id=job_id,
        accepted=intake.accepted,
        rejected=intake.rejected,
        rejections=[LineRejection(line=n, reason=r) for n, r in intake.rejections],
        rejections_truncated=intake.rejections_truncated,
        status_url=f"/v1/credit-annotation-jobs/{job_id}",
    )
    return _json(202, accepted, Location=accepted.status_url)


def _no_valid_line(intake: JobIntake) -> ApiError:
    detail = "no valid line in the job" if intake.rejected else "the job has no lines"
    return ApiError(
        422,
        detail,
        extra={
            "rejected": intake.rejected,
            "rejections": [{"line": n, "reason": r} for n, r in intake.rejections],
            "rejections_truncated": intake.rejections_truncated,
        },
    )


async def _recorded(
    ctx: _Context, conn: asyncpg.pool.PoolConnectionProxy, job_id: uuid.UUID
) -> int:
    """The job's recorded rows, counted at most once every RECORDED_COUNT_TTL_S."""
    now = time.monotonic()
    cached = ctx.recorded_cache.get(job_id)
    if cached is not None and now - cached[0] < RECORDED_COUNT_TTL_S:
        return cached[1]
    recorded = int(await conn.fetchval(_RECORDED, job_id))
    if len(ctx.recorded_cache) >= _RECORDED_CACHE_MAX:
        ctx.recorded_cache.clear()
    ctx.recorded_cache[job_id] = (now, recorded)
    return recorded


async def _job_status(ctx: _Context, job_id: uuid.UUID) -> JobStatus:
    try:
        async with ctx.db.acquire(timeout=10) as conn:
            row = await conn.fetchrow(_JOB_BY_ID, job_id)
            if row is None or row["request_hash"] is None:
                raise ApiError(404, f"no credit-annotation job {job_id}")
            accepted, dead = int(row["accepted"]), int(row["dead_lettered"])
            completed_at = row["completed_at"]
            if completed_at is not None:
                recorded = int(row["recorded"])
            else:
                recorded = await _recorded(ctx, conn, job_id)
                if recorded + dead >= accepted:
                    completed_at = await conn.fetchval(_COMPLETE_JOB, job_id, recorded)
                    ctx.recorded_cache.pop(job_id, None)
    except ApiError:
        raise
    except _DB_ERRORS as exc:
        raise await _db_failure(ctx, exc) from None
    published = int(row["published"])
    if completed_at is not None:
        status: Literal["publishing", "recording", "completed"] = "completed"
    elif published + dead < accepted:
        status = "publishing"
    else:
        status = "recording"
    return JobStatus(
        id=str(job_id),
        status=status,
        accepted=accepted,
        rejected=int(row["rejected"]),
        published=published,
        recorded=recorded,
        dead_lettered=dead,
        progress=min(1.0, (recorded + dead) / accepted) if accepted else 1.0,
        created_at=row["created_at"],
        completed_at=completed_at,
    )


# -- metrics middleware -------------------------------------------------------------------------

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class _MetricsMiddleware:
    """Counts requests by route template and status, and times them (pure ASGI: no buffering)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_and_see(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_see)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.api_requests.labels(route=route, status=str(status)).inc()
            self.metrics.api_request_duration.labels(route=route).observe(
                time.perf_counter() - started
            )
