"""Retention of the API's own records (issue 28): idempotency records and finished jobs.

``transaction_requests`` (one row per accepted ``POST /v1/transactions``: its key and body
hash, for replays), ``credit_annotation_jobs`` and ``credit_annotation_job_repeats`` would grow
for ever. :func:`remove_expired` deletes what is past its window, oldest first, in batches of at
most ``batch_size`` rows, each batch one statement committed on its own, with a
``lock_timeout``, so that a writer never waits on more than one batch, and on that one only
while the server runs it. The ledger (``transactions``,
``operations``, ``credit_annotations``, ``balances``) is never touched.

A job goes only when it is complete (every accepted line recorded, none parked): created before
the window and with ``completed_at`` set. A job past the window that is done but whose status
nobody read since is completed here first, as a status read would. A job still publishing or
recording, or one with parked outbox rows (``dead_lettered > 0``, which ``outbox unpark`` may
reopen), stays, whatever its age. Its repeats go before it, so a job row never goes while rows
that count toward its ``recorded`` remain.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import asyncpg

from bulk_recorder.producer.api.job_status import COMPLETE_JOB, RECORDED

if TYPE_CHECKING:
    from bulk_recorder.infra.db import Connection

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 1_000
DEFAULT_LOCK_TIMEOUT_MS = 50

_CUTOFF = "SELECT now() - make_interval(days => $1)"
# For the run's session. Each batch is one statement, committed on its own: the rows it deletes
# are locked only while the server runs it, never across a round trip to this process (a
# BEGIN ... COMMIT block holds them while a loaded client gets round to sending COMMIT). Its
# commit does not wait for the WAL flush nor a synchronous standby, which would hold them
# longer still: a batch lost in a crash only brings back rows the next run removes again, and
# a writer's own synchronous commit, later in the WAL, makes the batch durable with it.
_SESSION = """
SELECT set_config('lock_timeout', $1, false), set_config('synchronous_commit', 'off', false)
"""
# Oldest first along transaction_requests_created_idx; rows another transaction holds are
# skipped (left for the next batch), never waited for. Each DELETE takes the rows its
# sub-select locked by their addresses (`ctid = ANY(ARRAY(...))`, a TID scan: these rows are
# never updated, and a row locked FOR UPDATE keeps its address): with `IN (SELECT ...)` the
# planner joined the sub-select to a sequential scan of the whole table, so a batch (and a retry
# waiting on one of its rows) took longer the larger the table.
_REQUESTS = """
DELETE FROM transaction_requests WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM transaction_requests WHERE created_at < $1
    ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED))
"""
# Jobs past the window, done (nothing waiting in the outbox) but not yet marked complete.
# Page by page from the oldest (keyset: created_at, id): jobs that will never complete (a line
# the recorder dead-lettered) stay in the first page run after run, and must not hide the rest.
_DONE_UNMARKED = """
SELECT id, created_at, accepted, dead_lettered FROM credit_annotation_jobs
WHERE created_at < $1 AND completed_at IS NULL AND request_hash IS NOT NULL
  AND published + dead_lettered >= accepted
  AND (created_at, id) > ($3, $4)
ORDER BY created_at, id LIMIT $2
"""
_BEFORE_ALL = (datetime.min.replace(tzinfo=UTC), uuid.UUID(int=0))
_EXPIRED_JOBS = """
SELECT id FROM credit_annotation_jobs
WHERE created_at < $1 AND completed_at IS NOT NULL AND dead_lettered = 0
ORDER BY created_at LIMIT $2
"""
_JOB_REPEATS = """
DELETE FROM credit_annotation_job_repeats WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM credit_annotation_job_repeats
    WHERE job_id = ANY($1::uuid[]) ORDER BY job_id, annotation_id  -- along the primary key
    LIMIT $2 FOR UPDATE SKIP LOCKED))
"""
_JOBS = """
DELETE FROM credit_annotation_jobs WHERE id = ANY(ARRAY(
    SELECT j.id FROM credit_annotation_jobs AS j
    WHERE j.id = ANY($1::uuid[])
      AND NOT EXISTS (SELECT 1 FROM credit_annotation_job_repeats AS r WHERE r.job_id = j.id)
    LIMIT $2 FOR UPDATE SKIP LOCKED))
"""
# Repeats of no job at all (a replayed annotation of a job already removed), by their own age.
_ORPHAN_REPEATS = """
DELETE FROM credit_annotation_job_repeats WHERE ctid = ANY(ARRAY(
    SELECT r.ctid FROM credit_annotation_job_repeats AS r
    WHERE r.recorded_at < $1
      AND NOT EXISTS (SELECT 1 FROM credit_annotation_jobs AS j WHERE j.id = r.job_id)
    ORDER BY r.recorded_at LIMIT $2 FOR UPDATE OF r SKIP LOCKED))
"""


@dataclass(slots=True)
class Removed:
    """What one run removed, per table, and how it went."""

    transaction_requests: int = 0
    credit_annotation_jobs: int = 0
    credit_annotation_job_repeats: int = 0
    jobs_completed: int = 0
    batches: int = 0
    largest_batch: int = 0
    gave_way: int = 0  # batches given up on a lock held longer than the lock timeout

    def line(self) -> str:
        return (
            f"removed {self.transaction_requests} transaction_requests, "
            f"{self.credit_annotation_jobs} credit_annotation_jobs, "
            f"{self.credit_annotation_job_repeats} credit_annotation_job_repeats "
            f"in {self.batches} batches (largest {self.largest_batch} rows); "
            f"{self.jobs_completed} finished jobs marked complete"
            + (f"; {self.gave_way} batch(es) gave way to a lock" if self.gave_way else "")
        )


@dataclass(frozen=True, slots=True)
class Retention:
    """The windows (days) and the bounds of each batch."""

    idempotency_days: int
    job_days: int
    batch_size: int = DEFAULT_BATCH_SIZE
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS


async def _batch(
    conn: Connection, policy: Retention, done: Removed, sql: str, *args: object
) -> int:
    """One batch, one statement in its own transaction: the rows it deleted (0 when it gave
    way to a lock)."""
    try:
        status = await conn.execute(sql, *args, policy.batch_size)
    except asyncpg.LockNotAvailableError:
        done.gave_way += 1
        log.warning("retention: a batch gave way to a lock held past the lock timeout")
        return 0
    deleted = int(status.rsplit(" ", 1)[-1])
    done.batches += 1
    done.largest_batch = max(done.largest_batch, deleted)
    return deleted


async def _cutoff(conn: Connection, days: int) -> datetime:
    value: datetime = await conn.fetchval(_CUTOFF, days)
    return value


async def _drain(
    conn: Connection, policy: Retention, done: Removed, sql: str, *args: object
) -> int:
    """Batches of ``sql`` until one deletes fewer rows than the bound: the rows deleted."""
    total = 0
    while True:
        deleted = await _batch(conn, policy, done, sql, *args)
        total += deleted
        if deleted < policy.batch_size:
            return total


async def _complete_done_jobs(conn: Connection, policy: Retention, cutoff: datetime) -> int:
    """Mark complete the jobs past the window whose lines are all recorded (as a status read)."""
    marked, after = 0, _BEFORE_ALL
    while rows := await conn.fetch(_DONE_UNMARKED, cutoff, policy.batch_size, *after):
        after = (rows[-1]["created_at"], rows[-1]["id"])
        for row in rows:
            recorded = int(await conn.fetchval(RECORDED, row["id"]))
            if recorded + int(row["dead_lettered"]) >= int(row["accepted"]):
                try:
                    await conn.execute(COMPLETE_JOB, row["id"], recorded)
                except asyncpg.LockNotAvailableError:  # held past the lock timeout: next run
                    continue
                marked += 1
    return marked


async def _remove_jobs(conn: Connection, policy: Retention, done: Removed) -> None:
    cutoff = await _cutoff(conn, policy.job_days)
    done.jobs_completed += await _complete_done_jobs(conn, policy, cutoff)
    while True:
        jobs = [r["id"] for r in await conn.fetch(_EXPIRED_JOBS, cutoff, policy.batch_size)]
        if not jobs:
            break
        done.credit_annotation_job_repeats += await _drain(conn, policy, done, _JOB_REPEATS, jobs)
        removed = await _batch(conn, policy, done, _JOBS, jobs)
        done.credit_annotation_jobs += removed
        if removed == 0:  # held by someone or gave way: the next run takes them
            break
    done.credit_annotation_job_repeats += await _drain(conn, policy, done, _ORPHAN_REPEATS, cutoff)


async def remove_expired(conn: Connection, policy: Retention) -> Removed:
    """Delete what is past its window, a bounded batch a transaction (see the module). The
    connection's ``lock_timeout`` and ``synchronous_commit`` are set for the run, then reset."""
    done = Removed()
    await conn.execute(_SESSION, f"{int(policy.lock_timeout_ms)}ms")
    try:
        cutoff = await _cutoff(conn, policy.idempotency_days)
        done.transaction_requests = await _drain(conn, policy, done, _REQUESTS, cutoff)
        await _remove_jobs(conn, policy, done)
    finally:
        await conn.execute("RESET lock_timeout; RESET synchronous_commit")
    return done
