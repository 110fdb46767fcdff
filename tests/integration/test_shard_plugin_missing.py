"""RABBITMQ_QUEUE_SHARDS > 1 on a broker without the random exchange plugin (the local broker
has it disabled): ``consume`` stops at start-up with exit 3 and one line naming the plugin and
the setting, as a topology mismatch does; nothing of the shards is left behind."""

from __future__ import annotations

import asyncio
import sys

import pytest

from bulk_recorder.infra.migrate import migrate
from tests.conftest import settings_env

pytestmark = [pytest.mark.rabbitmq, pytest.mark.postgres]


async def test_shards_without_the_random_exchange_plugin_is_exit_3_naming_it(
    make_settings, broker, database_url
) -> None:
    await migrate(database_url)
    settings = make_settings(rabbitmq_queue_shards=3)
    env = settings_env(settings, METRICS_PORT="0")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "consumer.cli",
        "consume",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:  # never leave a looping recorder behind if the test fails
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = err.decode()
    assert proc.returncode == 3, text
    [line] = [line for line in text.splitlines() if "rabbitmq_random_exchange" in line]
    assert line.startswith("bulk-recorder consume: RABBITMQ_QUEUE_SHARDS=3 needs"), line
    assert "not reachable" not in text, text
    # the exchange type was refused: no shard queue was declared before it
    declared = await broker.channel.declare_queue(settings.rabbitmq_queue, passive=True)
    assert declared.declaration_result.consumer_count == 0
