"""benchmarks/support/quota_cluster.py: which node holds each consumer, on the rig's own cluster
(every node on 127.0.0.1, a port of its own) and on the namespace rig (every node on port 5672,
an address of its own), from rabbitmqctl's rows; nothing is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.support.quota_cluster import QuotaCluster
from tests.rigs.netns import Host
from tests.rigs.rabbitmq_cluster import RabbitCluster

Rows = list[dict[str, object]]
QUEUES = ["q.records", "q.records.shard-2", "q.records.shard-3"]


def tally(cluster: RabbitCluster, channels: Rows, consumers: Rows) -> dict[str, int]:
    """``QuotaCluster.consumers`` on rows given as rabbitmqctl would print them."""
    quota = QuotaCluster(Path("unused"), 0.1, rig=cluster)
    rows = {"list_channels": channels, "list_consumers": consumers}

    def ctl_rows(command: str, *columns: str) -> Rows:
        return rows[command]

    quota._ctl_rows = ctl_rows  # type: ignore[method-assign]
    return quota.consumers(QUEUES)


def channel(pid: str, client: str, server: str) -> dict[str, object]:
    return {"pid": pid, "name": f"{client} -> {server} (1)"}


def consumer(queue: str, pid: str) -> dict[str, object]:
    return {"queue_name": queue, "channel_pid": pid}


@pytest.mark.parametrize("queue", QUEUES)
def test_on_the_namespace_rig_the_address_tells_the_nodes_apart(queue: str) -> None:
    hosts = [Host(f"mq{i}", f"ns-mq{i}", f"10.47.0.{10 + i}") for i in (1, 2, 3)]
    cluster = RabbitCluster(Path("unused"), hosts=hosts)  # every node on port 5672
    channels = [
        channel("<a.1>", "10.47.0.14:40001", "10.47.0.11:5672"),
        channel("<b.1>", "10.47.0.15:40002", "10.47.0.12:5672"),
        channel("<b.2>", "10.47.0.16:40003", "10.47.0.12:5672"),
    ]
    consumers = [consumer(queue, pid) for pid in ("<a.1>", "<b.1>", "<b.2>")]
    consumers.append(consumer("another.queue", "<a.1>"))
    assert tally(cluster, channels, consumers) == {"n1": 1, "n2": 2}


def test_on_the_rigs_own_cluster_the_port_does() -> None:
    cluster = RabbitCluster(Path("unused"))
    n1, _, n3 = cluster.nodes
    channels = [
        channel("<a.1>", "127.0.0.1:40001", f"127.0.0.1:{n1.amqp_port}"),
        channel("<c.1>", "127.0.0.1:40002", f"127.0.0.1:{n3.amqp_port}"),
    ]
    consumers = [consumer(q, pid) for q in QUEUES for pid in ("<a.1>", "<c.1>")]
    assert tally(cluster, channels, consumers) == {"n1": 3, "n3": 3}
