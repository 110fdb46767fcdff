"""End to end: the real ``bulk-recorder consume`` process, fed by ``bulk-recorder publish``,
stopped by SIGTERM; and a bad setting that stops start-up with a clear message."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from consumer.tools.generator import Generator
from tests.conftest import free_port, settings_env, wait_for
from tests.faults.amqp_tap import AmqpTap
from tests.faults.audit import settled_count
from tests.faults.scrape import scrape

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

CLI = [sys.executable, "-m", "consumer.cli"]


async def _ready(port: int) -> bool:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.write(b"GET /readyz HTTP/1.1\r\n\r\n")
    await writer.drain()
    raw = await reader.read()
    writer.close()
    return raw.startswith(b"HTTP/1.1 200")


async def test_consume_process_records_published_load_and_stops_on_sigterm(
    make_settings, broker, db, tmp_path: Path
) -> None:
    port = free_port()
    settings = make_settings(metrics_port=port, bulk_recorder_size=200)
    env = settings_env(settings)
    log_path = tmp_path / "recorder.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, not awaited here
            [sys.executable, "-m", "consumer"], env=env, stdout=log_file, stderr=log_file
        )
        try:
            await wait_for(lambda: _ready(port), timeout=30)
            publish = await asyncio.create_subprocess_exec(
                *CLI,
                "publish",
                "--type",
                "mixed",
                "--count",
                "3000",
                "--duplicates",
                "0.1",
                "--invalid",
                "0.02",
                "--quiet",
                "--seed",
                "42",
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await asyncio.wait_for(publish.communicate(), 120)
            finally:
                if publish.returncode is None:
                    publish.kill()
                    await publish.wait()
            assert publish.returncode == 0, err.decode()
            assert "3360 messages (3000 valid, 300 duplicates, 60 invalid)" in out.decode()
            conn = await db()

            async def all_recorded() -> bool:
                n = await conn.fetchval(
                    "SELECT (SELECT count(*) FROM transactions)"
                    " + (SELECT count(*) FROM credit_annotations)"
                )
                return bool(n == 3000)

            await wait_for(all_recorded, timeout=120)

            async def all_dead_lettered() -> bool:
                return bool(await broker.ready_count(broker.topology.dead_letter_queue) == 60)

            await wait_for(all_dead_lettered, timeout=30)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(proc.wait, 60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log = log_path.read_text()
    assert "Bulk mode is ACTIVE" in log
    assert "Bulk mode configured for consumer: size=200 timeout_ms=100 workers=5 prefetch=10" in log
    assert "SIGTERM received" in log
    assert await conn.fetchval("SELECT count(*) FROM transactions") == 1500
    assert await conn.fetchval("SELECT count(*) FROM operations") == 3000
    # nothing ready, and nothing left unacked once the broker has dropped the consumer
    assert await settled_count(broker, broker.topology.queue) == 0


async def test_sigterm_with_records_still_buffered_commits_and_acks_them_all(
    make_settings, broker, db, services, tmp_path: Path
) -> None:
    """SIGTERM while every record is still in the collector (a batch larger than what was sent,
    a flush timeout far away): the final flush commits them all, an ack frame for every
    delivery leaves the process before its connection closes (read off the wire), exit 0.

    Whether RabbitMQ applies those acks before the close is the broker's part: 3.10 keeps
    quorum-queue settles beyond 32 in flight for later and drops them with the channel (the
    known limits in docs/guarantees.md); the messages come back and the idempotent insert
    absorbs them."""
    port = free_port()
    target = urlsplit(services.rabbitmq_url)
    async with AmqpTap(target.hostname or "127.0.0.1", target.port or 5672) as tap:
        userinfo = target.netloc.rpartition("@")[0]
        settings = make_settings(
            rabbitmq_url=urlunsplit(target._replace(netloc=f"{userinfo}@127.0.0.1:{tap.port}")),
            metrics_port=port,
            bulk_recorder_size=1000,
            bulk_recorder_flush_timeout_ms=600_000,
        )
        gen = Generator.create(seed=43)
        records = [gen.record(("transaction", "credit_annotation")[n % 2]) for n in range(300)]
        log_path = tmp_path / "recorder.log"
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, not awaited here
                [sys.executable, "-m", "consumer"],
                env=settings_env(settings),
                stdout=log_file,
                stderr=log_file,
            )
            try:
                await wait_for(lambda: _ready(port), timeout=30)
                await broker.publish_many([(json.dumps(r).encode(), _type_of(r)) for r in records])

                async def all_buffered() -> bool:  # received, none written yet
                    metrics = await scrape(port)
                    received = metrics.get("bulk_recorder_messages_received_total")
                    buffered = metrics.get("bulk_recorder_buffer_messages")
                    return received == buffered == len(records)

                await wait_for(all_buffered, timeout=60)
                assert (await scrape(port)).get("bulk_recorder_flush_size_count") == 0
                proc.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(proc.wait, 60) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        assert "SIGTERM received" in log_path.read_text()
        # every delivery acked once, on its channel, before the process closed its connection
        assert tap.problems() == []
        assert len(tap.delivered) == len(records)
        assert {a.key for a in tap.acks()} == set(tap.delivered)
    conn = await db()
    recorded = {str(r[0]) for r in await conn.fetch("SELECT id FROM transactions")}
    recorded |= {str(r[0]) for r in await conn.fetch("SELECT id FROM credit_annotations")}
    assert recorded == {r["id"] for r in records}
    assert await broker.ready_count(broker.topology.dead_letter_queue) == 0


def _type_of(record: dict[str, object]) -> str:
    return "transaction" if "operations" in record else "credit_annotation"


def test_per_message_mode_is_logged_with_its_reason(make_settings) -> None:
    settings = make_settings(bulk_recorder_enabled=False)
    env = settings_env(settings, RABBITMQ_URL="amqp://guest:guest@127.0.0.1:1/")
    proc = subprocess.Popen([*CLI, "consume"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        seen = ""
        while "Bulk mode configured" not in seen:
            line = proc.stderr.readline()
            assert line, seen
            seen += line
        assert "Bulk mode is INACTIVE (BULK_RECORDER_ENABLED=false)" in seen
        assert "size=1 " in seen
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.mark.parametrize(
    ("name", "value"),
    [("RABBITMQ_NUMBERS_OF_WORKERS", "0"), ("BULK_RECORDER_FLUSH_TIMEOUT_MS", "soon")],
)
def test_bad_setting_stops_start_up_naming_the_variable(name: str, value: str) -> None:
    import os

    env = {**os.environ, name: value}
    result = subprocess.run(
        [*CLI, "consume"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert name in result.stderr
    assert value in result.stderr


async def test_queue_declared_with_other_arguments_stops_start_up_clearly(
    make_settings, broker
) -> None:
    # the broker fixture declared the queue with delivery limit 5; ask for 7
    env = settings_env(make_settings(rabbitmq_delivery_limit=7))
    proc = await asyncio.create_subprocess_exec(
        *CLI, "consume", env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:  # never leave a looping recorder behind if the test fails
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 3
    text = err.decode()
    assert "PRECONDITION_FAILED" in text
    assert "RABBITMQ_DELIVERY_LIMIT" in text
