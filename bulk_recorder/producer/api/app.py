"""The ingest API: an ASGI app (FastAPI) that accepts transactions and credit-annotation jobs.

Routes (OpenAPI at ``/openapi.json``, browsable at ``/docs``):

- ``POST /v1/transactions``: one transaction message (docs/messages.md), validated with
  :func:`bulk_recorder.records.decode` like the recorder does. ``RABBITMQ_TRANSACTION_ASYNC=true``:
  the request row and an outbox row are written in ONE database transaction, answer 202 (the
  relay publishes it, the recorder records it). ``false``: the transaction, its operations and
  its balance effects are written at once by
  :class:`bulk_recorder.recorder.writer.PgWriter`, answer 201. Either way a repeat of the same
  id or ``Idempotency-Key`` is answered with the first outcome, never a second row.
- ``POST /v1/credit-annotation-jobs``: JSON array, NDJSON or CSV, streamed; each line validated
  with ``decode``; accepted lines are staged as they arrive (COPY, short transactions: see
  :mod:`bulk_recorder.producer.job_staging`), and once the body is complete the job row and all its
  outbox rows are written in one database transaction; answer 202 with the job id, counts and
  rejected lines. Always asynchronous. Bounded: ``API_MAX_JOB_BYTES`` (413), every line counts
  toward the line limit (413), ``API_BODY_TIMEOUT_S`` and ``API_UPLOAD_TIMEOUT_S`` (408).
- ``GET /v1/credit-annotation-jobs/{id}``: status and progress.
- ``/healthz`` (alive), ``/readyz`` (database reachable), ``/metrics`` (Prometheus).

Every ``/v1`` route needs an API key with its scope (:mod:`bulk_recorder.producer.api.auth`: 401
or 403, problem+json); a client sees only its own jobs and ``Idempotency-Key`` space, while a
transaction id stays unique in the ledger. Bad input gets a 4xx with a precise ``detail``; an
unreachable database gets 503 with ``Retry-After``. Every error answer is
``application/problem+json`` (:mod:`bulk_recorder.producer.api.problems`). The broker is not
needed to accept work: that is what the outbox is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Final

import msgspec
from fastapi import FastAPI

from bulk_recorder import __version__
from bulk_recorder.infra import tracing
from bulk_recorder.infra.db import open_pool_when_ready
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.infra.stop_budget import Deadline, stop_budget
from bulk_recorder.producer.api.api_docs import API_DESCRIPTION, serve_docs_offline
from bulk_recorder.producer.api.asgi import ASGIApp, Receive, Scope, Send, StatusSeen
from bulk_recorder.producer.api.auth import Authenticator, install
from bulk_recorder.producer.api.context import ApiContext
from bulk_recorder.producer.api.examples import attach_nullable
from bulk_recorder.producer.api.job_bodies import body_components
from bulk_recorder.producer.api.loop_lag import watch_loop_lag
from bulk_recorder.producer.api.models import IDEMPOTENCY_SCHEMA, JobRefused
from bulk_recorder.producer.api.problems import ApiError, Problem, answer_errors_as_problems
from bulk_recorder.producer.api.routes import (
    add_job_routes,
    add_operation_routes,
    add_transaction_routes,
)
from bulk_recorder.producer.api.server_spans import ServerSpans
from bulk_recorder.records import published
from bulk_recorder.records.contract import DEFAULT_MAX_BODY_BYTES
from bulk_recorder.records.schema import CreditAnnotationIn, TransactionIn
from settings import Settings

log = logging.getLogger(__name__)

__all__ = ["ApiError", "create_app"]

API_VERSION: Final = __version__  # the package's: the API is part of its public interface
DEFAULT_MAX_JOB_LINES: Final = 1_000_000


class _Api(FastAPI):
    """FastAPI with the schemas of the raw (decode-validated) request bodies, with every rule a
    schema can state (:mod:`bulk_recorder.records.published`), and of the problem+json answers
    in components."""

    max_line_bytes: int = DEFAULT_MAX_BODY_BYTES

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema:
            return self.openapi_schema
        schema = super().openapi()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        _, bodies = msgspec.json.schema_components(
            (TransactionIn, CreditAnnotationIn), ref_template=published.COMPONENT_REF
        )
        bodies = published.resolve_overrides(bodies)
        bodies["TransactionIn"]["description"] += " " + published.UNSTATED_TRANSACTION_RULES
        bodies["CreditAnnotationIn"]["description"] += " " + published.UNSTATED_ANNOTATION_RULES
        components.update(bodies)
        components.update(published.METADATA_COMPONENTS)
        components.update(body_components(self.max_line_bytes))
        for model in (Problem, JobRefused):
            body = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(body.pop("$defs", {}))
            components[model.__name__] = body
        for path in schema["paths"].values():
            for operation in path.values():
                for parameter in operation.get("parameters", ()):
                    if parameter["name"] == "Idempotency-Key":
                        parameter["schema"] = IDEMPOTENCY_SCHEMA
        attach_nullable(schema)
        self.openapi_schema = schema
        return schema


# -- the app ----------------------------------------------------------------------------------


def create_app(
    settings: Settings,
    *,
    metrics: Metrics | None = None,
    max_job_lines: int = DEFAULT_MAX_JOB_LINES,
    pool_max_size: int = 10,
    stop_deadline: Deadline | None = None,
) -> FastAPI:
    """Build the ASGI app. The lifespan migrates the schema and opens the connection pool; at
    the end it closes them within what is left of ``stop_deadline`` (the server starts it on
    the signal; unstarted, it starts when the lifespan ends)."""
    ctx = ApiContext(settings, metrics or Metrics(role="api"), max_job_lines, pool_max_size)
    deadline = stop_deadline or stop_budget("api", settings).deadline()

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # The database may not be there yet: like the recorder and the relay, the API keeps
        # trying (the log names the host) and answers meanwhile, /readyz and /v1 with 503.
        # Serving starts once the first attempt is over, so a database that is up is ready first.
        stop, tried = asyncio.Event(), asyncio.Event()
        opening = asyncio.create_task(_open_pool(ctx, stop, tried))
        first = asyncio.ensure_future(tried.wait())
        await asyncio.wait([opening, first], return_when=asyncio.FIRST_COMPLETED)
        first.cancel()
        lagging = asyncio.create_task(watch_loop_lag(ctx.metrics.api_loop_lag, stop))
        try:
            yield
        finally:
            stop.set()
            lagging.cancel()
            await asyncio.wait([opening], timeout=deadline.left())  # a connect under way
            opening.cancel()
            await _close(ctx, deadline)

    app = _Api(
        title="bulk-recorder ingest API",
        version=API_VERSION,
        description=API_DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc come from serve_docs_offline: no CDN
        redoc_url=None,
    )
    app.max_line_bytes = settings.bulk_recorder_max_message_bytes
    serve_docs_offline(app)
    app.add_middleware(MetricsMiddleware, metrics=ctx.metrics)
    if tracing.active():  # outermost: the span covers authentication and the metrics too
        app.add_middleware(ServerSpans)
    install(
        app, Authenticator(on=settings.api_auth == "on", metrics=ctx.metrics, db=lambda: ctx.db)
    )
    answer_errors_as_problems(app)
    add_operation_routes(app, ctx)
    add_transaction_routes(app, ctx)
    add_job_routes(app, ctx)
    return app


async def _close(ctx: ApiContext, deadline: Deadline) -> None:
    """The job workers, then the pool, within what is left of the stop budget."""
    for recount in list(ctx.recounts.values()):
        recount.cancel()
    await ctx.workers.close(deadline.left())
    pool, ctx.pool = ctx.pool, None
    if pool is not None:
        try:
            await asyncio.wait_for(pool.close(), deadline.left())
        except TimeoutError:
            pool.terminate()
    log.info("API stopped in %.1f s", deadline.elapsed())


async def _open_pool(ctx: ApiContext, stop: asyncio.Event, tried: asyncio.Event) -> None:
    settings = ctx.settings
    ctx.pool = await open_pool_when_ready(
        settings.database_url,
        max_size=ctx.pool_max_size,
        stop=stop,
        command_timeout=60,
        session_reset=True,
        custom_plans=True,  # job status reads the outbox and the job's rows as they grow
        tried=tried,
    )
    if ctx.pool is not None:
        mode = "async (outbox, 202)" if settings.rabbitmq_transaction_async else "sync (201)"
        log.info("ingest API ready: transactions %s", mode)


# -- metrics middleware -------------------------------------------------------------------------


class MetricsMiddleware:
    """Counts requests by route template and status, and times them (pure ASGI: no buffering)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        seen = StatusSeen(send)
        try:
            await self.app(scope, receive, seen)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.metrics.api_requests.labels(route=route, status=str(seen.status)).inc()
            self.metrics.api_request_duration.labels(route=route).observe(
                time.perf_counter() - started
            )
