"""The exact end-of-run check of every fault run: lost 0, doubled 0, DLQ = the invalid messages.

Everything is computed from what was published (the load report) and what is in PostgreSQL
and the broker afterwards; nothing is taken from the recorder's own account of itself.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

import asyncpg

from bulk_recorder.records import RecordError, decode
from consumer.delivery import ERROR_HEADER
from consumer.tools.generator import Generator
from consumer.tools.loadgen import LoadReport
from tests.conftest import Broker, RunningRecorder, wait_for
from tests.faults.conftest import scale

DATABASE_REFUSED = "database refused the row"


def shape(reason: str) -> str:
    """A reason with its numbers blanked: 'debits 1.00 != credits 0.01' -> 'debits #.# != ...'."""
    return re.sub(r"[0-9]+", "#", reason)


def expected_invalid_shapes(invalid_count: int) -> Counter[str]:
    """Reason shapes of the first ``invalid_count`` invalid messages the load generator makes.

    The generator cycles through a fixed list of faults; the numbers inside a reason depend on
    random amounts, its shape does not, so any seed gives the same shapes.
    """
    gen = Generator.create(seed=0)
    shapes: Counter[str] = Counter()
    for n in range(invalid_count):
        body, record_type, _ = gen.invalid(n)
        try:
            decode(body, record_type)
        except RecordError as exc:
            shapes[shape(exc.reason)] += 1
        else:  # pragma: no cover - the generator promised an invalid message
            raise AssertionError(f"invalid message #{n} decoded fine")
    return shapes


@dataclass
class Audit:
    """What a run left behind, compared with what it published."""

    published: int
    faults: int
    lost: int = 0
    doubled: int = 0
    phantom: int = 0  # rows whose id was never published as valid
    balance_mismatches: int = 0
    operations_missing: int = 0
    dlq_total: int = 0
    dlq_missing: int = 0
    dlq_surplus: int = 0  # at-least-once dead-lettering: a copy whose ack died with a crash
    dlq_unexpected: list[str] = field(default_factory=list)
    dlq_wrong_reason: list[str] = field(default_factory=list)
    dlq_without_reason: int = 0
    main_queue_ready: int = 0  # summed over the main queue's shards

    def line(self) -> str:
        return (
            f"records published {self.published}, faults injected {self.faults}, "
            f"lost {self.lost}, doubled {self.doubled}"
        )

    def details(self) -> str:
        return (
            f"  (dlq {self.dlq_total} = expected {self.dlq_total - self.dlq_surplus} + "
            f"{self.dlq_surplus} re-dead-lettered after a crash or cut; "
            f"phantom rows {self.phantom}, balance mismatches {self.balance_mismatches}, "
            f"operations missing {self.operations_missing}, main queue {self.main_queue_ready})"
        )

    def assert_exact(self, *, dlq_surplus_allowed: bool) -> None:
        print(self.line())
        print(self.details())
        assert self.lost == 0, self
        assert self.doubled == 0, self
        assert self.phantom == 0, self
        assert self.balance_mismatches == 0, self
        assert self.operations_missing == 0, self
        assert self.main_queue_ready == 0, self
        assert self.dlq_missing == 0, self
        assert self.dlq_unexpected == [], self
        assert self.dlq_wrong_reason == [], self
        assert self.dlq_without_reason == 0, self
        if not dlq_surplus_allowed:
            assert self.dlq_surplus == 0, self


def check_counters(
    rec: RunningRecorder,
    report: LoadReport,
    audit: Audit,
    *,
    broker_faults: bool = False,
    db_faults: bool = False,
) -> None:
    """The in-process recorder's own account must agree with the audit, message by message.

    Valid when that recorder ran alone. With ``broker_faults`` a delivery may have been acked
    into a connection that died (the ack was lost, the broker redelivered it, it was acked
    again) or dead-lettered twice for the same reason, so acks and dead letters are lower bounds.
    With ``db_faults`` a COMMIT can succeed while its answer is lost with the connection: the
    retry finds the rows there and counts them as ignored, so inserted is an upper bound.
    """
    value = rec.value
    received = value("bulk_recorder_messages_received_total")
    acked = value("bulk_recorder_messages_acked_total")
    dead = sum(
        value("bulk_recorder_messages_dead_lettered_total", reason=r)
        for r in ("decode", "type", "validation", "database")
    )
    rejected = value("bulk_recorder_messages_rejected_total")
    released = value("bulk_recorder_messages_released_total")
    dropped = value("bulk_recorder_messages_dropped_total")
    # every delivery ended in exactly one way
    assert received == acked + dead + rejected + released + dropped, (
        received,
        acked,
        dead,
        rejected,
        released,
        dropped,
    )
    assert value("bulk_recorder_buffer_messages") == 0
    assert value("bulk_recorder_paused") == 0
    if broker_faults:
        assert acked >= report.valid + report.duplicates
        assert dead >= audit.dlq_total - audit.dlq_surplus
    else:
        assert acked == report.valid + report.duplicates
        assert dead == audit.dlq_total
    rows = {
        "transactions": len(report.ids["transaction"]),
        "credit_annotations": len(report.ids["credit_annotation"]),
    }
    for table, count in rows.items():
        inserted = value("bulk_recorder_rows_inserted_total", table=table)
        attempted = value("bulk_recorder_rows_attempted_total", table=table)
        ignored = value("bulk_recorder_rows_ignored_total", table=table)
        assert attempted == inserted + ignored, (table, attempted, inserted, ignored)
        assert inserted <= count if db_faults else inserted == count, (table, inserted, count)
    operations = value("bulk_recorder_rows_inserted_total", table="operations")
    expected_operations = 2 * rows["transactions"]
    if db_faults:
        assert operations <= expected_operations
    else:
        assert operations == expected_operations


def report_for(messages: Sequence[tuple[bytes, str | None]]) -> tuple[LoadReport, Counter[str]]:
    """A load report for hand-made messages, and the reason shapes the DLQ must hold for them."""
    report = LoadReport(published=len(messages))
    shapes: Counter[str] = Counter()
    for body, record_type in messages:
        try:
            record = decode(body, record_type)
        except RecordError as exc:
            report.invalid += 1
            shapes[shape(exc.reason)] += 1
            continue
        if record.id in report.ids[record.record_type]:
            report.duplicates += 1
        else:
            report.valid += 1
            report.ids[record.record_type].add(record.id)
    return report, shapes


async def table_ids(conn: asyncpg.Connection) -> dict[str, set[str]]:
    return {
        "transaction": {str(r[0]) for r in await conn.fetch("SELECT id FROM transactions")},
        "credit_annotation": {
            str(r[0]) for r in await conn.fetch("SELECT id FROM credit_annotations")
        },
    }


async def row_counts(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval(
            "SELECT (SELECT count(*) FROM transactions) + (SELECT count(*) FROM credit_annotations)"
        )
    )


async def settled_count(broker: Broker, queue: str, timeout: float = 60) -> int:
    """The messages of ``queue`` once no consumer holds any (call it after consumers stopped).

    A passive declare counts ready messages only, and the broker returns a closed connection's
    unacked messages asynchronously, so "0 ready" right after a stop proves nothing. A quorum
    queue keeps a consumer, even a cancelled one, until its checked-out messages are settled or
    returned (the return and the removal are one step): with no consumer left, nothing is held
    and the ready count is the whole queue.
    """

    async def no_consumers() -> bool:
        declared = await broker.channel.declare_queue(queue, passive=True)
        return declared.declaration_result.consumer_count == 0

    await wait_for(no_consumers, timeout=timeout, interval=0.05)
    return await broker.ready_count(queue)


# rabbitmqctl arguments: each queue's name and messages (ready + unacked), one a line.
LIST_QUEUE_MESSAGES = ("list_queues", "--quiet", "--no-table-headers", "name", "messages")


def queue_messages(list_queues_output: str, queue: str) -> int:
    """Ready + unacked messages of ``queue`` in the output of LIST_QUEUE_MESSAGES."""
    for line in list_queues_output.splitlines():
        name, _, count = line.rpartition("\t")
        if name == queue:
            return int(count)
    raise AssertionError(f"queue {queue} not found in {list_queues_output!r}")


async def wait_until_consumed(queue: str, timeout: float = 60) -> None:
    """Until the local broker holds no message of ``queue``, ready or delivered and unacked
    (``rabbitmqctl list_queues messages``; a passive declare counts ready ones only).

    "0 ready" can come while a consumer still holds deliveries it has not settled yet; an
    orderly stop then gives them back and the audit counts them as left over. For tests whose
    broker is the local node.
    """

    def held() -> int:
        out = subprocess.run(
            ["rabbitmqctl", *LIST_QUEUE_MESSAGES],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        return queue_messages(out, queue)

    async def consumed() -> bool:
        return await asyncio.to_thread(held) == 0

    await wait_for(consumed, timeout=timeout, interval=0.5)


async def wait_for_rows(conn: asyncpg.Connection, rows: int, timeout: float = 300) -> None:
    """Wait until the record tables hold at least ``rows`` rows (progress, not speed)."""

    async def reached() -> bool:
        return await row_counts(conn) >= rows

    await wait_for(reached, timeout=timeout, interval=0.05)


_BALANCE_MISMATCHES = """
WITH expected AS (
    SELECT o.account_id, o.asset_code,
           sum(CASE WHEN o.type = 'CREDIT' THEN o.amount ELSE -o.amount END) AS available
    FROM operations o JOIN transactions t ON t.id = o.transaction_id
    WHERE t.status = 'APPROVED'
    GROUP BY o.account_id, o.asset_code
)
SELECT count(*)
FROM expected e FULL JOIN balances b USING (account_id, asset_code)
WHERE coalesce(e.available, 0) <> coalesce(b.available, 0)
"""

_OPERATIONS_MISSING = """
SELECT count(*) FROM transactions t
WHERE (SELECT count(*) FROM operations o WHERE o.transaction_id = t.id) <> 2
   OR t.amount <> (SELECT sum(o.amount) FROM operations o
                   WHERE o.transaction_id = t.id AND o.type = 'DEBIT')
"""


async def wait_until_settled(
    connect: Callable[[], Awaitable[asyncpg.Connection]],
    broker: Broker,
    report: LoadReport,
    timeout: float | None = None,
) -> None:
    """Wait until every valid record is in the tables, the DLQ holds at least the invalid
    messages and the main queue (each of its shards) has nothing ready (liveness bound, not a
    speed assertion)."""
    conn = await connect()
    valid = sum(len(ids) for ids in report.ids.values())
    topo = broker.topology

    async def done() -> bool:
        if await row_counts(conn) < valid:
            return False
        if await broker.ready_count(topo.dead_letter_queue) < report.invalid:
            return False
        for queue in topo.shard_queues():  # the one main queue, or each of its shards
            if await broker.ready_count(queue) != 0:
                return False
        return True

    await wait_for(done, timeout=timeout or scale(180, 1800), interval=0.25)


async def audit_run(
    conn: asyncpg.Connection,
    broker: Broker,
    report: LoadReport,
    *,
    faults: int,
    expected_dlq: Counter[str] | None = None,
    unconfirmed: Mapping[str, set[str]] | None = None,
) -> Audit:
    """Compare tables, balances, the DLQ and the main queue (every shard of it) with what was
    published.

    Call it after every recorder stopped (then a ready count of 0 means nothing was left
    unacked). ``expected_dlq`` is the multiset of reason shapes expected in the DLQ (default:
    the load generator's invalid messages). ``unconfirmed``: valid ids of publishes that
    failed (tests/cluster/traffic.py), which may be recorded or not.
    """
    audit = Audit(published=report.published, faults=faults)
    ids = await table_ids(conn)
    for record_type, published in report.ids.items():
        audit.lost += len(published - ids[record_type])
        maybe = (unconfirmed or {}).get(record_type, set())
        audit.phantom += len(ids[record_type] - published - maybe)
    # A primary key cannot hold an id twice; a doubled record would show as a doubled effect.
    audit.balance_mismatches = int(await conn.fetchval(_BALANCE_MISMATCHES))
    audit.operations_missing = int(await conn.fetchval(_OPERATIONS_MISSING))
    audit.doubled = audit.phantom + audit.balance_mismatches
    audit.main_queue_ready = sum(
        [await settled_count(broker, queue) for queue in broker.topology.shard_queues()]
    )

    expected = expected_dlq if expected_dlq is not None else expected_invalid_shapes(report.invalid)
    dead = await broker.drain(broker.topology.dead_letter_queue)
    audit.dlq_total = len(dead)
    found: Counter[str] = Counter()
    for message in dead:
        headers = message.headers or {}
        reason = headers.get(ERROR_HEADER)
        if not isinstance(reason, str):
            audit.dlq_without_reason += 1  # dead-lettered by the broker: a delivery limit hit
            continue
        if not reason.startswith(DATABASE_REFUSED):
            try:
                decode(message.body, message.type)
            except RecordError as exc:
                if exc.reason != reason:
                    audit.dlq_wrong_reason.append(f"{reason!r} != {exc.reason!r}")
            else:
                audit.dlq_wrong_reason.append(f"{reason!r} but the message is valid")
        found[shape(reason)] += 1
    for key in found.keys() | expected.keys():
        if key not in expected:
            audit.dlq_unexpected.append(f"{found[key]} x {key}")
        elif found[key] < expected[key]:
            audit.dlq_missing += expected[key] - found[key]
        else:
            audit.dlq_surplus += found[key] - expected[key]
    return audit
