"""``bulk-recorder outbox unpark``: put parked outbox rows back in line for the relay.

The relay parks a row the broker refused ``max_attempts`` times (a body that makes the broker
close the channel) and counts it in its job's ``dead_lettered``. Rows parked for a cause that
has gone (a broker limit raised, or rows parked before issue 18 for a deleted queue) are put
back with this command: each is made available at once with its attempts at 0, its job's
``dead_lettered`` is lowered by as many rows, and a job that was complete counts again (its
``completed_at`` and frozen ``recorded`` are cleared; the next status read completes it again).
All in one database transaction, in id order (``--limit N``: the N oldest), then NOTIFY: the
running relays publish them at once. ``--dry-run`` prints the same summary and changes nothing.

Run it as the schema's owner (as ``migrate``): it changes job rows the relay's role may not.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

# The drivers when the command runs: `bulk-recorder --help` builds this parser.
if TYPE_CHECKING:
    from bulk_recorder.infra.db import Connection
    from settings import Settings

# Parked rows are never claimed by a relay, so these locks wait for nobody but another unpark.
_PARKED = """
SELECT id, job_id, last_error FROM outbox WHERE parked_at IS NOT NULL
ORDER BY id LIMIT $1 FOR UPDATE
"""
_UNPARK = """
UPDATE outbox SET parked_at = NULL, attempts = 0, available_at = '-infinity'
WHERE id = ANY($1::bigint[])
"""
# Jobs in id order, as the relay locks them (no deadlock with a relay counting the same jobs).
_UNCOUNT = """
UPDATE credit_annotation_jobs AS j
SET dead_lettered = j.dead_lettered - u.n, completed_at = NULL, recorded = NULL
FROM unnest($1::uuid[], $2::int[]) AS u(id, n)
WHERE j.id = u.id
"""


@dataclass
class Unparked:
    rows: int = 0
    per_job: Counter[str] = field(default_factory=Counter)
    reasons: Counter[str] = field(default_factory=Counter)

    def report(self, out: TextIO, *, dry_run: bool) -> None:
        verb = "would put back" if dry_run else "put back"
        jobless = self.rows - sum(self.per_job.values())
        print(
            f"{verb} {self.rows} parked outbox rows ({self.rows - jobless} of "
            f"{len(self.per_job)} job(s), {jobless} of no job)",
            file=out,
        )
        for job, n in sorted(self.per_job.items()):
            print(f"  job {job}: {n} rows (dead_lettered -{n})", file=out)
        for reason, n in self.reasons.most_common(5):
            print(f"  parked for: {reason} ({n} rows)", file=out)
        if dry_run:
            print("dry run: nothing changed", file=out)
        elif self.rows:
            print("the relays publish them now", file=out)


async def unpark(conn: Connection, *, limit: int | None, dry_run: bool) -> Unparked:
    """Put back up to ``limit`` parked rows (all when None) in one transaction."""
    async with conn.transaction():
        rows = await conn.fetch(_PARKED, limit)
        done = Unparked(
            rows=len(rows),
            per_job=Counter(str(r["job_id"]) for r in rows if r["job_id"] is not None),
            reasons=Counter(str(r["last_error"] or "unknown")[:120] for r in rows),
        )
        if dry_run or not rows:
            return done
        jobs = sorted(done.per_job)
        await conn.execute(_UNCOUNT, jobs, [done.per_job[j] for j in jobs])
        await conn.execute(_UNPARK, [r["id"] for r in rows])
        from bulk_recorder.producer.outbox import notify

        await notify(conn)
    return done


def add_parser(sub: Any) -> None:
    """The ``outbox`` sub-command and its own sub-commands."""
    outbox = sub.add_parser("outbox", help="the transactional outbox, by hand")
    outbox_sub = outbox.add_subparsers(dest="outbox_command", required=True)
    back = outbox_sub.add_parser(
        "unpark",
        help="put parked rows back for the relay (attempts 0, jobs' dead_lettered lowered)",
    )
    back.add_argument(
        "--limit", type=_positive_int, default=None, metavar="N", help="the N oldest only"
    )
    back.add_argument("--dry-run", action="store_true", help="print what would be put back")


def cmd_outbox(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.runner import run_async

    return run_async(_run(settings, args))


async def _run(settings: Settings, args: argparse.Namespace) -> int:
    from bulk_recorder.infra import pg_hosts
    from bulk_recorder.infra.migrate import migrate

    await migrate(settings.database_url)  # the outbox table, on a fresh install too
    conn = await pg_hosts.connect(settings.database_url)  # every host of the list, as migrate
    try:
        done = await unpark(conn, limit=args.limit, dry_run=args.dry_run)
    finally:
        await conn.close()
    done.report(sys.stdout, dry_run=args.dry_run)
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value
