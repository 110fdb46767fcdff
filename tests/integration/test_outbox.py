"""The transactional outbox and its relay, against the real PostgreSQL and RabbitMQ.

Atomicity (a failure between the work and the outbox row leaves neither), a job end to end
(API -> outbox -> relay -> queue -> recorder -> rows), broker outage, relay crash and kill,
several relays at once. Unroutable returns: tests/faults/test_relay_unroutable.py.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import pytest

import bulk_recorder.producer.api.jobs as jobs_module
import bulk_recorder.producer.api.transactions as transactions_module
from bulk_recorder.producer.job_staging import STAGING_TABLE, JobStaging
from bulk_recorder.producer.relay import Relay, RelayConfig
from bulk_recorder.producer.relay_batch import BatchSender
from bulk_recorder.records import decode
from consumer.tools.generator import Generator
from tests.conftest import settings_env, wait_for
from tests.faults.proxy import TcpProxy as HoldingProxy
from tests.integration.producer_support import (
    TcpProxy,
    api_client,
    ndjson,
    running_relay,
)

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

NDJSON = {"content-type": "application/x-ndjson"}


async def count(conn, table: str) -> int:
    return int(await conn.fetchval(f"SELECT count(*) FROM {table}"))


async def post_job(client, objects, **headers):
    response = await client.post(
        "/v1/credit-annotation-jobs", content=ndjson(objects), headers={**NDJSON, **headers}
    )
    assert response.status_code == 202, response.text
    return response.json()


# -- atomicity ------------------------------------------------------------------------------


async def test_failure_between_transaction_request_and_outbox_row_leaves_neither(
    make_settings, db, monkeypatch
) -> None:
    settings = make_settings()
    tx = Generator.create(1).transaction()

    async def broken_enqueue(*args, **kwargs):
        raise RuntimeError("injected failure after the request row")

    async with api_client(settings, raise_app_exceptions=False) as (client, _):
        monkeypatch.setattr(transactions_module, "enqueue", broken_enqueue)
        failed = await client.post("/v1/transactions", json=tx, headers={"Idempotency-Key": "a"})
        assert failed.status_code == 500
        conn = await db()
        assert await count(conn, "transaction_requests") == 0
        assert await count(conn, "outbox") == 0

        monkeypatch.undo()  # the key was not burned by the failed attempt
        retried = await client.post("/v1/transactions", json=tx, headers={"Idempotency-Key": "a"})
        assert retried.status_code == 202, retried.text
        assert "idempotent-replayed" not in retried.headers
        assert await count(conn, "transaction_requests") == 1
        assert await count(conn, "outbox") == 1


async def test_failure_in_the_middle_of_a_job_copy_leaves_no_job_and_no_outbox_rows(
    make_settings, db, monkeypatch
) -> None:
    settings = make_settings()
    gen = Generator.create(2)
    lines = [gen.credit_annotation() for _ in range(50)]
    calls = 0
    real_add = JobStaging.add

    async def add_then_fail(staging, rows):
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("injected failure after the first COPY")
        await real_add(staging, rows)

    monkeypatch.setattr(jobs_module, "COPY_BATCH_ROWS", 20)
    monkeypatch.setattr(JobStaging, "add", add_then_fail)
    async with api_client(settings, raise_app_exceptions=False) as (client, _):

        async def line_by_line():
            for line in lines:
                yield ndjson([line])

        failed = await client.post(
            "/v1/credit-annotation-jobs", content=line_by_line(), headers=NDJSON
        )
        assert failed.status_code == 500
        assert calls == 2  # the first batch had been staged
        conn = await db()
        assert await count(conn, "credit_annotation_jobs") == 0
        assert await count(conn, "outbox") == 0
        staged = "SELECT count(*) FROM pg_class WHERE relname = $1 AND relpersistence = 't'"
        assert await conn.fetchval(staged, STAGING_TABLE) == 0  # and dropped


# -- end to end ------------------------------------------------------------------------------


async def test_small_job_flows_through_outbox_relay_and_recorder(
    make_settings, start_recorder, db
) -> None:
    settings = make_settings(bulk_recorder_size=100)
    gen = Generator.create(3)
    lines = [gen.credit_annotation() for _ in range(1200)]
    lines.insert(10, {"id": "nope"})
    async with api_client(settings) as (client, _):
        job = await post_job(client, lines)
        assert (job["accepted"], job["rejected"]) == (1200, 1)
        assert job["rejections"] == [{"line": 11, "reason": "id: invalid UUID"}]
        status = (await client.get(job["status_url"])).json()
        assert status["status"] == "publishing"
        assert status["published"] == status["recorded"] == 0

        recorder = await start_recorder(settings)
        async with running_relay(settings) as relay:

            async def completed() -> bool:
                body = (await client.get(job["status_url"])).json()
                return bool(body["status"] == "completed")

            await wait_for(completed, timeout=60)
            assert relay.published == 1200
        final = (await client.get(job["status_url"])).json()
        assert final["accepted"] == final["published"] == final["recorded"] == 1200
        assert final["dead_lettered"] == 0
        assert final["progress"] == 1.0
        assert final["completed_at"] is not None
        conn = await db()
        assert await count(conn, "outbox") == 0
        ids = {r[0] for r in await conn.fetch("SELECT id::text FROM credit_annotations")}
        assert ids == {line["id"] for line in lines if line["id"] != "nope"}
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM credit_annotations WHERE job_id = $1", job["id"]
            )
            == 1200
        )
        assert (
            recorder.value("bulk_recorder_messages_dead_lettered_total", reason="validation") == 0
        )


async def test_relayed_message_has_the_contract_properties(make_settings, broker) -> None:
    """Published as docs/messages.md says: checked on the queue, with no recorder running."""
    settings = make_settings()
    tx = Generator.create(4).transaction()
    async with api_client(settings) as (client, _):
        assert (await client.post("/v1/transactions", json=tx)).status_code == 202
        async with running_relay(settings) as relay:
            await wait_for(lambda: relay.published == 1, timeout=30)
    [message] = await broker.drain(broker.topology.queue)
    assert message.exchange == settings.rabbitmq_exchange
    assert message.routing_key == "transaction"
    assert message.type == "transaction"
    assert message.content_type == "application/json"
    assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
    assert json.loads(message.body) == tx
    assert decode(message.body, message.type).id == tx["id"]


# -- outages and crashes --------------------------------------------------------------------


async def test_broker_outage_rows_wait_api_keeps_accepting_nothing_lost(
    make_settings, start_recorder, db
) -> None:
    settings = make_settings(bulk_recorder_size=100)
    mq = urlsplit(settings.rabbitmq_url)
    proxy = TcpProxy(mq.hostname or "127.0.0.1", mq.port or 5672)
    await proxy.start()
    port = proxy.port
    await proxy.cut()  # the broker is "down" from the start
    relay_settings = settings.model_copy(
        update={"rabbitmq_url": urlunsplit(mq._replace(netloc=f"guest:guest@127.0.0.1:{port}"))}
    )
    gen = Generator.create(5)
    async with api_client(settings) as (client, _):
        await start_recorder(settings)
        config = RelayConfig(batch_size=50, lanes=1, poll_interval_s=0.2)
        async with running_relay(relay_settings, config) as relay:
            job = await post_job(client, [gen.credit_annotation() for _ in range(3000)])
            conn = await db()
            await asyncio.sleep(1.0)  # the relay is retrying its connection meanwhile
            assert relay.relay.ready() == (False, "broker down, database up")
            assert await count(conn, "outbox") == 3000
            # The API keeps accepting while the broker is unreachable.
            tx = gen.transaction()
            assert (await client.post("/v1/transactions", json=tx)).status_code == 202

            await proxy.start()  # broker back
            await wait_for(lambda: relay.published >= 300, timeout=30)
            await proxy.cut()  # and gone again, with publishes in flight
            backlog_at_cut = await count(conn, "outbox")
            assert backlog_at_cut > 0
            await asyncio.sleep(0.5)
            assert await count(conn, "outbox") >= backlog_at_cut - 50  # at most the batch in flight
            await proxy.start()

            async def all_recorded() -> bool:
                n = await count(conn, "credit_annotations")
                return n == 3000 and await count(conn, "transactions") == 1

            await wait_for(all_recorded, timeout=90)
            assert proxy.connections >= 2  # it did reconnect
        status = (await client.get(job["status_url"])).json()
        assert status["status"] == "completed"
        assert status["published"] == status["recorded"] == 3000
        assert await count(conn, "outbox") == 0
    await proxy.cut()


async def test_publishes_without_a_confirm_leave_their_rows_in_the_outbox(
    make_settings, broker, db
) -> None:
    """The relay's broker connection is held (a partition) with a batch in flight: no confirm
    comes back, so every row stays in the outbox; once the network heals each is delivered
    (some twice: a publish that timed out may still arrive), none is lost."""
    settings = make_settings()
    target = urlsplit(settings.rabbitmq_url)
    async with HoldingProxy(target.hostname or "127.0.0.1", target.port or 5672) as proxy:
        userinfo = target.netloc.rpartition("@")[0]
        through = target._replace(netloc=f"{userinfo}@127.0.0.1:{proxy.port}")
        relay_settings = settings.model_copy(update={"rabbitmq_url": urlunsplit(through)})
        gen = Generator.create(12)
        records = [gen.credit_annotation() for _ in range(20)]
        config = RelayConfig(batch_size=50, lanes=1, poll_interval_s=0.2, publish_timeout_s=1.0)
        async with (
            api_client(settings) as (client, _),
            running_relay(relay_settings, config) as relay,
        ):
            await wait_for(lambda: relay.relay.ready()[0])
            proxy.blackhole()
            await post_job(client, records)

            def lost() -> float:
                return relay.value("bulk_recorder_outbox_publish_failures_total", reason="lost")

            await wait_for(lambda: lost() >= len(records))  # a whole batch without a confirm
            conn = await db()
            assert await count(conn, "outbox") == len(records)
            assert relay.published == 0
            proxy.restore()

            async def outbox_empty() -> bool:  # the counter moves before the delete commits
                return await count(conn, "outbox") == 0

            await wait_for(outbox_empty)
            assert relay.published == len(records)
    delivered = {json.loads(m.body)["id"] for m in await broker.drain(broker.topology.queue)}
    assert delivered == {r["id"] for r in records}


class SimulatedCrash(BaseException):
    """Raised between the confirms and the delete: like a process dying at that point."""


async def test_crash_between_publish_and_delete_only_duplicates(
    make_settings, start_recorder, db, monkeypatch
) -> None:
    settings = make_settings(bulk_recorder_size=100)
    gen = Generator.create(6)
    async with api_client(settings) as (client, _):
        await post_job(client, [gen.credit_annotation() for _ in range(500)])
    recorder = await start_recorder(settings)

    async def crash(self, conn, rows, outcomes):
        assert all(outcome is None for outcome in outcomes)  # every publish was confirmed
        raise SimulatedCrash

    monkeypatch.setattr(BatchSender, "_settle", crash)
    config = RelayConfig(batch_size=200, lanes=1, poll_interval_s=0.2)
    relay = Relay(settings, config=config)
    task = asyncio.create_task(relay.run(asyncio.Event()))
    await wait_for(lambda: recorder.value("bulk_recorder_messages_received_total") >= 200)
    task.cancel()  # the process is gone; its transaction rolls back
    with pytest.raises((SimulatedCrash, asyncio.CancelledError)):
        await task
    monkeypatch.undo()
    conn = await db()
    assert await count(conn, "outbox") == 500  # nothing was marked sent

    async with running_relay(settings, config) as second:
        await wait_for(lambda: second.published == 500, timeout=60)

        async def absorbed() -> bool:
            return bool(recorder.value("bulk_recorder_messages_acked_total") >= 700)

        await wait_for(absorbed, timeout=60)
    assert await count(conn, "credit_annotations") == 500
    assert recorder.value("bulk_recorder_rows_ignored_total", table="credit_annotations") >= 200


async def test_relay_process_killed_mid_run_loses_nothing(
    make_settings, start_recorder, db, tmp_path: Path
) -> None:
    settings = make_settings(bulk_recorder_size=200)
    gen = Generator.create(7)
    async with api_client(settings) as (client, _):
        job = await post_job(client, [gen.credit_annotation() for _ in range(4000)])
        await start_recorder(settings)
        conn = await db()
        log_path = tmp_path / "relay.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(  # noqa: ASYNC220 - killed below, waited in a thread
                [
                    sys.executable,
                    "-m",
                    "consumer.cli",
                    "relay",
                    "--batch-size",
                    "100",
                    "--lanes",
                    "1",
                ],
                env=settings_env(settings, METRICS_PORT="0"),
                stdout=log_file,
                stderr=log_file,
            )
            try:
                await wait_for(lambda: _between(conn, 400, 3600), timeout=60)
                proc.send_signal(signal.SIGKILL)
                assert await asyncio.to_thread(proc.wait, 30) == -signal.SIGKILL
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        left = await count(conn, "outbox")
        assert 0 < left < 4000, log_path.read_text()
        async with running_relay(settings):

            async def completed() -> bool:
                body = (await client.get(job["status_url"])).json()
                return bool(body["status"] == "completed")

            await wait_for(completed, timeout=90)
        assert await count(conn, "credit_annotations") == 4000
        assert await count(conn, "outbox") == 0


async def _between(conn, low: int, high: int) -> bool:
    published = 4000 - await count(conn, "outbox")
    return low <= published <= high


async def test_relay_stops_on_sigterm(make_settings, db, tmp_path: Path) -> None:
    settings = make_settings()
    async with api_client(settings) as (client, _):
        assert (
            await client.post("/v1/transactions", json=Generator.create(8).transaction())
        ).status_code == 202
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "consumer.cli",
        "relay",
        env=settings_env(settings, METRICS_PORT="0"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    conn = await db()
    try:
        await wait_for(lambda: _outbox_empty(conn), timeout=30)
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, out.decode()
    assert "relay stopped" in out.decode()


async def _outbox_empty(conn) -> bool:
    return await count(conn, "outbox") == 0


# -- concurrency and refusals ---------------------------------------------------------------


async def test_several_relays_publish_each_row_once(make_settings, start_recorder, db) -> None:
    settings = make_settings(bulk_recorder_size=100)
    gen = Generator.create(9)
    async with api_client(settings) as (client, _):
        await post_job(client, [gen.credit_annotation() for _ in range(3000)])
    recorder = await start_recorder(settings)
    config = RelayConfig(batch_size=100, lanes=2, poll_interval_s=0.2)
    async with running_relay(settings, config) as one, running_relay(settings, config) as two:
        await wait_for(lambda: one.published + two.published == 3000, timeout=60)
        await wait_for(
            lambda: recorder.value("bulk_recorder_messages_acked_total") == 3000, timeout=60
        )
    # SKIP LOCKED: no row went out twice, so the recorder saw no duplicate at all.
    assert recorder.value("bulk_recorder_messages_received_total") == 3000
    assert recorder.value("bulk_recorder_rows_ignored_total", table="credit_annotations") == 0
    conn = await db()
    assert await count(conn, "credit_annotations") == 3000
