"""``bulk-recorder partitions``: partition the ledger tables by time, and make partitions ahead.

``--apply --span SPAN`` once, on a freshly migrated database whose ledger tables are empty (it
refuses otherwise, exit 2, changing nothing); then the same command without ``--apply`` from
cron or a Kubernetes CronJob, at least once a span, to keep ``--ahead`` spans of partitions made
beyond the current one. Run it as the schema's owner (as ``migrate``): it runs DDL. What it
does and how to choose the span: docs/operations.md, "Partitioned ledger tables".
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime, time, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from settings import Settings


def add_parser(sub: Any) -> None:
    """The ``partitions`` sub-command."""
    part = sub.add_parser(
        "partitions",
        help="partition the ledger tables by time (--apply, once) and make partitions ahead",
    )
    part.add_argument(
        "--apply",
        action="store_true",
        help="replace the (empty) ledger tables with tables partitioned by id, i.e. by time",
    )
    part.add_argument(
        "--span",
        choices=("day", "week", "month"),
        default=None,
        help="what one partition covers (UTC); stored by --apply (default there: week) and "
        "used by every later run; given later, it changes the span of partitions made from then",
    )
    part.add_argument(
        "--ahead",
        type=_non_negative,
        default=2,
        metavar="N",
        help="make partitions for the span holding now and N spans past it",
    )
    part.add_argument(
        "--from",
        dest="start",
        type=_utc_date,
        default=None,
        metavar="YYYY-MM-DD",
        help="also cover from this day on (UTC), e.g. before replaying older records "
        "(default: the span holding now)",
    )


def cmd_partitions(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.runner import run_async

    return run_async(_run(settings, args))


def _utc_now() -> datetime:
    return datetime.now(UTC)


async def _run(
    settings: Settings, args: argparse.Namespace, clock: Callable[[], datetime] = _utc_now
) -> int:
    from bulk_recorder.infra import partitions, pg_hosts
    from bulk_recorder.infra.migrate import migrate

    await migrate(settings.database_url)
    conn = await pg_hosts.connect(settings.database_url)
    try:
        if args.apply:
            span = args.span or "week"
            made = await partitions.apply_layout(conn, span)
            print("ledger tables " + ("partitioned by id" if made else "already partitioned"))
        span = await partitions.stored_span(conn)
        if args.span and args.span != span:
            await conn.execute("UPDATE ledger_partitioning SET span = $1", args.span)
            span = args.span
        now = clock()
        start = min(args.start or now, now)
        end = covered_until(now, span, args.ahead)
        created = await partitions.create_partitions(conn, start, end, span)
        state = await partitions.coverage(conn, span, at=now)
    finally:
        await conn.close()
    for name in created:
        print(f"created {name}")
    until = state.until.isoformat() if state.until else "none: the current span has no partition"
    print(
        f"partitions: {len(created)} created, {state.partitions} per table; span {span}; "
        f"covered without a gap until {until}"
    )
    return 0


def covered_until(now: datetime, span: str, ahead: int) -> datetime:
    """The end of the span holding ``now`` and ``ahead`` spans past it (UTC; a week starts on
    Monday, a month is a calendar month): where the partitions a run makes end. Not ``now``
    plus so many days: from a span's first instant that ends a span short (the end is
    exclusive), and 31 days from the 31st of January end in March."""
    day = datetime.combine(now.astimezone(UTC).date(), time(), tzinfo=UTC)
    if span == "day":
        return day + timedelta(days=1 + ahead)
    if span == "week":
        return day - timedelta(days=day.weekday()) + timedelta(weeks=1 + ahead)
    months = day.year * 12 + day.month + ahead  # the month after today's, ``ahead`` more
    return day.replace(year=months // 12, month=months % 12 + 1, day=1)


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _utc_date(text: str) -> datetime:
    try:
        day = datetime.strptime(text, "%Y-%m-%d")
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date YYYY-MM-DD: {text!r}") from None
    return day.replace(tzinfo=UTC)
