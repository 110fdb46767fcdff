"""BrokerNodes: start at a random node, move on when a connect fails or a connection is lost."""

from __future__ import annotations

import random
from typing import Any

import aio_pika
import pytest

from bulk_recorder.infra.broker import BrokerNodes, split_urls
from bulk_recorder.masking import endpoint

URLS = ("amqp://u:pw@n1:5672/", "amqp://u:pw@n2:5672/", "amqp://u:pw@n3:5672/")


class FakeConnect:
    """Stands in for aio_pika.connect: the nodes in ``down`` refuse."""

    def __init__(self, down: set[str]) -> None:
        self.down = down
        self.tried: list[str] = []

    async def __call__(self, url: str, **_: Any) -> str:
        self.tried.append(url)
        if url in self.down:
            raise ConnectionRefusedError(111, "refused")
        return f"connection to {url}"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeConnect:
    connect = FakeConnect(set())
    monkeypatch.setattr(aio_pika, "connect", connect)
    return connect


def test_split_and_endpoint_never_show_the_password() -> None:
    assert split_urls(" amqp://a/ ,amqp://b/") == ("amqp://a/", "amqp://b/")
    assert endpoint("amqps://user:pw@host:5671/vh") == "host:5671/vh"


def test_the_start_node_is_random_so_replicas_spread() -> None:
    starts = {BrokerNodes(URLS, rng=random.Random(seed)).order()[0] for seed in range(40)}
    assert starts == set(URLS)


async def test_a_refusing_node_is_skipped_and_the_next_one_used(fake: FakeConnect) -> None:
    nodes = BrokerNodes(URLS, rng=random.Random(0))
    first = nodes.order()[0]
    fake.down = {first}
    await nodes.connect()
    assert fake.tried[0] == first
    assert len(fake.tried) == 2
    assert nodes.current == fake.tried[1]


async def test_after_a_loss_the_next_node_is_tried_first(fake: FakeConnect) -> None:
    nodes = BrokerNodes(URLS, rng=random.Random(1))
    await nodes.connect()
    lost = nodes.current
    await nodes.connect()  # the caller reconnects after losing `lost`
    assert nodes.current != lost
    assert nodes.order()[-1] == nodes.current  # the one just used is tried last next time


async def test_every_node_down_raises_the_last_error(fake: FakeConnect) -> None:
    fake.down = set(URLS)
    with pytest.raises(ConnectionRefusedError):
        await BrokerNodes(URLS).connect()
    assert sorted(fake.tried) == sorted(URLS)


async def test_one_url_is_a_plain_connect(fake: FakeConnect) -> None:
    nodes = BrokerNodes.from_setting(URLS[0])
    for _ in range(2):
        await nodes.connect()
    assert fake.tried == [URLS[0], URLS[0]]
