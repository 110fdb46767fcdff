"""The flush pool without a broker or a database: its queue, its workers under the supervisor,
what a dead channel's deliveries become, and the drain at shutdown."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

from bulk_recorder.infra.backoff import Backoff
from bulk_recorder.infra.metrics import Metrics
from bulk_recorder.infra.supervisor import Supervisor
from bulk_recorder.recorder.flusher import Flusher, Pending
from consumer.flush_pool import FlushPool
from tests.conftest import wait_for


@dataclass
class FakeDelivery:
    channel: object
    released: bool = False
    delivery_count: int = 0
    received: float = 0.0

    async def release(self) -> bool:
        self.released = True
        return True


def pending(channel: object) -> Pending:
    return Pending(cast(Any, None), cast(Any, FakeDelivery(channel)))


class FakeFlusher:
    """Writes nothing; holds each batch until ``go`` is set; fails the batches in ``fail``."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.go.set()
        self.done: list[list[Pending]] = []
        self.fail: set[int] = set()

    async def process(self, batch: list[Pending], reason: str) -> None:
        await self.go.wait()
        if len(self.done) in self.fail:
            self.done.append(batch)
            raise RuntimeError("a bug in the flush")
        self.done.append(batch)


def make(size: int = 2) -> tuple[FlushPool, FakeFlusher, Supervisor]:
    supervisor = Supervisor(backoff=Backoff(base_s=0.01, cap_s=0.02))
    pool = FlushPool(Metrics(), supervisor, size)
    flusher = FakeFlusher()
    pool.start(cast(Flusher, flusher))
    return pool, flusher, supervisor


async def test_queued_batches_are_written_and_the_drain_waits_for_them() -> None:
    pool, flusher, supervisor = make()
    assert pool.alive() == 2
    for _ in range(5):
        pool.enqueue([pending("ch")], "size")
    await pool.drain(5)
    assert len(flusher.done) == 5
    await pool.stop()
    assert pool.alive() == 0
    supervisor.close()


async def test_a_dead_channels_deliveries_leave_the_queue_and_the_rest_stay() -> None:
    pool, flusher, supervisor = make(size=1)
    flusher.go.clear()  # the worker holds the first batch; the others wait in the queue
    pool.enqueue([pending("old")], "size")
    await asyncio.sleep(0)
    pool.enqueue([pending("old"), pending("new")], "size")
    pool.enqueue([pending("old")], "size")
    dropped = pool.drop(lambda p: cast(FakeDelivery, p.delivery).channel == "old")
    assert dropped == 2
    held = pool.take_all()
    assert [cast(FakeDelivery, p.delivery).channel for p in held] == ["new"]
    flusher.go.set()
    await pool.drain(5)  # join() is not left waiting for batches that were taken
    assert len(flusher.done) == 1
    await pool.stop()
    supervisor.close()


async def test_a_failed_flush_releases_its_batch_and_the_worker_goes_on() -> None:
    pool, flusher, supervisor = make(size=1)
    flusher.fail = {0}
    first = [pending("ch")]
    pool.enqueue(first, "size")
    pool.enqueue([pending("ch")], "size")
    await pool.drain(5)
    assert cast(FakeDelivery, first[0].delivery).released
    assert pool.metrics.registry.get_sample_value("bulk_recorder_messages_released_total") == 1
    assert len(flusher.done) == 2
    assert pool.restarts() == 0  # the worker caught it: nothing to restart
    await pool.stop()
    supervisor.close()


async def test_a_worker_that_ends_is_counted_missing_then_restarted() -> None:
    pool, _, supervisor = make(size=2)
    victim = supervisor.tasks("flush-worker-")[0]
    victim.cancel()
    await asyncio.gather(victim, return_exceptions=True)
    assert pool.alive() == 1
    await wait_for(lambda: pool.alive() == 2, timeout=10)
    assert pool.restarts() == 1
    await pool.stop()
    supervisor.close()
