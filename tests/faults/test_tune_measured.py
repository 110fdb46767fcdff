"""``bulk-recorder tune`` against a real recorder that went through crashes and a database outage.

The recorder process holds a set of records while it is SIGKILLed twice (a table lock keeps its
flush waiting), so the broker redelivers them each time; then it records them. Then PostgreSQL
is cut for a few seconds while new records arrive, so those are held through the outage. The
test measures both from outside (the attempts on the wire, through an AMQP tap; the outage's
timing from its own clock) and checks that ``tune`` reading the recorder's /metrics says the
same: the attempts valid records needed, and a worst hold whose bucket holds the longest hold
the test could have seen.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from bulk_recorder.infra.metrics import HOLD_BUCKETS
from bulk_recorder.infra.migrate import migrate
from consumer.tools.generator import Generator
from consumer.tools.tune_advice import LIMIT_MARGIN, recommend_consumer_timeout
from tests.conftest import Services, free_port, run_cli, settings_env, wait_for
from tests.faults.amqp_tap import AmqpTap
from tests.faults.conftest import via_proxy
from tests.faults.pg_locks import (
    backend_pid,
    close_gate,
    other_backends,
    wait_for_backends_gone,
)
from tests.faults.proxy import TcpProxy
from tests.faults.scrape import scrape

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.slow]

CRASHES = 2
HELD = 40  # records held through the crashes (all within one prefetch window)
DURING_OUTAGE = 60  # records that arrive while the database is cut
OUTAGE_S = 5.0  # how long the database stays cut once the recorder holds them all


def _records(gen: Generator, kind: str, n: int) -> list[tuple[bytes, str | None]]:
    return [(json.dumps(gen.record(kind)).encode(), kind) for _ in range(n)]


async def _metric(port: int, name: str) -> float:
    return (await scrape(port)).get(name, 0.0)


async def _reaches(port: int, name: str, value: float) -> bool:
    return await _metric(port, name) >= value


def _tune(port: int, env: dict[str, str], *extra: str) -> tuple[int, str]:
    done = run_cli(["tune", f"http://127.0.0.1:{port}/metrics", *extra], env)
    assert done.stderr == "", done.stderr
    return done.returncode, done.stdout


async def test_tune_reports_the_attempts_and_holds_a_real_recorder_went_through(
    make_settings,
    recorders,
    broker,
    db,
    database_url,
    services: Services,
    pg_proxy: TcpProxy,
    amqp_tap: AmqpTap,
) -> None:
    port = free_port()
    settings = make_settings(
        database_url=via_proxy(database_url, pg_proxy),
        rabbitmq_url=via_proxy(services.rabbitmq_url, amqp_tap),
        metrics_port=port,
        bulk_recorder_release_after_s=30.0,
    )
    await migrate(database_url)
    admin, gate = await db(), await db()
    gen = Generator.create(seed=2121)
    received = "bulk_recorder_messages_received_total"
    acked = "bulk_recorder_messages_acked_total"

    # 1. crashes: every flush of credit_annotations waits at the gate; SIGKILL while the
    # recorder holds all of them, so the broker returns each one (x-delivery-count + 1)
    await close_gate(gate, "credit_annotations")
    await broker.publish_many(_records(gen, "credit_annotation", HELD))
    proc = await recorders.start(settings)
    for _ in range(CRASHES):
        await wait_for(lambda: _reaches(port, received, HELD), timeout=60)
        await proc.kill()
        orphans = await other_backends(admin, [await backend_pid(gate)])
        for pid in orphans:  # backends of the killed process, still waiting at the gate
            await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        await wait_for_backends_gone(admin, orphans)
        await proc.start()
    started = time.monotonic()  # the last incarnation receives them after this
    await wait_for(lambda: _reaches(port, received, HELD), timeout=60)
    await gate.execute("ROLLBACK")
    await wait_for(lambda: _reaches(port, acked, HELD), timeout=60)
    crash_hold_at_most = time.monotonic() - started

    # 2. an outage: the database cut while new records arrive and are held
    pg_proxy.cut()
    published = time.monotonic()
    await broker.publish_many(_records(gen, "transaction", DURING_OUTAGE))
    await wait_for(lambda: _reaches(port, received, HELD + DURING_OUTAGE), timeout=60)
    all_received = time.monotonic()
    await wait_for(lambda: _reaches(port, "bulk_recorder_paused", 1), timeout=30)
    await asyncio.sleep(OUTAGE_S)  # the fault's length, chosen by the test
    # held now: the oldest one's age, live, while the outage lasts
    asked = time.monotonic()
    oldest = await _metric(port, "bulk_recorder_oldest_held_seconds")
    answered = time.monotonic()
    assert asked - all_received <= oldest <= answered - published, oldest
    restored = time.monotonic()
    pg_proxy.restore()
    await wait_for(lambda: _reaches(port, acked, HELD + DURING_OUTAGE), timeout=60)
    assert await _metric(port, "bulk_recorder_oldest_held_seconds") == 0
    outage_hold_at_most = time.monotonic() - published
    outage_hold_at_least = restored - all_received
    assert await admin.fetchval("SELECT count(*) FROM credit_annotations") == HELD
    assert await admin.fetchval("SELECT count(*) FROM transactions") == DURING_OUTAGE

    # what the wire saw: the attempt (x-delivery-count + 1) of each delivery acked
    attempts = [amqp_tap.delivery_counts[s.key] + 1 for s in amqp_tap.acks()]
    assert len(attempts) == HELD + DURING_OUTAGE
    assert max(attempts) == CRASHES + 1
    assert attempts.count(CRASHES + 1) == HELD

    env = settings_env(settings)
    code, out = await asyncio.to_thread(_tune, port, env, "--json", "--consumer-timeout", "600")
    assert code == 0, out
    print(out)
    report: dict[str, Any] = json.loads(out)
    measured = report["measured"]
    assert measured["settled"] == HELD + DURING_OUTAGE
    assert measured["recorded"] == HELD + DURING_OUTAGE
    assert measured["attempts_needed"] == CRASHES + 1
    assert measured["dead_lettered_attempt_at_most"] is None
    worst = measured["worst_hold_seconds_at_most"]
    below = max([b for b in HOLD_BUCKETS if b < worst], default=0.0)
    # the longest hold lies in (below, worst]: the outage held some for at least
    # outage_hold_at_least, and nothing was held longer than the test's outer bounds
    assert worst >= outage_hold_at_least, (worst, outage_hold_at_least)
    assert below < max(outage_hold_at_most, crash_hold_at_most), (below, worst)
    assert below <= measured["p999_hold_seconds"] <= worst
    assert report["in_force"] == {
        "consumer_timeout_ms": 600_000,
        "consumer_timeout_assumed": False,
        "release_after_s": 30.0,
        "delivery_limit": settings.rabbitmq_delivery_limit,
    }
    assert report["recommended"] == {
        "consumer_timeout_ms": int(recommend_consumer_timeout(worst, 30.0) * 1000),
        "release_after_s": 30.0,
        "delivery_limit": CRASHES + 1 + LIMIT_MARGIN,
    }
    assert report["warnings"] == []

    # the same, for a reader; and a broker timeout the release time is too close to
    code, text = await asyncio.to_thread(_tune, port, env, "--consumer-timeout", "90")
    print(text)
    assert code == 0, text
    assert f"worst at most {worst:g} s" in text
    assert f"attempts valid records needed: {CRASHES + 1}" in text
    assert "WARNING: BULK_RECORDER_RELEASE_AFTER_S=30 is not well below" in text
    assert await proc.terminate() == 0
