"""What every request handler shares: settings, metrics, the pool, job slots; and the answer
to a database failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
from prometheus_client import Histogram

from bulk_recorder.infra.errors import (
    DataRejected,
    TransientDbError,
    classify,
    renew_if_server_gone,
)
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.producer.api.problems import RETRY_AFTER, ApiError
from bulk_recorder.producer.job_workers import JobWorkers
from settings import Settings

log = logging.getLogger(__name__)


class TimedPool:
    """The pool as the handlers use it: :meth:`acquire` also counts the wait for a connection
    (``bulk_recorder_api_db_acquire_seconds``)."""

    def __init__(self, pool: asyncpg.Pool, waited: Histogram) -> None:
        self.pool = pool
        self._waited = waited

    @contextlib.asynccontextmanager
    async def acquire(
        self,
        timeout: float,  # noqa: ASYNC109 - asyncpg's Pool.acquire(timeout=), passed on as is
    ) -> AsyncIterator[asyncpg.pool.PoolConnectionProxy]:
        started = time.perf_counter()
        async with self.pool.acquire(timeout=timeout) as conn:
            self._waited.observe(time.perf_counter() - started)
            yield conn


@dataclass
class ApiContext:
    settings: Settings
    metrics: Metrics
    max_job_lines: int
    pool_max_size: int
    pool: asyncpg.Pool | None = None
    recorded_cache: dict[uuid.UUID, tuple[float, int]] = field(default_factory=dict)
    recounts: dict[uuid.UUID, asyncio.Task[None]] = field(default_factory=dict)  # under way
    # A job upload holds a pooled connection (its staging table's session, never an open
    # transaction) for as long as the client sends, within the body timeouts; at most half the
    # pool does, so that single transactions and status reads always find one.
    job_slots: asyncio.Semaphore = field(init=False)
    # Validate the jobs' lines on the other cores (API_JOB_WORKERS processes, 0: on the loop).
    workers: JobWorkers = field(init=False)

    def __post_init__(self) -> None:
        self.job_slots = asyncio.Semaphore(max(1, self.pool_max_size // 2))
        self.workers = JobWorkers(self.settings.api_job_workers)

    @property
    def db(self) -> TimedPool:
        if self.pool is None:
            raise ApiError(503, "database unavailable; retry later", headers=dict(RETRY_AFTER))
        return TimedPool(self.pool, self.metrics.api_db_acquire)


async def db_failure(ctx: ApiContext, exc: BaseException) -> ApiError:
    """The answer to a database failure; a server that refuses writes gets the pool renewed."""
    await renew_if_server_gone(ctx.pool, exc)
    err = exc if isinstance(exc, DataRejected | TransientDbError) else classify(exc)
    if isinstance(err, DataRejected):
        status = 409 if err.reason.startswith("23505") else 422
        return ApiError(status, f"refused by the database: {err.reason}")
    log.warning("database unavailable: %s", err)
    log.debug("database failure", exc_info=exc)
    return ApiError(503, "database unavailable; retry later", headers=dict(RETRY_AFTER))
