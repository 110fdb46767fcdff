"""When ``shards prune`` takes a leftover shard's passive declare for "drained"
(consumer/tools/shards.py ``counted_shard``). RabbitMQ 3.10 gives a quorum queue's leader
250 ms to count, and answers 0 messages and 0 consumers when it does not
(rabbit_quorum_queue:stat/2): prune then deleted a shard still holding records. Pure logic: the
real slow leader is tests/cluster/test_shards.py."""

from __future__ import annotations

import pytest

from consumer.tools.shards import STAT_TIMEOUT_S, counted_shard

pytestmark = pytest.mark.private


@pytest.mark.parametrize(
    ("seconds", "drained"),
    [(STAT_TIMEOUT_S - 0.001, True), (STAT_TIMEOUT_S, False), (STAT_TIMEOUT_S + 0.001, False)],
)
def test_0_and_0_is_drained_only_when_answered_within_the_leaders_250_ms(
    seconds: float, drained: bool
) -> None:
    shard = counted_shard(4, "q.shard-4", 0, 0, seconds)
    assert shard.drained is drained
    assert shard.counted is drained
    if not drained:
        assert shard.holding() == "q.shard-4 (no count from its leader within 0.25 s)"


@pytest.mark.parametrize(("ready", "consumers"), [(1, 0), (0, 1), (7, 2)])
def test_anything_held_is_a_count_however_late(ready: int, consumers: int) -> None:
    for seconds in (0.001, STAT_TIMEOUT_S + 5):
        shard = counted_shard(4, "q.shard-4", ready, consumers, seconds)
        assert shard.counted
        assert not shard.drained
        assert shard.holding() == f"q.shard-4 ({ready} ready, {consumers} consumers)"


def test_the_leaders_time_is_rabbitmqs_250_ms() -> None:
    assert STAT_TIMEOUT_S == 0.25
