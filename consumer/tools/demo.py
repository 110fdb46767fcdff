"""``bulk-recorder demo``: the main job end to end on the local services, with a checked summary.

It migrates, starts the real recorder process, publishes the run (both record types, some
duplicates, a few invalid), shows progress until every valid record is in PostgreSQL and every
invalid one is in the dead-letter queue, stops the recorder with SIGTERM, then prints a summary
and checks it against the database: every valid id recorded exactly once, nothing extra.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from bulk_recorder.infra import pg_hosts
from bulk_recorder.infra.broker import BrokerNodes
from bulk_recorder.infra.migrate import migrate
from consumer.tools.demo_support import ProgressLine, free_port, http_get
from consumer.tools.generator import Generator
from consumer.tools.loadgen import LoadReport, LoadSpec, publish_load
from consumer.topology import Topology, declare_topology
from settings import Settings

log = logging.getLogger(__name__)

DUPLICATES = 0.05
INVALID = 0.002
# The demo is a bulk load: unless BULK_RECORDER_SIZE is set, its recorder flushes 500 messages
# at a time (docs/performance.md's high-throughput setting) instead of the default workers x
# prefetch = 50. Measured side by side: 1.3-1.4x the records a second; every check unchanged.
DEMO_FLUSH_SIZE = 500


@dataclass
class Progress:
    published: int = 0
    recorded: int = 0
    dead_lettered: int = 0
    first_row_at: float = 0.0  # perf_counter when the first row was seen
    last_row_at: float = 0.0  # ... and when the count last grew

    def saw(self, recorded: int, now: float) -> None:
        if recorded > self.recorded:
            self.first_row_at = self.first_row_at or now
            self.last_row_at = now
        self.recorded = recorded

    @property
    def recorder_rate(self) -> float:
        """Rows a second from the first row seen to the last: the recorder's own pace."""
        span = self.last_row_at - self.first_row_at
        return self.recorded / span if span > 0 else 0.0


def _metric(text: str, name: str) -> float:
    """Sum of every sample of ``name`` (all label sets) in Prometheus text format."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _metric_labelled(text: str, name: str, label: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name}{{{label}}} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _dlq_ready(url: str, topology: Topology) -> int:
    connection = await BrokerNodes.from_setting(url).connect()
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(topology.dead_letter_queue, passive=True)
        return int(queue.declaration_result.message_count or 0)
    finally:
        await connection.close()


async def run_demo(settings: Settings, *, count: int, via: str = "queue") -> int:
    if via == "api":
        from consumer.tools.demo_api import run_demo_via_api

        return await run_demo_via_api(settings, count=count)
    topology = Topology.from_settings(settings)
    print(f"bulk-recorder demo: {count:,} records through {topology.queue} into PostgreSQL")
    applied = await migrate(settings.database_url)
    print(f"schema ready ({', '.join(applied) or 'up to date'})")
    connection = await BrokerNodes.from_setting(settings.rabbitmq_url).connect()
    try:
        await declare_topology(await connection.channel(), topology)
    finally:
        await connection.close()
    dlq_before = await _dlq_ready(settings.rabbitmq_url, topology)

    port = settings.metrics_port or free_port()
    env = {**os.environ, "METRICS_PORT": str(port), **_tuned(settings)}
    log_path = Path(tempfile.gettempdir()) / f"bulk-recorder-demo-{os.getpid()}.log"
    with log_path.open("wb") as log_file:
        recorder = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "consumer", env=env, stdout=log_file, stderr=log_file
        )
        print(f"recorder log: {log_path}")
        try:
            code = await _drive(settings, topology, recorder, port, count, dlq_before)
        finally:
            if recorder.returncode is None:
                recorder.kill()
                await recorder.wait()
    if code != 0:
        tail = log_path.read_text(errors="replace").splitlines()[-20:]
        print("last lines of the recorder log:", *tail, sep="\n  ", file=sys.stderr)
    return code


def _tuned(settings: Settings) -> dict[str, str]:
    """What the demo changes in the recorder's settings, said on the console: the flush size,
    unless the user chose one (or runs per-message mode)."""
    if settings.bulk_recorder_size or not settings.bulk_mode_active:
        print(f"recorder settings: yours (flush size {settings.effective_batch_size})")
        return {}
    print(
        f"recorder settings: BULK_RECORDER_SIZE={DEMO_FLUSH_SIZE} for this bulk run (the default, "
        f"0, flushes workers x prefetch = {settings.effective_batch_size} at a time; set "
        "BULK_RECORDER_SIZE to choose)"
    )
    return {"BULK_RECORDER_SIZE": str(DEMO_FLUSH_SIZE)}


async def _wait_ready(recorder: asyncio.subprocess.Process, port: int) -> bool:
    """Until the recorder answers /readyz (60 s at most, and only while it runs)."""
    deadline = time.monotonic() + 60
    while (await http_get(port, "/readyz"))[0] != 200:
        if recorder.returncode is not None or time.monotonic() > deadline:
            print("the recorder did not become ready", file=sys.stderr)
            return False
        await asyncio.sleep(0.2)
    print(f"recorder ready (pid {recorder.pid}, metrics on http://127.0.0.1:{port}/metrics)")
    return True


ROWS_INSERTED = "bulk_recorder_rows_inserted_total"
DEAD_LETTERED = "bulk_recorder_messages_dead_lettered_total"


async def _all_in(
    settings: Settings,
    topology: Topology,
    conn: asyncpg.Connection,
    gen: Generator,
    report: LoadReport,
    dlq_before: int,
    progress: Progress,
) -> bool:
    """Every valid record in PostgreSQL and every invalid one in the dead-letter queue (the
    run's own rows and the DLQ's growth, whoever recorded them); the counts go to progress."""
    recorded = await _recorded_count(conn, gen)
    dead = await _dlq_ready(settings.rabbitmq_url, topology) - dlq_before
    if recorded >= report.valid and dead >= report.invalid:
        progress.recorded, progress.dead_lettered = recorded, dead
        return True
    return False


async def _recorded_count(conn: asyncpg.Connection, gen: Generator) -> int:
    """The run's rows so far: its transactions and its job's credit annotations."""
    return int(
        await conn.fetchval(
            "SELECT (SELECT count(*) FROM transactions"
            "        WHERE organization_id = $1 AND ledger_id = $2)"
            " + (SELECT count(*) FROM credit_annotations WHERE job_id = $3)",
            gen.organization_id,
            gen.ledger_id,
            gen.job_id,
        )
    )


async def _stop_recorder(recorder: asyncio.subprocess.Process, port: int) -> tuple[str, int]:
    """The recorder's last metrics, then SIGTERM: (metrics text, exit code)."""
    _, metrics = await http_get(port, "/metrics")
    recorder.send_signal(signal.SIGTERM)
    return metrics, await asyncio.wait_for(recorder.wait(), 60)


async def _recorded_rows(
    conn: asyncpg.Connection, gen: Generator
) -> tuple[set[str], set[str], int]:
    """The run's transaction ids, credit-annotation ids and operation count."""
    tx_ids = {
        str(r[0])
        for r in await conn.fetch(
            "SELECT id FROM transactions WHERE organization_id = $1 AND ledger_id = $2",
            gen.organization_id,
            gen.ledger_id,
        )
    }
    ann_ids = {
        str(r[0])
        for r in await conn.fetch("SELECT id FROM credit_annotations WHERE job_id = $1", gen.job_id)
    }
    operations = int(
        await conn.fetchval(
            "SELECT count(*) FROM operations o JOIN transactions t ON t.id = o.transaction_id"
            " WHERE t.organization_id = $1 AND t.ledger_id = $2",
            gen.organization_id,
            gen.ledger_id,
        )
    )
    return tx_ids, ann_ids, operations


# Each of the run's accounts: its balance against its recorded operations (credits minus debits
# of APPROVED transactions). A duplicate that moved a balance twice, or a balance left behind,
# is a row here.
BALANCES_OFF = """
WITH expected AS (
    SELECT o.account_id, o.asset_code,
           sum(CASE o.type WHEN 'CREDIT' THEN o.amount ELSE -o.amount END) AS available
    FROM operations o JOIN transactions t ON t.id = o.transaction_id
    WHERE t.organization_id = $1 AND t.ledger_id = $2 AND t.status = 'APPROVED'
    GROUP BY o.account_id, o.asset_code
), held AS (
    SELECT account_id, asset_code, available FROM balances WHERE account_id = ANY($3::uuid[])
)
SELECT count(*) FROM expected e FULL JOIN held h USING (account_id, asset_code)
WHERE e.available IS DISTINCT FROM h.available
"""


async def _balances_off(conn: asyncpg.Connection, gen: Generator) -> int:
    """How many of the run's (account, asset) balances differ from their operations."""
    return int(await conn.fetchval(BALANCES_OFF, gen.organization_id, gen.ledger_id, gen.accounts))


def _gave_up(recorder: asyncio.subprocess.Process, line: ProgressLine, stalled_s: float) -> bool:
    """No progress for 120 s, or the recorder exited: say so and stop watching."""
    if stalled_s > 120:
        line.done()
        print("no progress for 120 s: giving up", file=sys.stderr)
        return True
    if recorder.returncode is not None:
        line.done()
        print(f"the recorder exited early ({recorder.returncode})", file=sys.stderr)
        return True
    return False


async def _drive(
    settings: Settings,
    topology: Topology,
    recorder: asyncio.subprocess.Process,
    port: int,
    count: int,
    dlq_before: int,
) -> int:
    if not await _wait_ready(recorder, port):
        return 1

    gen = Generator.create()
    spec = LoadSpec("mixed", count, duplicates=DUPLICATES, invalid=INVALID)
    progress = Progress()

    def on_published(n: int) -> None:
        progress.published += n

    started = time.perf_counter()
    publisher = asyncio.create_task(
        publish_load(
            settings.rabbitmq_url,
            topology.exchange,
            spec,
            progress=on_published,
            generator=gen,
        )
    )
    conn = await pg_hosts.connect(settings.database_url)
    line = ProgressLine()
    report: LoadReport | None = None
    try:
        stall_since = time.monotonic()
        last_seen = -1
        last_db_check = 0.0
        while True:
            metrics = (await http_get(port, "/metrics"))[1]
            recorded = int(
                _metric_labelled(metrics, ROWS_INSERTED, 'table="transactions"')
                + _metric_labelled(metrics, ROWS_INSERTED, 'table="credit_annotations"')
            )
            progress.saw(recorded, time.perf_counter())
            progress.dead_lettered = int(_metric(metrics, DEAD_LETTERED))
            elapsed = time.perf_counter() - started
            line.draw(
                f"published {progress.published:>9,}/{spec.total_messages:,}  "
                f"recorded {recorded:>9,}/{count:,}  dead-lettered {progress.dead_lettered:>5,}  "
                f"{recorded / elapsed if elapsed else 0:8,.0f} rec/s  {elapsed:6.1f} s"
            )
            if publisher.done() and report is None:
                report = publisher.result()
            # The recorder's counters say when; the database and the DLQ confirm it. (Counting
            # rows on every poll cost PostgreSQL a tenth of a core.) Every 10 s regardless, in
            # case another recorder on the queue took some of the run.
            counted = recorded >= count and progress.dead_lettered >= spec.invalid_count
            if report is not None and (counted or time.monotonic() - last_db_check > 10):
                last_db_check = time.monotonic()
                if await _all_in(settings, topology, conn, gen, report, dlq_before, progress):
                    break
            if recorded != last_seen:
                last_seen, stall_since = recorded, time.monotonic()
            if _gave_up(recorder, line, time.monotonic() - stall_since):
                return 1
            await asyncio.sleep(0.25)
        elapsed = time.perf_counter() - started
        line.draw(
            f"published {progress.published:>9,}/{spec.total_messages:,}  "
            f"recorded {progress.recorded:>9,}/{count:,}  "
            f"dead-lettered {progress.dead_lettered:>5,}  {elapsed:6.1f} s",
            force=True,
        )
        line.done()
        metrics, exit_code = await _stop_recorder(recorder, port)
        return await _summary(conn, gen, report, metrics, elapsed, exit_code, progress)
    finally:
        if not publisher.done():
            publisher.cancel()
        await conn.close()


async def _summary(
    conn: asyncpg.Connection,
    gen: Generator,
    report: LoadReport,
    metrics: str,
    elapsed: float,
    exit_code: int,
    progress: Progress,
) -> int:
    tx_ids, ann_ids, operations = await _recorded_rows(conn, gen)
    balances_off = await _balances_off(conn, gen)
    flushes = {
        r: _metric_labelled(metrics, "bulk_recorder_flushes_total", f'reason="{r}"')
        for r in ("size", "timeout", "shutdown")
    }
    size_sum = _metric(metrics, "bulk_recorder_flush_size_sum")
    size_count = _metric(metrics, "bulk_recorder_flush_size_count") or 1
    ignored = _metric(metrics, "bulk_recorder_rows_ignored_total")
    checks = {
        "every valid transaction recorded once, none extra": tx_ids == report.ids["transaction"],
        "every valid annotation recorded once, none extra": ann_ids
        == report.ids["credit_annotation"],
        "two operations per transaction": operations == 2 * len(tx_ids),
        "balances exact: each account's is the sum of its operations": balances_off == 0,
        "every invalid message dead-lettered": progress.dead_lettered == report.invalid,
        "recorder stopped cleanly on SIGTERM (exit 0)": exit_code == 0,
    }
    rate = len(tx_ids | ann_ids) / elapsed if elapsed else 0.0
    print()
    print("== bulk-recorder demo summary ==")
    print(f"published        {report.summary()}")
    print(
        f"pace             publisher {report.rate:,.0f} msg/s, recorder "
        f"{progress.recorder_rate:,.0f} records/s (first row to last, polled every 0.25 s)"
    )
    print(
        f"recorded         transactions {len(tx_ids):,} (operations {operations:,}), "
        f"credit_annotations {len(ann_ids):,}"
    )
    print(f"duplicates       {int(ignored):,} ignored by ON CONFLICT ({report.duplicates:,} sent)")
    print(f"dead-lettered    {progress.dead_lettered:,} invalid messages, reason in a header")
    print(f"elapsed          {elapsed:,.1f} s end to end, {rate:,.0f} records/s")
    print(
        "flushes          "
        + ", ".join(f"{k} {int(v):,}" for k, v in flushes.items())
        + f"; mean flush size {size_sum / size_count:,.1f} messages"
    )
    for name, ok in checks.items():
        print(f"check            {'OK  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1
