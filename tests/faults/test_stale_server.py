"""A server that stops taking writes (a demoted primary: SQLSTATE 25006) is left, not retried on.

After a failover, a pooled connection can stay on the old primary, which now answers every
write with ``cannot execute INSERT in a read-only transaction``. Retrying on that connection
can never succeed, and with a multi-host DATABASE_URL (``target_session_attrs=read-write``) a
new connection would find the new primary. So the pool's connections are renewed: the writes
after the outage come from connections opened after it began.
"""

from __future__ import annotations

import json

import pytest

from bulk_recorder.infra.migrate import migrate
from consumer.tools.generator import Generator
from tests.conftest import wait_for
from tests.faults.audit import row_counts

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

_SETUP = """
CREATE SEQUENCE refusals;
CREATE TABLE writers (pid int, backend_start timestamptz);
CREATE FUNCTION refuse_writes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM nextval('refusals');
    RAISE EXCEPTION 'cannot execute INSERT in a read-only transaction' USING ERRCODE = '25006';
END $$;
CREATE FUNCTION note_writer() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO writers SELECT pid, backend_start FROM pg_stat_activity
    WHERE pid = pg_backend_pid();
    RETURN NULL;
END $$;
"""


async def test_a_read_only_server_gets_the_pool_renewed(
    make_settings, start_recorder, broker, db, database_url
) -> None:
    await migrate(database_url)
    conn = await db()
    await conn.execute(_SETUP)
    rec = await start_recorder(make_settings(rabbitmq_numbers_of_workers=1, bulk_recorder_size=5))
    gen = Generator.create(seed=25006)
    before = [(json.dumps(gen.record("credit_annotation")).encode(), "credit_annotation")]
    await broker.publish_many(before * 1)
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 1)
    old = {
        r["pid"]
        for r in await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
    }
    assert old, "the recorder holds no connection"

    await conn.execute(
        "CREATE TRIGGER read_only BEFORE INSERT ON credit_annotations "
        "FOR EACH STATEMENT EXECUTE FUNCTION refuse_writes()"
    )
    during = [
        (json.dumps(gen.record("credit_annotation")).encode(), "credit_annotation")
        for _ in range(5)
    ]
    await broker.publish_many(during)

    async def refused() -> bool:
        return int(await conn.fetchval("SELECT last_value FROM refusals")) >= 2

    await wait_for(refused, timeout=30)
    # the note first: a retry landing between the two statements would go unnoted
    await conn.execute(
        "CREATE TRIGGER note_writer AFTER INSERT ON credit_annotations "
        "FOR EACH STATEMENT EXECUTE FUNCTION note_writer()"
    )
    await conn.execute("DROP TRIGGER read_only ON credit_annotations")
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == 6, timeout=60)
    assert await row_counts(conn) == 6
    writers = {r["pid"] for r in await conn.fetch("SELECT pid FROM writers")}
    assert writers, "no write was noted"
    assert not writers & old, (
        f"written after the read-only outage on connections {writers & old} that were open "
        "before it: the pool was not renewed"
    )
    assert rec.value("bulk_recorder_messages_dead_lettered_total", reason="database") == 0
