"""PostgreSQL goes away (connections cut or held) while records flow: an outage is not bad data.

Nothing is rejected or dead-lettered because of an outage, the recorder marks itself paused and
not ready, retries with backoff, releases what it holds when the outage lasts, and records
everything once the database is back.
"""

from __future__ import annotations

import asyncio
import random

import aio_pika
import aiormq
import pytest

from bulk_recorder.infra.migrate import migrate
from consumer.tools.generator import Generator
from consumer.tools.loadgen import LoadSpec, publish_load
from tests.conftest import Broker, RunningRecorder, wait_for
from tests.faults.audit import (
    audit_run,
    check_counters,
    report_for,
    row_counts,
    settled_count,
    wait_for_rows,
    wait_until_consumed,
    wait_until_settled,
)
from tests.faults.conftest import long_run, scale, via_proxy
from tests.faults.scrape import http_get, scrape

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.slow]


@long_run
async def test_database_cut_and_held_repeatedly_during_a_stream(
    make_settings, start_recorder, broker, db, services, database_url, pg_proxy
) -> None:
    settings = make_settings(database_url=via_proxy(database_url, pg_proxy))
    await migrate(database_url)
    conn = await db()
    faults = scale(4, 12)
    spec = LoadSpec("mixed", scale(20_000, 100_000), duplicates=0.05, invalid=0.01, seed=21)
    rng = random.Random(21)
    rec = await start_recorder(settings)
    publisher = asyncio.create_task(
        publish_load(services.rabbitmq_url, settings.rabbitmq_exchange, spec)
    )
    step = spec.count // (faults + 2)
    for n in range(faults):
        await wait_for_rows(conn, await row_counts(conn) + rng.randint(step // 2, step))
        if n % 2 == 0:
            # connections reset and new ones refused, longer than the flush timeout: flushes
            # fail, are retried with backoff, the recorder says it is paused
            pg_proxy.cut()
            await wait_for(lambda: rec.value("bulk_recorder_paused") == 1, timeout=30)
        else:
            # a partition: connections held, bytes neither delivered nor lost
            pg_proxy.blackhole()
        await asyncio.sleep(rng.uniform(0.3, 1.5))
        assert await broker.ready_count(broker.topology.dead_letter_queue) <= spec.invalid_count
        pg_proxy.restore()
    report = await publisher
    await wait_until_settled(db, broker, report)
    await wait_until_consumed(broker.topology.queue)
    await rec.shutdown()
    audit = await audit_run(conn, broker, report, faults=pg_proxy.faults)
    audit.assert_exact(dlq_surplus_allowed=False)
    check_counters(rec, report, audit, db_faults=True)
    assert rec.value("bulk_recorder_db_retries_total") > 0
    assert rec.value("bulk_recorder_messages_rejected_total") == 0
    assert rec.value("bulk_recorder_messages_dead_lettered_total", reason="database") == 0


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    await writer.wait_closed()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return int(head.split(" ")[1]), body


def _messages(gen: Generator, n: int) -> list[tuple[bytes, str | None]]:
    import json

    out: list[tuple[bytes, str | None]] = []
    for i in range(n):
        record_type = ("transaction", "credit_annotation")[i % 2]
        out.append((json.dumps(gen.record(record_type)).encode(), record_type))
    return out


async def test_outage_pauses_marks_not_ready_and_dead_letters_nothing(
    make_settings, start_recorder, broker, db, database_url, pg_proxy
) -> None:
    port = _free_port()
    settings = make_settings(
        database_url=via_proxy(database_url, pg_proxy),
        metrics_port=port,
        bulk_recorder_size=100,
    )
    rec = await start_recorder(settings)
    assert (await _get(port, "/readyz"))[0] == 200
    gen = Generator.create(seed=22)
    good = _messages(gen, 400)
    invalid = [(b"{broken", "transaction"), (b"[]", "credit_annotation"), (good[0][0], "refund")]

    pg_proxy.cut()
    # bad messages first: past the prefetch window nothing is delivered while flushes are stuck
    await broker.publish_many(invalid + good)
    await wait_for(lambda: _paused_judging_nothing(rec))
    assert await _get(port, "/readyz") == (503, "broker up, database down\n")
    # an outage lasting many flush timeouts: retried, never judged
    await wait_for(lambda: rec.value("bulk_recorder_db_retries_total") >= 10)
    assert rec.value("bulk_recorder_messages_acked_total") == 0
    assert rec.value("bulk_recorder_messages_rejected_total") == 0
    assert rec.value("bulk_recorder_messages_released_total") == 0
    assert rec.value("bulk_recorder_messages_dead_lettered_total", reason="database") == 0
    # bad data still goes to the DLQ at once: it needs no database
    await wait_for(lambda: _dead(rec) == len(invalid))
    assert await broker.ready_count(broker.topology.dead_letter_queue) == len(invalid)

    pg_proxy.restore()
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == len(good))
    assert rec.value("bulk_recorder_paused") == 0
    assert await _get(port, "/readyz") == (200, "broker up, database up\n")
    assert await broker.ready_count(broker.topology.dead_letter_queue) == len(invalid)
    await rec.shutdown()
    report, expected_dlq = report_for(invalid + good)
    audit = await audit_run(
        await db(), broker, report, faults=pg_proxy.faults, expected_dlq=expected_dlq
    )
    audit.assert_exact(dlq_surplus_allowed=False)
    # cut before any write began: no COMMIT can have been in flight, so the counts are exact
    check_counters(rec, report, audit)


def _paused_judging_nothing(rec: RunningRecorder) -> bool:
    """Paused yet? Fails at once if the outage was taken for bad data meanwhile."""
    assert rec.value("bulk_recorder_messages_rejected_total") == 0, "an outage judged as data"
    assert rec.value("bulk_recorder_messages_dead_lettered_total", reason="database") == 0
    return rec.value("bulk_recorder_paused") == 1


def _dead(rec: RunningRecorder) -> float:
    return sum(
        rec.value("bulk_recorder_messages_dead_lettered_total", reason=r)
        for r in ("decode", "type", "validation", "database")
    )


async def test_long_outage_releases_deliveries_and_pauses_intake(
    make_settings, start_recorder, broker, db, database_url, pg_proxy
) -> None:
    settings = make_settings(
        database_url=via_proxy(database_url, pg_proxy),
        bulk_recorder_release_after_s=1.0,
        bulk_recorder_size=50,
    )
    rec = await start_recorder(settings)
    gen = Generator.create(seed=23)
    good = _messages(gen, 300)

    pg_proxy.cut()
    await broker.publish_many(good)
    await wait_for(lambda: rec.value("bulk_recorder_messages_released_total") > 0)
    # intake is paused: everything goes back to the queue and stays there, nothing is judged
    await wait_for(lambda: _ready(broker, len(good)))
    assert rec.value("bulk_recorder_paused") == 1
    assert rec.value("bulk_recorder_messages_acked_total") == 0
    assert rec.value("bulk_recorder_messages_rejected_total") == 0
    assert _dead(rec) == 0
    received = rec.value("bulk_recorder_messages_received_total")
    # paused means paused: while it probes the database (each probe a refused connection at
    # the proxy), no new delivery arrives
    probes = pg_proxy.connections_total
    await wait_for(lambda: pg_proxy.connections_total >= probes + 3)
    assert rec.value("bulk_recorder_messages_received_total") == received

    pg_proxy.restore()
    await wait_for(lambda: rec.value("bulk_recorder_messages_acked_total") == len(good))
    assert rec.value("bulk_recorder_paused") == 0
    await rec.shutdown()
    report, expected_dlq = report_for(good)
    audit = await audit_run(
        await db(), broker, report, faults=pg_proxy.faults, expected_dlq=expected_dlq
    )
    audit.assert_exact(dlq_surplus_allowed=False)
    check_counters(rec, report, audit)  # exact: cut before any write began
    print(f"  (released {rec.value('bulk_recorder_messages_released_total'):.0f} deliveries)")


async def _ready(broker: Broker, n: int) -> bool:
    return await broker.ready_count(broker.topology.queue) == n


async def test_sigterm_during_an_outage_then_a_recorder_started_while_the_database_is_down(
    make_settings, recorders, broker, db, database_url, pg_proxy
) -> None:
    """The orderly stop gives up on the stuck flush after its bounded wait and judges nothing;
    a new recorder started while the database is still down waits for it, then records all."""
    await migrate(database_url)
    port = _free_port()
    settings = make_settings(
        database_url=via_proxy(database_url, pg_proxy),
        bulk_recorder_shutdown_timeout_s=2.0,
        metrics_port=port,
    )
    gen = Generator.create(seed=24)
    good = _messages(gen, 300)
    proc = await recorders.start(settings)

    async def ready() -> bool:
        return await http_get(port, "/readyz") == (200, "broker up, database up\n")

    await wait_for(ready, timeout=60)  # connected to both, consuming
    pg_proxy.cut()
    await broker.publish_many(good)

    async def retrying() -> bool:  # the outage is seen as one: paused, flushes retried
        metrics = await scrape(port)
        assert metrics.get("bulk_recorder_messages_rejected_total", 0) == 0, "judged as data"
        return (
            metrics.get("bulk_recorder_paused") == 1
            and metrics.get("bulk_recorder_db_retries_total", 0) >= 5
        )

    await wait_for(retrying, timeout=60)
    metrics = await scrape(port)
    assert metrics["bulk_recorder_messages_received_total"] > 0
    assert metrics["bulk_recorder_messages_rejected_total"] == 0
    assert metrics.get('bulk_recorder_messages_dead_lettered_total{reason="database"}', 0) == 0
    assert await proc.terminate() == 0
    # nothing acked, nothing judged: every message is back in the queue
    assert await settled_count(broker, broker.topology.queue) == len(good)
    assert await broker.ready_count(broker.topology.dead_letter_queue) == 0

    refused = pg_proxy.connections_total
    await proc.start()  # the database is still down: it keeps trying, and waits
    await wait_for(lambda: pg_proxy.connections_total >= refused + 2, timeout=60)
    assert await http_get(port, "/readyz") == (503, "broker down, database down\n")
    pg_proxy.restore()
    report, expected = report_for(good)
    await wait_until_settled(db, broker, report)
    assert await proc.terminate() == 0
    audit = await audit_run(
        await db(), broker, report, faults=pg_proxy.faults, expected_dlq=expected
    )
    audit.assert_exact(dlq_surplus_allowed=False)


async def test_sigterm_during_an_outage_acks_every_released_copy_before_closing(
    make_settings, recorders, broker, database_url, pg_proxy, confirm_hold
) -> None:
    """The orderly stop outlasts its bounded wait while the release of the stuck batches waits
    for confirms (held at a proxy on the recorder's publishing connection only). It must not
    close the consuming channel while a copy is published but its original not yet acked:
    each message ends in the queue exactly once, and nothing is judged."""
    await migrate(database_url)
    port = _free_port()
    settings = make_settings(
        database_url=via_proxy(database_url, pg_proxy),
        rabbitmq_url=via_proxy(broker.url, confirm_hold),
        bulk_recorder_shutdown_timeout_s=1.0,
        bulk_recorder_confirm_timeout_s=20.0,
        metrics_port=port,
    )
    good = _messages(Generator.create(seed=26), 300)
    proc = await recorders.start(settings)

    async def ready() -> bool:
        return await http_get(port, "/readyz") == (200, "broker up, database up\n")

    await wait_for(ready, timeout=60)
    pg_proxy.cut()
    await broker.publish_many(good)

    async def retrying() -> bool:
        metrics = await scrape(port)
        return (
            metrics.get("bulk_recorder_paused") == 1
            and metrics.get("bulk_recorder_db_retries_total", 0) >= 3
        )

    await wait_for(retrying, timeout=60)
    confirm_hold.hold_confirms()
    stopping = asyncio.create_task(proc.terminate())

    async def closed_or_waiting() -> bool:
        """Past the bounded wait for the final flush, with the copies' confirms held: the
        recorder either waits for them, or has closed its consuming channel (the queue has no
        consumer left) while they were under way."""
        if "published copies under way" in proc.log_text():
            return True
        queue = await broker.channel.declare_queue(broker.topology.queue, passive=True)
        consumers: int = queue.declaration_result.consumer_count
        return consumers == 0

    await wait_for(closed_or_waiting, timeout=30)
    assert "final flush did not finish in time" in proc.log_text()
    assert confirm_hold.held_chunks > 0, "no confirm was held: the race was not made"
    confirm_hold.let_confirms_through()
    assert await stopping == 0
    assert await settled_count(broker, broker.topology.queue) == len(good)
    assert await broker.ready_count(broker.topology.dead_letter_queue) == 0


def _ctl(*args: str) -> None:
    """rabbitmqctl on the machine's broker (a policy that matches only this test's queue)."""
    import subprocess

    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


# The policy alone would not need the lock: its pattern is this test's own queue, anchored, and
# no other test sets a policy on the machine's broker (the DLQ-refusal tests use a node of their
# own). What does: rabbitmqctl must have set it within the 5 s release window that started with
# the first delivery (else "released too early"), and rabbitmqctl boots an Erlang VM: 3 s of
# the 5 for a mere list_policies at a load average of 15 (2 cores), more with the load.
@pytest.mark.exclusive(
    reason="sets a policy on the shared broker, which must take effect within the 5 s release"
)
async def test_a_release_whose_copy_the_broker_refuses_is_requeued_never_dead_lettered(
    make_settings, start_recorder, broker, db, database_url, pg_proxy, caplog
) -> None:
    """A long outage releases the held deliveries, and the queue refuses their copies (at its
    max-length with reject-publish): each falls back to a nack that requeues it. Not a nack
    that dead-letters it: a valid message must not end in the DLQ (nor be dropped, were the
    DLQ refusing too) because the database was away. Recorded once the database is back."""
    import logging
    import re

    caplog.set_level(logging.WARNING, logger="consumer.delivery")
    topo = broker.topology
    settings = make_settings(
        database_url=via_proxy(database_url, pg_proxy),
        bulk_recorder_release_after_s=5.0,
        bulk_recorder_confirm_timeout_s=2.0,
        rabbitmq_numbers_of_workers=1,
        rabbitmq_numbers_of_prefetch=1,
        bulk_recorder_size=1,
    )
    rec = await start_recorder(settings)
    good = _messages(Generator.create(seed=25), 6)
    pg_proxy.cut()
    await broker.publish_many(good)
    await wait_for(lambda: rec.value("bulk_recorder_messages_received_total") >= 2)
    policy = f"full-{topo.queue}"
    _ctl(
        "set_policy",
        "--apply-to",
        "queues",
        "--priority",
        "100",
        policy,
        f"^{re.escape(topo.queue)}$",
        '{"max-length": 1, "overflow": "reject-publish"}',
    )
    try:
        # the queue refuses a copy now (a probe, refused, adds nothing), before any release
        probe = aio_pika.Message(b"probe", delivery_mode=aio_pika.DeliveryMode.PERSISTENT)

        async def refusing() -> bool:
            try:
                await broker.channel.default_exchange.publish(probe, routing_key=topo.queue)
            except aiormq.exceptions.DeliveryError:
                return True
            raise AssertionError("the probe was taken: the queue is not full")

        await wait_for(refusing, timeout=10)
        assert rec.value("bulk_recorder_messages_released_total") == 0, "released too early"
        await wait_for(lambda: rec.value("bulk_recorder_messages_released_total") >= 2)
        assert any("nacking it instead" in r.getMessage() for r in caplog.records)
    finally:
        _ctl("clear_policy", policy)
    pg_proxy.restore()

    async def all_recorded_none_dead_lettered() -> bool:
        # a nack without requeue: the broker dead-letters the released ones at once
        dead = await broker.ready_count(topo.dead_letter_queue)
        assert dead == 0, f"{dead} valid messages dead-lettered"
        return bool(rec.value("bulk_recorder_messages_acked_total") == len(good))

    await wait_for(all_recorded_none_dead_lettered)
    await rec.shutdown()
    report, expected_dlq = report_for(good)
    audit = await audit_run(
        await db(), broker, report, faults=pg_proxy.faults, expected_dlq=expected_dlq
    )
    audit.assert_exact(dlq_surplus_allowed=False)
