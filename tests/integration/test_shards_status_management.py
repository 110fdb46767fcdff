"""``shards status --management URL`` on a private node with the management plugin: each shard's
leader node and unacked messages, which AMQP cannot tell, read from the management API; a
management API that refuses is one line, exit 1, never the password."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import pytest

from consumer.topology import Topology, declare_topology
from settings import load_settings
from tests.conftest import run_cli, settings_env, wait_for
from tests.rigs.rabbitmq_node import RabbitNode, available, free_port

pytestmark = [pytest.mark.rabbitmq]


@pytest.fixture
def management_node(tmp_path: Path) -> Iterator[tuple[RabbitNode, int]]:
    if not available():
        pytest.skip("rabbitmq-server is not installed here")
    port = free_port()
    config = (
        f"management.tcp.port = {port}\n"
        "management.tcp.ip = 127.0.0.1\n"
        "collect_statistics_interval = 500\n"
    )
    node = RabbitNode(
        f"brmgmt{uuid.uuid4().hex[:8]}",
        tmp_path / "rabbit",
        config=config,
        plugins=("rabbitmq_management",),
    )
    with node:
        yield node, port


async def test_status_reads_each_shards_leader_and_unacked_from_the_management_api(
    management_node: tuple[RabbitNode, int],
) -> None:
    node, port = management_node
    suffix = uuid.uuid4().hex[:8]
    topology = Topology(f"brmg.{suffix}", f"brmg.{suffix}.records", delivery_limit=5)
    two = Topology(topology.exchange, topology.queue, topology.delivery_limit, shards=2)
    settings = load_settings(
        rabbitmq_url=node.url,
        rabbitmq_exchange=topology.exchange,
        rabbitmq_queue=topology.queue,
        database_url="postgresql://postgres@127.0.0.1:5432/unused",
        metrics_port=0,
    )
    connection = await aio_pika.connect(node.url)
    try:
        channel = await connection.channel()
        await declare_topology(channel, topology)
        leftover = await channel.declare_queue(
            two.shard_queue(2), durable=True, arguments=two.queue_arguments(2)
        )
        for _ in range(3):
            await channel.default_exchange.publish(aio_pika.Message(b"{}"), leftover.name)
        held = await leftover.get(no_ack=False)  # one unacked, while the command looks
        assert held is not None
        env = settings_env(settings)
        api = f"http://127.0.0.1:{port}"
        lines: list[str] = []

        async def shown() -> bool:
            done = await asyncio.to_thread(run_cli, ["shards", "status", "--management", api], env)
            assert done.returncode == 0, done.stdout + done.stderr
            lines[:] = [row for row in done.stdout.splitlines() if f" {leftover.name} " in row]
            return bool(lines) and lines[0].split()[4] == "1"

        await wait_for(shown, timeout=60, interval=0.5)
        # the unacked get counts as a consumer too: a quorum queue keeps one for what it has
        # checked out (what makes `shards prune`'s "no consumer" mean "nothing unacked")
        assert lines[0].split() == ["2", leftover.name, "leftover", "2", "1", "1", node.node]

        refused = await asyncio.to_thread(
            run_cli,
            ["shards", "status", "--management", f"http://guest:wrong-secret@127.0.0.1:{port}"],
            env,
        )
        assert refused.returncode == 1, refused.stdout + refused.stderr
        [line] = refused.stderr.strip().splitlines()
        assert line == (
            f"bulk-recorder shards: the management API at 127.0.0.1:{port} answered 401 "
            "Unauthorized"
        ), line
        assert "wrong-secret" not in refused.stdout + refused.stderr
        await held.ack()
    finally:
        await connection.close()
