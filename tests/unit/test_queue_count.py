"""When a passive declare's answer is a count of the queue (consumer/queue_count.py). RabbitMQ
3.10 gives a quorum queue's leader 250 ms to count, and answers 0 messages and 0 consumers when
it does not (rabbit_quorum_queue:stat/2): ``shards prune`` took that for drained and deleted a
shard still holding records. Pure logic, the declare stood in for by a coroutine that answers
after a set time: the real slow leaders are tests/cluster/test_shards.py (prune) and
tests/integration/test_late_counts.py (status, the queue watch, the dlq commands)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from consumer.queue_count import (
    STAT_TIMEOUT_S,
    QueueCount,
    answered,
    consumers_below,
    count_within,
    timed_count,
)
from consumer.tools.shards import Shard

pytestmark = pytest.mark.private


@pytest.mark.parametrize(
    ("seconds", "counted"),
    [(STAT_TIMEOUT_S - 0.001, True), (STAT_TIMEOUT_S, False), (STAT_TIMEOUT_S + 0.001, False)],
)
def test_0_and_0_is_a_count_only_when_answered_within_the_leaders_250_ms(
    seconds: float, counted: bool
) -> None:
    count = answered(0, 0, seconds)
    assert count == QueueCount(0, 0, counted)
    assert count.drained is counted
    assert count.empty is counted
    assert count.reading() == (0 if counted else None)
    shard = Shard.of(4, "q.shard-4", False, count)
    assert shard.drained is counted
    if not counted:
        assert shard.holding() == "q.shard-4 (no count from its leader within 0.25 s)"
        assert shard.line().split()[3:6] == ["?", "-", "?"]


@pytest.mark.parametrize(("ready", "consumers"), [(1, 0), (0, 1), (7, 2)])
def test_anything_held_or_consumed_is_a_count_however_late(ready: int, consumers: int) -> None:
    for seconds in (0.001, STAT_TIMEOUT_S + 5):
        count = answered(ready, consumers, seconds)
        assert count.counted
        assert not count.drained
        assert count.empty is (ready == 0)
        assert count.reading() == ready
        shard = Shard.of(4, "q.shard-4", False, count)
        assert shard.holding() == f"q.shard-4 ({ready} ready, {consumers} consumers)"


def test_an_answer_without_counts_reads_as_0() -> None:
    assert answered(None, None, 0.0) == QueueCount(0, 0, True)


def test_the_leaders_time_is_rabbitmqs_250_ms() -> None:
    assert STAT_TIMEOUT_S == 0.25


@dataclass
class Answer:
    message_count: int | None
    consumer_count: int | None


class SlowDeclare:
    """Answers ``answers`` in turn, each after its delay."""

    def __init__(self, *answers: tuple[float, int, int]) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def __call__(self) -> Answer:
        delay, ready, consumers = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        await asyncio.sleep(delay)
        return Answer(ready, consumers)


async def test_the_time_taken_is_measured_around_the_declare() -> None:
    assert (await timed_count(SlowDeclare((0.0, 0, 0)))).counted
    assert not (await timed_count(SlowDeclare((STAT_TIMEOUT_S + 0.05, 0, 0)))).counted


async def test_count_within_asks_again_until_a_count_comes() -> None:
    declare = SlowDeclare((STAT_TIMEOUT_S + 0.01, 0, 0), (STAT_TIMEOUT_S + 0.01, 0, 0), (0.0, 5, 0))
    count = await count_within(declare, 5.0, pause_s=0.0)
    assert count == QueueCount(5, 0, True)
    assert declare.asked == 3


async def test_count_within_gives_up_after_its_time_with_no_count() -> None:
    declare = SlowDeclare((STAT_TIMEOUT_S + 0.01, 0, 0))
    count = await count_within(declare, 0.5, pause_s=0.0)
    assert not count.counted
    assert declare.asked == 2  # 0.26 s, then 0.52 s: past 0.5 s, no third ask


def test_the_dlq_commands_ask_for_5_s_as_docs_reference_md_says() -> None:
    from consumer.tools.dlq_pass import DLQ_COUNT_WAIT_S

    assert DLQ_COUNT_WAIT_S == 5.0


@pytest.mark.parametrize(("consumers", "below"), [(1, True), (2, False), (3, False)])
async def test_consumers_below_its_bound_and_only_below_it(consumers: int, below: bool) -> None:
    """N-1, N, N+1 against a bound of 2: only fewer than the bound ends the wait."""
    declare = SlowDeclare((0.0, 0, consumers))
    assert await consumers_below(declare, 2, 0.05, pause_s=0.0) is below
    assert declare.asked == 1 if below else declare.asked > 1


async def test_consumers_below_skips_what_is_no_count() -> None:
    """A late 0 and 0 is not 0 consumers: the wait goes on to the next real count."""
    declare = SlowDeclare((STAT_TIMEOUT_S + 0.01, 0, 0), (0.0, 5, 1))
    assert await consumers_below(declare, 2, 5.0, pause_s=0.0)
    assert declare.asked == 2
    declare = SlowDeclare((STAT_TIMEOUT_S + 0.01, 0, 0))
    assert not await consumers_below(declare, 2, 0.3, pause_s=0.0)


def test_the_close_waits_5_s_at_most_for_its_acks_to_be_applied() -> None:
    from consumer.last_acks import LAST_ACKS_LINGER_S, LAST_ACKS_WAIT_S

    assert (LAST_ACKS_WAIT_S, LAST_ACKS_LINGER_S) == (5.0, 0.2)
