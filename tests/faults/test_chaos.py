"""Everything at once: two recorder processes behind proxies to PostgreSQL and RabbitMQ, while
the suite kills replicas, cuts and holds the database and cuts the broker, in random order."""

from __future__ import annotations

import asyncio
import random

import pytest

from bulk_recorder.infra.migrate import migrate
from consumer.tools.loadgen import LoadSpec, publish_load
from tests.faults.audit import audit_run, row_counts, wait_for_rows, wait_until_settled
from tests.faults.conftest import long_run, scale, via_proxy

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.slow]


@long_run
async def test_kills_database_and_broker_faults_in_random_order(
    make_settings, recorders, broker, db, services, database_url, pg_proxy, mq_proxy
) -> None:
    await migrate(database_url)
    conn = await db()
    settings = make_settings(
        database_url=via_proxy(database_url, pg_proxy),
        rabbitmq_url=via_proxy(services.rabbitmq_url, mq_proxy),
    )
    procs = [await recorders.start(settings), await recorders.start(settings)]
    faults = scale(6, 30)
    spec = LoadSpec("mixed", scale(20_000, 200_000), duplicates=0.1, invalid=0.01, seed=81)
    rng = random.Random(81)
    publisher = asyncio.create_task(
        publish_load(services.rabbitmq_url, settings.rabbitmq_exchange, spec)
    )
    step = spec.count // (faults + 2)
    injected: list[str] = []
    for _ in range(faults):
        await wait_for_rows(conn, await row_counts(conn) + rng.randint(step // 2, step))
        fault = rng.choice(("kill", "db_cut", "db_hold", "broker_cut"))
        injected.append(fault)
        if fault == "kill":
            victim = rng.choice(procs)
            await victim.kill()
            await asyncio.sleep(rng.uniform(0, 0.5))
            await victim.start()
            continue
        proxy = mq_proxy if fault == "broker_cut" else pg_proxy
        if fault == "db_hold":
            proxy.blackhole()
        else:
            proxy.cut()
        await asyncio.sleep(rng.uniform(0.2, 1.5))  # longer than the 100 ms flush timeout
        proxy.restore()
    report = await publisher
    await wait_until_settled(db, broker, report)
    for proc in procs:
        assert await proc.terminate() == 0
    total = sum(p.kills for p in procs) + pg_proxy.faults + mq_proxy.faults
    assert total == len(injected)
    audit = await audit_run(conn, broker, report, faults=total)
    audit.assert_exact(dlq_surplus_allowed=True)
    print(
        "  (faults: " + ", ".join(f"{f} x{injected.count(f)}" for f in sorted(set(injected))) + ")"
    )
    assert "deadlock" not in "\n".join(p.log_text() for p in procs).lower()
