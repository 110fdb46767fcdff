"""``bulk-recorder retention``: remove the API's idempotency records and jobs past their window.

Windows: ``API_IDEMPOTENCY_RETENTION_DAYS`` (``transaction_requests``) and
``API_JOB_RETENTION_DAYS`` (completed ``credit_annotation_jobs`` and their repeats). Batches of
``--batch-size`` rows (default 1,000), oldest first, each its own transaction with a
``lock_timeout`` of ``--lock-timeout-ms``: run it from cron or a Kubernetes CronJob, as often as
you like; a run that gives way to a lock exits 1 and the next run takes what it left. What goes
and what stays: :mod:`bulk_recorder.producer.retention`. Run it as the schema's owner (as
``migrate``): the services' roles may not delete these rows.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from consumer.arguments import positive_int

# The drivers when the command runs: `bulk-recorder --help` builds this parser.
if TYPE_CHECKING:
    from settings import Settings


def add_parser(sub: Any) -> None:
    """The ``retention`` sub-command."""
    ret = sub.add_parser(
        "retention",
        help="remove idempotency records and completed jobs past their retention window",
    )
    ret.add_argument(
        "--batch-size",
        type=positive_int,
        default=1_000,
        metavar="N",
        help="rows deleted a database transaction",
    )
    ret.add_argument(
        "--lock-timeout-ms",
        type=positive_int,
        default=50,
        metavar="MS",
        help="a batch waiting longer than this for a lock gives way (the next run takes it)",
    )


def cmd_retention(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.runner import run_async

    return run_async(_run(settings, args))


async def _run(settings: Settings, args: argparse.Namespace) -> int:
    from bulk_recorder.infra import pg_hosts
    from bulk_recorder.infra.migrate import migrate
    from bulk_recorder.producer.retention import Retention, remove_expired

    await migrate(settings.database_url)  # the tables and their indexes, on a fresh install too
    policy = Retention(
        idempotency_days=settings.api_idempotency_retention_days,
        job_days=settings.api_job_retention_days,
        batch_size=args.batch_size,
        lock_timeout_ms=args.lock_timeout_ms,
    )
    conn = await pg_hosts.connect(settings.database_url)
    try:
        done = await remove_expired(conn, policy)
    finally:
        await conn.close()
    print(done.line(), file=sys.stdout)
    return 1 if done.gave_way else 0
