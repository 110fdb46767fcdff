"""Credit-annotation jobs behind their routes: staging an upload, storing the job with its
outbox rows in one transaction, answering repeats, and reading a job's status.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from typing import Any, Final

import asyncpg
from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from bulk_recorder.infra.errors import (
    DB_ERRORS,
    DataRejected,
    TransientDbError,
)
from bulk_recorder.infra.ids import uuid7
from bulk_recorder.producer.api.auth import Principal
from bulk_recorder.producer.api.body import body_chunks, check_declared_length
from bulk_recorder.producer.api.context import ApiContext, db_failure
from bulk_recorder.producer.api.job_status import COMPLETE_JOB, JOB_BY_ID, RECORDED, JobStatus
from bulk_recorder.producer.api.job_status import job_status as build_job_status
from bulk_recorder.producer.api.models import JobAccepted, LineRejection
from bulk_recorder.producer.api.problems import (
    CLOSE_CONNECTION,
    REPLAYED_HEADER,
    ApiError,
    json_response,
)
from bulk_recorder.producer.ingest import JobIntake, TooManyLines
from bulk_recorder.producer.job_blocks import BlockIntake, Validated
from bulk_recorder.producer.job_staging import JobStaging
from bulk_recorder.producer.outbox import notify
from bulk_recorder.producer.parsers import FormatError, parser_for

log = logging.getLogger(__name__)

COPY_BATCH_ROWS: Final = 5_000  # accepted lines staged per COPY
FEED_SLICE_BYTES: Final = 16_384  # ~60 annotation lines, ~1 ms of validation
BLOCK_BYTES: Final = 65_536  # a worker's block: ~330 annotation lines, ~4 ms of its CPU
BLOCKS_PER_WORKER: Final = 4  # blocks in flight per worker: queued work while the loop reads
# A job's recorded count is a count(*) over its rows (300,000 at the end of the main job): one
# count a second per job serves any number of clients polling for a progress bar.
RECORDED_COUNT_TTL_S: Final = 1.0
_RECORDED_CACHE_MAX: Final = 10_000

# Written once the body is complete, in the transaction that moves its staged lines into the
# outbox: a job is never visible before all its outbox rows are.
_INSERT_JOB = """
INSERT INTO credit_annotation_jobs (id, idempotency_key, content_type, accepted, rejected,
                                    rejections, rejections_truncated, request_hash, client)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9)
ON CONFLICT (client, idempotency_key) DO NOTHING
RETURNING true
"""
_JOB_BY_KEY = "SELECT * FROM credit_annotation_jobs WHERE idempotency_key = $1 AND client = $2"


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
    return json_response(202, accepted, Location=accepted.status_url, **{REPLAYED_HEADER: "true"})


async def accept_job(
    ctx: ApiContext, request: Request, fmt: str, media: str, key: str | None, client: str
) -> Response:
    limit = ctx.settings.api_max_job_bytes
    check_declared_length(request, limit)  # before a slot or a connection is taken
    hasher = hashlib.sha256(fmt.encode() + b"\0")
    if key is not None:
        try:
            async with ctx.db.acquire(timeout=10) as conn:
                prior = await conn.fetchrow(_JOB_BY_KEY, key, client)
        except DB_ERRORS as exc:
            raise await db_failure(ctx, exc) from None
        if prior is not None:
            async with contextlib.aclosing(body_chunks(request, limit, ctx.settings)) as chunks:
                async for chunk in chunks:
                    hasher.update(chunk)
            return _replay_job(prior, hasher.digest())
    if ctx.job_slots.locked():
        raise ApiError(
            503, "too many job uploads in progress; retry later", headers={"Retry-After": "5"}
        )
    async with ctx.job_slots:
        return await _store_job(ctx, request, fmt, media, key, hasher, client)


async def _stage_body(
    ctx: ApiContext, request: Request, intake: JobIntake, staging: JobStaging, hasher: Any
) -> None:
    """Read, validate and stage the whole body; the intake then holds the job's counts."""
    body = body_chunks(request, ctx.settings.api_max_job_bytes, ctx.settings)
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


async def _stage_blocks(
    ctx: ApiContext,
    request: Request,
    intake: BlockIntake,
    staging: JobStaging,
    hasher: Any,
    job_id: str,
) -> None:
    """Read and stage the whole body, its lines validated by the job workers: the loop parses
    and hands each block over; a second task takes the answers in order and stages the rows."""
    s = ctx.settings
    answers: asyncio.Queue[asyncio.Future[Validated] | None] = asyncio.Queue(
        maxsize=BLOCKS_PER_WORKER * max(1, ctx.workers.size)
    )
    in_flight: list[asyncio.Future[Validated]] = []
    applier = asyncio.create_task(_apply_blocks(intake, staging, answers))

    async def hand_over(answer: asyncio.Future[Validated] | None) -> None:
        putting = asyncio.ensure_future(answers.put(answer))
        await asyncio.wait({putting, applier}, return_when=asyncio.FIRST_COMPLETED)
        if not putting.done():
            putting.cancel()
            await applier  # it failed: its error is the job's
            raise RuntimeError("the block applier stopped before the body's end")

    async def submit(block: Any) -> None:
        validating = asyncio.ensure_future(
            ctx.workers.validate(job_id, s.bulk_recorder_max_message_bytes, block)
        )
        in_flight.append(validating)
        await hand_over(validating)

    try:
        body = body_chunks(request, s.api_max_job_bytes, s)
        async with contextlib.aclosing(body) as chunks:
            async for chunk in chunks:
                hasher.update(chunk)
                for start in range(0, len(chunk), BLOCK_BYTES):
                    block = intake.feed(chunk[start : start + BLOCK_BYTES])
                    if block is not None:
                        await submit(block)
                in_flight = [f for f in in_flight if not f.done()]
        block = intake.finish()
        if block is not None:
            await submit(block)
        await hand_over(None)
        await applier
    except BaseException:
        applier.cancel()
        for future in in_flight:
            future.cancel()
        await asyncio.gather(*in_flight, applier, return_exceptions=True)
        raise
    if intake.accepted == 0:
        raise _no_valid_line(intake)
    if intake.pending_rows:
        await staging.add(intake.take_rows())
    await staging.flush()


async def _apply_blocks(
    intake: BlockIntake,
    staging: JobStaging,
    answers: asyncio.Queue[asyncio.Future[Validated] | None],
) -> None:
    while (answer := await answers.get()) is not None:
        intake.apply(await answer)
        if intake.pending_rows >= COPY_BATCH_ROWS:
            await staging.add(intake.take_rows())


def _intake(ctx: ApiContext, fmt: str, job_id: str) -> JobIntake | BlockIntake:
    limit = ctx.settings.bulk_recorder_max_message_bytes
    parser = parser_for(fmt, limit)
    if ctx.workers.size:
        return BlockIntake(parser, max_lines=ctx.max_job_lines)
    return JobIntake(job_id, parser, max_body_bytes=limit, max_lines=ctx.max_job_lines)


async def _store_job(
    ctx: ApiContext,
    request: Request,
    fmt: str,
    media: str,
    key: str | None,
    hasher: Any,
    client: str,
) -> Response:
    job_id = uuid7()
    intake = _intake(ctx, fmt, job_id)
    started = time.perf_counter()
    body_done = started
    prior: asyncpg.Record | None = None
    try:
        async with ctx.db.acquire(timeout=10) as conn:
            staging = JobStaging(conn)
            await staging.open()
            try:
                if isinstance(intake, BlockIntake):  # validated by the job workers
                    await _stage_blocks(ctx, request, intake, staging, hasher, job_id)
                else:  # on this loop (API_JOB_WORKERS=0)
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
                        client,
                    )
                    if stored:
                        await staging.publish(job_id)
                        await notify(conn)
                    else:  # another upload with this key completed first: answer with its job
                        prior = await conn.fetchrow(_JOB_BY_KEY, key, client)
            except BaseException:
                await staging.discard()
                raise
            if prior is not None:
                await staging.discard()
                return _replay_job(prior, hasher.digest())
    except FormatError as exc:
        raise ApiError(400, str(exc)) from None
    except TooManyLines as exc:
        raise ApiError(413, str(exc), headers=CLOSE_CONNECTION) from None
    except (ApiError, ClientDisconnect):
        raise
    except (DataRejected, TransientDbError, *DB_ERRORS) as exc:
        raise await db_failure(ctx, exc) from None
    return _stored(ctx, job_id, intake, started, body_done)


def _stored(
    ctx: ApiContext,
    job_id: str,
    intake: JobIntake | BlockIntake,
    started: float,
    body_done: float,
) -> Response:
    """The 202 for a job just stored: counted, logged with its timings, answered."""
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
    return json_response(202, accepted, Location=accepted.status_url)


def _no_valid_line(intake: JobIntake | BlockIntake) -> ApiError:
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
    ctx: ApiContext, conn: asyncpg.pool.PoolConnectionProxy, job_id: uuid.UUID
) -> int:
    """The job's recorded rows: counted on the job's first read, then recounted at most once
    every RECORDED_COUNT_TTL_S by a task of its own, off the request path. A read answers with
    the last count (at most a TTL and a count old) instead of waiting for a count over up to
    300,000 rows (25-150 ms on a busy machine: the GET's p99 during the main job)."""
    now = time.monotonic()
    cached = ctx.recorded_cache.get(job_id)
    if cached is None:
        recorded = int(await conn.fetchval(RECORDED, job_id))
        _remember(ctx, job_id, now, recorded)
        return recorded
    if now - cached[0] >= RECORDED_COUNT_TTL_S and job_id not in ctx.recounts:
        task = asyncio.create_task(_recount(ctx, job_id))
        ctx.recounts[job_id] = task
        task.add_done_callback(lambda _: ctx.recounts.pop(job_id, None))
    return cached[1]


async def _recount(ctx: ApiContext, job_id: uuid.UUID) -> None:
    started = time.monotonic()
    try:
        async with ctx.db.acquire(timeout=10) as conn:
            recorded = int(await conn.fetchval(RECORDED, job_id))
    except Exception as exc:  # the next read tries again
        log.debug("recount of job %s failed: %s", job_id, exc)
        return
    _remember(ctx, job_id, started, recorded)


def _remember(ctx: ApiContext, job_id: uuid.UUID, at: float, recorded: int) -> None:
    if len(ctx.recorded_cache) >= _RECORDED_CACHE_MAX:
        ctx.recorded_cache.clear()
    ctx.recorded_cache[job_id] = (at, recorded)


async def job_status(ctx: ApiContext, job_id: uuid.UUID, principal: Principal) -> JobStatus:
    try:
        async with ctx.db.acquire(timeout=10) as conn:
            row = await conn.fetchrow(JOB_BY_ID, job_id)
            # Another client's job is 404 like a missing one, so that ids cannot be probed.
            if row is None or row["request_hash"] is None or not principal.may_read(row["client"]):
                raise ApiError(404, f"no credit-annotation job {job_id}")
            accepted, dead = int(row["accepted"]), int(row["dead_lettered"])
            completed_at = row["completed_at"]
            if completed_at is not None:
                recorded = int(row["recorded"])
            else:
                recorded = await _recorded(ctx, conn, job_id)
                if recorded + dead >= accepted:
                    completed_at = await conn.fetchval(COMPLETE_JOB, job_id, recorded)
                    ctx.recorded_cache.pop(job_id, None)
                    if completed_at is not None:  # the counts the completion saw, not older
                        row = await conn.fetchrow(JOB_BY_ID, job_id)
    except ApiError:
        raise
    except DB_ERRORS as exc:
        raise await db_failure(ctx, exc) from None
    return build_job_status(
        row,
        recorded=recorded,
        completed_at=completed_at,
        stall_after_s=ctx.settings.api_job_stall_after_s,
    )
