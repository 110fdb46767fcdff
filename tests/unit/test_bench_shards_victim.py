"""Which node the shard benchmarks lose (benchmarks/bench_shards.py ``choose_victim``, also
bench_shards_partition.py): the leader of a shard, not node 1 (the probes read there), whose
node holds one recorder's consumers, else none, else the fewest. Pure logic: the real
node loss is tests/cluster/test_bench_shards.py.

Each recorder consumes every shard (three consumers) through the node it connected to, a random
one: one time in nine all three start on one node. In a shuffled make test all three were on
n3 when the benchmark killed it: every recorder lost its connection, their deliveries on the
other shards came back ready, and the other shards' drain from the kill read -64 records/s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pytest

from benchmarks.bench_shards import choose_victim

QUEUES = ["records", "records.shard-2", "records.shard-3"]
LEADERS: dict[str, str | None] = {
    "records": "n1@localhost",
    "records.shard-2": "n2@localhost",
    "records.shard-3": "n3@localhost",
}


@dataclass
class _Node:
    node: str


class _Cluster:
    """What choose_victim reads of a QuotaCluster: its nodes and their short names."""

    nodes = [_Node(f"n{k}@localhost") for k in (1, 2, 3)]

    def short(self, node: str | None) -> str:
        return "-" if node is None else node.split("@", 1)[0]


def _victim(consumers: dict[str, int], leaders: dict[str, str | None] = LEADERS) -> str:
    shard = choose_victim(cast(Any, _Cluster()), QUEUES, leaders, consumers)
    return str(leaders[QUEUES[shard]]).split("@", 1)[0]


@pytest.mark.parametrize(
    ("consumers", "victim"),
    [
        ({"n1": 3, "n2": 3, "n3": 3}, "n2"),  # one recorder a node: one of them loses it
        ({"n2": 6, "n3": 3}, "n3"),  # the node of one recorder, not of two
        ({"n2": 3, "n3": 6}, "n2"),
        ({"n1": 6, "n3": 3}, "n3"),
        ({"n3": 9}, "n2"),  # every recorder on n3: not n3, whose loss takes them all
        ({"n2": 9}, "n3"),
        ({"n1": 9}, "n3"),  # every recorder on node 1, never a victim: a node without any
        ({"unknown": -1}, "n3"),  # where the consumers are is unknown
        ({"n2": 6, "n3": 3, "n1": 0}, "n3"),
        ({"n1": 3, "n2": 6}, "n3"),  # two recorders' node or none's: none's
        ({"n1": 1, "n2": 4, "n3": 4}, "n2"),  # a recorder half reconnected: the fewest
    ],
)
def test_the_victim_holds_some_recorders_never_every_one(
    consumers: dict[str, int], victim: str
) -> None:
    assert _victim(consumers) == victim


def test_a_shard_without_a_leader_or_led_by_node_1_is_never_the_victim() -> None:
    leaders = {**LEADERS, "records.shard-3": None}
    assert _victim({"n1": 3, "n3": 6}, leaders) == "n2"
