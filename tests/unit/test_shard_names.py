"""Shard names and arguments: shard 1 is RABBITMQ_QUEUE with today's arguments, shard k >= 2 is
``<queue>.shard-<k>`` with the same ones plus a balanced leader locator (and, with
RABBITMQ_QUEUE_SHARD_REPLICAS, a group size)."""

from __future__ import annotations

import pytest

from consumer.topology import Topology

TOPOLOGY = Topology(exchange="ex", queue="ex.records", delivery_limit=7, shards=3)


def test_one_shard_is_todays_topology() -> None:
    one = Topology(exchange="ex", queue="ex.records", delivery_limit=7)
    assert one.shards == 1
    assert one.shard_queues() == ["ex.records"]
    assert one.queue_arguments() == {
        "x-queue-type": "quorum",
        "x-delivery-limit": 7,
        "x-dead-letter-exchange": "ex.dlx",
    }


def test_shard_names() -> None:
    assert TOPOLOGY.shard_queues() == ["ex.records", "ex.records.shard-2", "ex.records.shard-3"]
    assert TOPOLOGY.shard_exchange == "ex.shards"
    assert TOPOLOGY.lock_queue == "ex.topology-lock"
    assert TOPOLOGY.dead_letter_queue == "ex.records.dlq"  # one DLQ for every shard
    with pytest.raises(ValueError, match="from 1"):
        TOPOLOGY.shard_queue(0)


def test_shard_arguments() -> None:
    assert "x-queue-leader-locator" not in TOPOLOGY.queue_arguments(1)
    for number in (2, 3):
        assert TOPOLOGY.queue_arguments(number) == {
            "x-queue-type": "quorum",
            "x-delivery-limit": 7,
            "x-dead-letter-exchange": "ex.dlx",
            "x-queue-leader-locator": "balanced",
        }


def test_shard_replicas_set_the_group_size_of_shards_2_to_n_only() -> None:
    """RABBITMQ_QUEUE_SHARD_REPLICAS: shards 2..N get x-quorum-initial-group-size; shard 1 keeps
    today's arguments (the broker refuses a queue redeclared with another group size), and so
    does the one queue of N = 1."""
    two = Topology(exchange="ex", queue="ex.records", delivery_limit=7, shards=3, shard_replicas=2)
    assert two.queue_arguments(1) == TOPOLOGY.queue_arguments(1)
    for number in (2, 3):
        assert two.queue_arguments(number) == {
            **TOPOLOGY.queue_arguments(number),
            "x-quorum-initial-group-size": 2,
        }
    one = Topology(exchange="ex", queue="ex.records", delivery_limit=7, shard_replicas=1)
    assert one.queue_arguments() == TOPOLOGY.queue_arguments(1)
    assert "x-quorum-initial-group-size" not in TOPOLOGY.queue_arguments(2)  # 0: none


@pytest.mark.parametrize(
    ("queue", "number"),
    [
        ("ex.records", 1),
        ("ex.records.shard-2", 2),
        ("ex.records.shard-64", 64),
        ("ex.records.shard-1", None),  # shard 1 has no suffix
        ("ex.records.shard-02", None),
        ("ex.records.shard-", None),
        ("ex.records.shard-x", None),
        ("ex.records.dlq", None),
        ("other.records.shard-2", None),
    ],
)
def test_a_queue_name_gives_its_shard_number(queue: str, number: int | None) -> None:
    assert TOPOLOGY.shard_number(queue) == number


def test_the_management_api_takes_its_own_credentials_or_the_brokers() -> None:
    from consumer.tools.shards_management import Management

    amqp = "amqp://app:s%2Fecret@mq1:5672/ledger,amqp://app:s%2Fecret@mq2:5672/ledger"
    own = Management.of("https://ops:pw@mq1:15671/", amqp)
    assert own == Management("https://mq1:15671", "ops", "pw", "ledger")
    borrowed = Management.of("http://mq1:15672", amqp)
    assert borrowed == Management("http://mq1:15672", "app", "s/ecret", "ledger")
    assert Management.of("http://mq1:15672", "amqp://g:g@h:5672/").vhost == "/"
    assert Management.of("http://mq1:15672", "amqp://g:g@h:5672").vhost == "/"


@pytest.mark.parametrize("url", ["mq1:15672", "amqp://mq1:5672/", "http://", "ftp://mq1"])
def test_a_management_url_that_is_not_http_is_refused_without_echoing_it(url: str) -> None:
    from consumer.tools.shards_management import Management, ManagementUnreadable

    with pytest.raises(ManagementUnreadable, match="--management must be an http") as caught:
        Management.of(url, "amqp://g:secret@h:5672/")
    assert "secret" not in str(caught.value)
