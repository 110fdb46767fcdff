"""Fixtures shared by the integration tests of more than one module."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from consumer.topology import Topology
from tests.conftest import Broker
from tests.otlp_receiver import OtlpReceiver


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    """A real OTLP/HTTP traces receiver on a free loopback port, for the services to export to."""
    r = OtlpReceiver()
    r.start()
    yield r
    r.stop()


@pytest.fixture
async def leftover(broker: Broker, topology: Topology) -> AsyncIterator[str]:
    """``<queue>.shard-2`` with the shard arguments, as a deployment that had 2 shards left it;
    deleted afterwards (the test topology knows one shard only)."""
    two = Topology(topology.exchange, topology.queue, topology.delivery_limit, shards=2)
    name = two.shard_queue(2)
    await broker.channel.declare_queue(name, durable=True, arguments=two.queue_arguments(2))
    yield name
    await broker.channel.queue_delete(name)
