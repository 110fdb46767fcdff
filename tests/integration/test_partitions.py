"""Ledger tables partitioned by time (issue 28): the layout, its bounds, and what an id that no
partition covers gets.

The guarantees of the plain layout on the partitioned one are proven by the tests marked
``ledger_layouts`` (the recorder's exactly-once, redelivery, refused rows, balances and job
progress), which run on both layouts.
"""

from __future__ import annotations

import itertools
import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from bulk_recorder.infra import partitions
from bulk_recorder.infra.ids import uuid7
from bulk_recorder.infra.migrate import migrate
from bulk_recorder.infra.roles import grant_roles, role_names
from consumer.cli import build_parser
from consumer.delivery import ERROR_HEADER
from consumer.tools import partitions as partitions_command
from consumer.tools.generator import Generator
from settings import load_settings
from tests.conftest import (
    Broker,
    Services,
    partition_ledger,
    run_cli,
    settings_env,
    unique_name,
    wait_for,
    with_database,
)
from tests.faults.audit import DATABASE_REFUSED
from tests.integration.producer_support import api_client, balances, expected_balances

pytestmark = [pytest.mark.postgres]

DAY = timedelta(days=1)
MS = timedelta(milliseconds=1)


def ms_of(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def v7_at(moment: datetime, rng: random.Random, *, lowest: bool = False) -> str:
    """A UUIDv7 (RFC 9562) of the millisecond ``moment``; ``lowest``: its random bits all 0."""
    rand_a = 0 if lowest else rng.getrandbits(12)
    rand_b = 0 if lowest else rng.getrandbits(62)
    value = ms_of(moment) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return str(uuid.UUID(int=value))


async def _insert_transaction(conn: asyncpg.Connection, tx_id: str) -> None:
    await conn.execute(
        "INSERT INTO transactions (id, organization_id, ledger_id, status, asset_code, amount)"
        " VALUES ($1, gen_random_uuid(), gen_random_uuid(), 'APPROVED', 'BRL', 1)"
        " ON CONFLICT (id) DO NOTHING",
        uuid.UUID(tx_id),
    )


async def test_the_bound_of_a_millisecond_is_its_uuidv7_prefix(database_url: str) -> None:
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        await partitions.apply_layout(conn, "day")
        for moment in (
            datetime(2031, 4, 1, tzinfo=UTC),
            datetime(2026, 12, 3, 7, 40, 0, 123000, tzinfo=UTC),
            datetime(1970, 1, 1, tzinfo=UTC),
        ):
            bound = await conn.fetchval("SELECT bulk_recorder_uuid_bound($1)", moment)
            assert bound == uuid.UUID(int=ms_of(moment) << 80), moment
            assert await conn.fetchval("SELECT bulk_recorder_uuid_time($1)", bound) == moment
    finally:
        await conn.close()


async def test_every_millisecond_at_every_boundary_lands_in_its_partition_with_no_gap(
    database_url: str,
) -> None:
    """Days across a month's end and two lone days, then weeks around them: the partitions
    meet end to end, and the first and last millisecond of every day, with the lowest and a
    random id of each, land in the partition that covers their day."""
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    rng = random.Random(28)
    first, last = datetime(2031, 3, 31, tzinfo=UTC), datetime(2031, 4, 21, tzinfo=UTC)
    try:
        await partitions.apply_layout(conn, "day")
        made = await partitions.create_partitions(conn, first, first + 2 * DAY, "day")
        for lone_day in (datetime(2031, 4, 14, tzinfo=UTC), datetime(2031, 4, 16, tzinfo=UTC)):
            made += await partitions.create_partitions(conn, lone_day, lone_day + MS, "day")
        made += await partitions.create_partitions(conn, first, last - MS, "week")
        # run again, with either span: nothing more to make
        assert await partitions.create_partitions(conn, first, last - MS, "day") == []
        assert await partitions.create_partitions(conn, first, last - MS, "week") == []
        rows = await conn.fetch(
            "SELECT partition::text, lower, upper"
            " FROM bulk_recorder_partitions('transactions'::regclass) ORDER BY lower"
        )
        assert sorted(made) == sorted(
            f"{table}_{r['partition'].split('_')[-1]}"
            for table in partitions.LEDGER_TABLES
            for r in rows
        )
        assert rows[0]["lower"] == uuid.UUID(int=ms_of(first) << 80)
        assert rows[-1]["upper"] == uuid.UUID(int=ms_of(last) << 80)
        for before, after in itertools.pairwise(rows):
            assert before["upper"] == after["lower"], (before, after)  # no gap, no overlap

        inside: dict[str, datetime] = {}
        day = first
        while day < last:
            for moment in (day, day + DAY - MS):
                inside[v7_at(moment, rng, lowest=True)] = moment
                inside[v7_at(moment, rng)] = moment
            day += DAY
        for tx_id in inside:
            await _insert_transaction(conn, tx_id)
        placed = await conn.fetch(
            "SELECT t.id::text, p.lower, p.upper FROM transactions AS t"
            " JOIN bulk_recorder_partitions('transactions'::regclass) AS p"
            " ON p.partition = t.tableoid"
        )
        assert len(placed) == len(inside)
        for row in placed:
            moment = inside[row["id"]]
            assert row["lower"].int >> 80 <= ms_of(moment) < row["upper"].int >> 80, row

        for outside in (first - MS, last):  # before the first partition, at the last one's end
            with pytest.raises(asyncpg.CheckViolationError, match="no partition"):
                await _insert_transaction(conn, v7_at(outside, rng))
    finally:
        await conn.close()


async def test_the_partitioned_tables_keep_every_column_constraint_index_and_key(
    services: Services, database_url: str
) -> None:
    plain_url = with_database(services.database_url, unique_name("brtest"))
    await migrate(plain_url)
    await partition_ledger(database_url)
    shapes = []
    for url in (plain_url, database_url):
        conn = await asyncpg.connect(url)
        try:
            shapes.append(await _shape(conn))
        finally:
            await conn.close()
    admin = await asyncpg.connect(with_database(services.database_url, "postgres"))
    try:
        await admin.execute(f'DROP DATABASE "{plain_url.rsplit("/", 1)[1]}" WITH (FORCE)')
    finally:
        await admin.close()
    plain, partitioned = shapes
    assert plain == partitioned


async def test_a_later_migrations_change_to_a_ledger_table_carries_over(database_url: str) -> None:
    """The partitioned tables are built from the catalog, not from a copy of 001: an index
    dropped or added, a column or a check added by a later migration, is in them too."""
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute(
            "DROP INDEX transactions_ledger_created_idx;"
            " CREATE INDEX operations_account_asset_idx ON operations (account_id, asset_code);"
            " ALTER TABLE transactions ADD COLUMN source text NOT NULL DEFAULT 'queue'"
            "  CONSTRAINT transactions_source_check CHECK (source <> '');"
            " CREATE UNIQUE INDEX credit_annotations_job_document_idx"
            "  ON credit_annotations (id, job_id, document);"
        )
        before = await _shape(conn)
        await partitions.apply_layout(conn, "day")
        assert await _shape(conn) == before
    finally:
        await conn.close()


async def test_the_privileges_granted_on_the_ledger_tables_are_kept(database_url: str) -> None:
    """Grants made before --apply (migrate --grant-roles) hold on the new tables."""
    await migrate(database_url)
    prefix = unique_name("brpart")
    conn = await asyncpg.connect(database_url)
    try:
        await grant_roles(conn, prefix)
        before = await _privileges(conn)
        assert {grantee for _, grantee, _ in before} == {f"{prefix}_recorder", f"{prefix}_api"}
        await partitions.apply_layout(conn, "day")
        assert await _privileges(conn) == before
    finally:
        for role in role_names(prefix):
            await conn.execute(f"DROP OWNED BY {role}")
            await conn.execute(f"DROP ROLE {role}")
        await conn.close()


async def _privileges(conn: asyncpg.Connection) -> list[tuple[str, str, str]]:
    rows = await conn.fetch(
        "SELECT c.relname, a.grantee::regrole::text, a.privilege_type"
        " FROM pg_class AS c CROSS JOIN LATERAL aclexplode(c.relacl) AS a"
        " WHERE c.relname = ANY($1) AND a.grantee <> c.relowner ORDER BY 1, 2, 3",
        list(partitions.LEDGER_TABLES),
    )
    return [tuple(r) for r in rows]


async def _shape(conn: asyncpg.Connection) -> dict[str, Any]:
    tables = list(partitions.LEDGER_TABLES)
    columns = await conn.fetch(
        "SELECT table_name, column_name, data_type, numeric_precision, numeric_scale,"
        " is_nullable, column_default FROM information_schema.columns"
        " WHERE table_name = ANY($1) ORDER BY 1, ordinal_position",
        tables,
    )
    # conparentid = 0: PostgreSQL adds to operations one internal copy of its foreign key per
    # partition of transactions (operations_transaction_id_fkey1, ...), derived from the key
    constraints = await conn.fetch(
        "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint"
        " WHERE conrelid = ANY(SELECT to_regclass(t) FROM unnest($1::text[]) AS t)"
        " AND conparentid = 0 ORDER BY 1, 2",
        tables,
    )
    indexes = await conn.fetch(
        "SELECT tablename, indexname, replace(indexdef, ' ON ONLY ', ' ON ') FROM pg_indexes"
        " WHERE tablename = ANY($1) ORDER BY 1, 2",
        tables,
    )
    return {
        "columns": [tuple(r) for r in columns],
        "constraints": [tuple(r) for r in constraints],
        "indexes": [tuple(r) for r in indexes],
    }


async def test_a_default_partition_holding_a_v4_id_blocks_the_partition_of_its_range(
    database_url: str,
) -> None:
    """Why the layout has no DEFAULT partition: a v4 id's first 48 bits read as a millisecond
    anywhere in 8,900 years; once such a row sits in a default partition, making the partition
    of its "time" fails, and the ids of that time with it."""
    await partition_ledger(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("CREATE TABLE transactions_default PARTITION OF transactions DEFAULT")
        future = datetime(2031, 6, 1, 12, tzinfo=UTC)
        v4 = uuid.UUID(int=ms_of(future) << 80 | 0x4 << 76 | 0b10 << 62 | 12345, version=4)
        await _insert_transaction(conn, str(v4))
        with pytest.raises(asyncpg.CheckViolationError, match="default partition"):
            await partitions.create_partitions(conn, future, future, "day")
    finally:
        await conn.close()


@pytest.mark.rabbitmq
async def test_a_record_in_no_partition_is_dead_lettered_alone_with_the_reason(
    make_settings, start_recorder, broker: Broker, db, database_url: str
) -> None:
    """A v4 id and a v7 id of a time with no partition are refused (23514): the recorder
    isolates each, dead-letters it with the database's reason, and records its batch-mates
    once, balances included."""
    await partition_ledger(database_url)
    gen = Generator.create(seed=28)
    rng = random.Random(28)
    rec = await start_recorder(
        make_settings(bulk_recorder_size=40, bulk_recorder_flush_timeout_ms=100)
    )
    good = [gen.transaction() for _ in range(20)]
    v4 = gen.transaction()
    v4["id"] = str(uuid.uuid4())
    too_old = gen.transaction()
    too_old["id"] = v7_at(datetime(2020, 1, 1, tzinfo=UTC), rng)
    v4_operation = gen.transaction()
    v4_operation["operations"][1]["id"] = str(uuid.uuid4())
    annotation = {**gen.credit_annotation(), "id": str(uuid.uuid4())}
    refused = [v4, too_old, v4_operation, annotation]
    messages: list[tuple[bytes, str | None]]
    messages = [(json.dumps(t).encode(), "transaction") for t in good[:10]]
    messages += [(json.dumps(t).encode(), "transaction") for t in refused[:3]]
    messages += [(json.dumps(annotation).encode(), "credit_annotation")]
    messages += [(json.dumps(t).encode(), "transaction") for t in good[10:]]
    await broker.publish_many(messages)
    await wait_for(
        lambda: (
            rec.value("bulk_recorder_messages_dead_lettered_total", reason="database") == 4
            and rec.value("bulk_recorder_messages_acked_total") == len(good)
        )
    )
    conn = await db()
    ids = {str(r[0]) for r in await conn.fetch("SELECT id FROM transactions")}
    assert ids == {t["id"] for t in good}
    assert await conn.fetchval("SELECT count(*) FROM credit_annotations") == 0
    assert await balances(conn) == expected_balances(good)
    dead = await broker.drain(broker.topology.dead_letter_queue)
    assert sorted(m.body for m in dead) == sorted(m for m, _ in messages[10:14])
    for message in dead:
        reason = str(message.headers[ERROR_HEADER])
        assert reason.startswith(DATABASE_REFUSED + ": 23514 no partition of relation"), reason


async def test_the_api_in_sync_mode_answers_an_id_in_no_partition_with_422(
    make_settings, db, database_url: str
) -> None:
    await partition_ledger(database_url)
    gen = Generator.create(seed=29)
    settings = make_settings(rabbitmq_transaction_async=False)
    fine = gen.transaction()
    v4 = {**gen.transaction(), "id": str(uuid.uuid4())}
    async with api_client(settings) as (client, _):
        assert (await client.post("/v1/transactions", json=fine)).status_code == 201
        for _ in range(2):  # the refusal is not remembered as an answer: a retry gets it again
            response = await client.post("/v1/transactions", json=v4)
            assert response.status_code == 422, response.text
            assert "23514 no partition of relation" in response.json()["detail"]
    conn = await db()
    assert [str(r[0]) for r in await conn.fetch("SELECT id FROM transactions")] == [fine["id"]]
    assert await conn.fetchval("SELECT count(*) FROM transaction_requests") == 1


@pytest.mark.rabbitmq
async def test_the_command_partitions_an_empty_ledger_once_and_refuses_one_with_rows(
    make_settings, database_url: str
) -> None:
    env = settings_env(make_settings())
    done = run_cli(["partitions"], env)
    assert done.returncode == 2, done
    assert "not partitioned: `bulk-recorder partitions --apply` first" in done.stderr
    conn = await asyncpg.connect(database_url)
    try:
        await _insert_transaction(conn, uuid7())
        done = run_cli(["partitions", "--apply"], env)
        assert done.returncode == 2, done
        assert "transactions holds rows" in done.stderr
        assert not await partitions.is_partitioned(conn)
        assert await conn.fetchval("SELECT count(*) FROM transactions") == 1
        await conn.execute("TRUNCATE operations, transactions")

        done = run_cli(["partitions", "--apply", "--span", "day", "--ahead", "2"], env)
        assert done.returncode == 0, done
        assert "ledger tables partitioned by id" in done.stdout
        assert await partitions.is_partitioned(conn)
        now = datetime.now(UTC)
        state = await partitions.coverage(conn, "day")
        assert state.until is not None
        assert state.until >= now + 2 * DAY
        await _insert_transaction(conn, uuid7())

        again = run_cli(["partitions", "--ahead", "2"], env)
        assert again.returncode == 0, again
        # nothing more to make, unless the day changed between the two runs
        assert "partitions: 0 created" in again.stdout or datetime.now(UTC).date() != now.date()
        assert "span day" in again.stdout
        assert await conn.fetchval("SELECT count(*) FROM transactions") == 1
    finally:
        await conn.close()


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


# (span, today as the run's clock reads it, the end of coverage after --ahead 1, 2 and 3): the
# span holding today and that many spans past it, whatever the moment in today's span.
AHEAD_CASES = [
    ("day", "2030-06-15T13:45", ["2030-06-17", "2030-06-18", "2030-06-19"]),
    ("day", "2030-06-15T00:00", ["2030-06-17", "2030-06-18", "2030-06-19"]),
    ("day", "2030-06-15T23:59:59.999999", ["2030-06-17", "2030-06-18", "2030-06-19"]),
    # a Sunday, the last day of its week (weeks start on Monday)
    ("week", "2030-12-08T12:00", ["2030-12-16", "2030-12-23", "2030-12-30"]),
    ("week", "2030-12-09T00:00", ["2030-12-23", "2030-12-30", "2031-01-06"]),
    ("month", "2030-12-15T12:00", ["2031-02-01", "2031-03-01", "2031-04-01"]),
    # the last day of a 31-day month, before a short one: spans, not 31 days
    ("month", "2031-01-31T12:00", ["2031-03-01", "2031-04-01", "2031-05-01"]),
    ("month", "2031-02-01T00:00", ["2031-04-01", "2031-05-01", "2031-06-01"]),
]


@pytest.mark.parametrize(
    ("span", "today", "until"), AHEAD_CASES, ids=[f"{c[0]}-{c[1]}" for c in AHEAD_CASES]
)
async def test_ahead_covers_the_span_holding_today_and_that_many_spans_past_it(
    database_url: str, capsys: pytest.CaptureFixture[str], span: str, today: str, until: list[str]
) -> None:
    """``partitions --span S --ahead N`` run on a fixed day (its clock injected), with N one
    less, equal to and one more than the default 2: the end of coverage is exact. A weekly run
    that made days, not weeks, ahead left the next week without a partition after one late run,
    and its records were dead-lettered."""
    settings = load_settings(database_url=database_url)
    now = _at(today)
    for ahead, end in zip((1, 2, 3), until, strict=True):
        args = build_parser().parse_args(
            ["partitions", "--apply", "--span", span, "--ahead", str(ahead)]
        )
        assert await partitions_command._run(settings, args, clock=lambda: now) == 0
        conn = await asyncpg.connect(database_url)
        try:
            state = await partitions.coverage(conn, span, at=now)
        finally:
            await conn.close()
        assert state.until == _at(end), (span, today, ahead)
        assert f"covered without a gap until {_at(end).isoformat()}" in capsys.readouterr().out
