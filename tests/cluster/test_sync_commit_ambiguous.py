"""A flush that finds its rows already there returns only once the standby has them too.

With a synchronous standby out of reach, a COMMIT waits. The recorder's command timeout then
cancels it, and PostgreSQL's answer to a cancelled wait is to keep the transaction committed
locally ("canceling wait for synchronous replication ... already committed locally"): the rows
are on the primary alone. The flush is retried (or its deliveries released and redelivered to
another recorder); the retry's insert finds every row present, inserts nothing, and a
transaction that wrote nothing does not wait for the standby: it returned at once and the
deliveries were acked, though the standby lacked them. A failover then lost acked records
(found by tests/partitions/test_db_partitions.py: 214 acks and 282 rows committed while the
primary was cut from its standby).

Here the standby is detached, a write times out, and the same write again must fail (time out)
too, not return; attached again, it returns, and the standby has every row.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from bulk_recorder.infra import pg_hosts
from bulk_recorder.infra.errors import TransientDbError
from bulk_recorder.infra.migrate import migrate
from bulk_recorder.recorder.writer import PgWriter
from tests.cluster.conftest import PgClusterFactory
from tests.conftest import wait_for
from tests.integration.test_balances import ledger, records

pytestmark = [pytest.mark.cluster, pytest.mark.postgres, pytest.mark.timeout(180)]

TIMEOUT = 1.0  # the pool's command timeout (BULK_RECORDER_DB_COMMAND_TIMEOUT_S)


def attach_standby(cluster, conninfo: str) -> None:
    """Undo ``detach_standby``: the standby streams from the primary again."""
    quoted = conninfo.replace("'", "''")
    cluster.standby.sql(f"ALTER SYSTEM SET primary_conninfo = '{quoted}'")
    cluster.standby.sql("SELECT pg_reload_conf()")
    cluster.wait_streaming()


async def test_a_write_whose_rows_are_committed_locally_waits_for_the_standby(
    pg_clusters: PgClusterFactory,
) -> None:
    cluster = await asyncio.to_thread(pg_clusters, True)
    dsn = cluster.multi_host_dsn("bulk_recorder_sync")
    await migrate(dsn)
    flush = records(ledger(seed=3101, count=50, accounts=4))
    pool = await asyncpg.create_pool(
        dsn, min_size=1, max_size=2, command_timeout=TIMEOUT, connect=pg_hosts.connect
    )
    try:
        writer = PgWriter(pool)
        conninfo = cluster.standby.sql("SHOW primary_conninfo")
        await asyncio.to_thread(cluster.detach_standby)
        with pytest.raises(TransientDbError):  # the COMMIT waits; the timeout cancels it
            await writer.write(flush)
        present = cluster.primary.sql(
            "SELECT count(*) FROM transactions", database="bulk_recorder_sync"
        )
        assert present == "50", "the cancelled wait left the rows committed on the primary"

        try:  # must not return while the standby lacks the rows
            result = await writer.write(flush)
        except TransientDbError:
            pass
        else:
            pytest.fail(f"the retry returned without the standby: {result}")

        await asyncio.to_thread(attach_standby, cluster, conninfo)
        result = await writer.write(flush)
        assert result.table("transactions").ignored == 50
    finally:
        await pool.close()

    def on_standby() -> bool:
        return (
            cluster.standby.sql("SELECT count(*) FROM transactions", database="bulk_recorder_sync")
            == "50"
        )

    await wait_for(on_standby, timeout=30)
