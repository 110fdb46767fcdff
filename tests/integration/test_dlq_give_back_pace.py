"""`dlq inspect` gives the DLQ back in its order on a broker held to a share of a core while dead
letters flood in: the busy machine of CI, made on purpose. There the flood test of
test_dlq_arrivals.py found old-0849 to old-0862 given back out of order (make test, one run).

Why it broke: in a quorum queue each basic.get is a consumer of its own, so a nack of a batch of 16
is 16 returns. The channel's client of the queue (RabbitMQ 3.10.8's rabbit_fifo_client) keeps at
most 32 commands unapplied; past that it stashes returns and sends them together once under,
in an order of its own (reversed here: old-0735, old-0734, ..., old-0705). The give back waited
for the ready count to show each batch back, and a flood raises that count too: on a broker
slow to apply, the waits ended on the flood's messages, batches piled up unapplied, and the
stash reordered them (5 runs of 5 by hand on a node held to 0.3 of a core).

The flood tests' node is their own, in a cgroup of the cpu controller
(benchmarks/support/cgroups.py): filled at full speed, held to ``CORES`` while the flooders run
and the pass gives back. A pass's acks are commands of the channel too: the last test sends a
replay's to a stalled leader of the shared broker just before its give back.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage

from benchmarks.support import cgroups
from benchmarks.support.cgroups import CpuLimit
from consumer.tools import dlq_pass
from consumer.tools.dlq import inspect_dlq, replay_dlq
from tests.conftest import Broker, leader_suspended_for, wait_for
from tests.integration.test_dlq_arrivals import (
    TARGET,
    fill,
    flooding,
    ids,
    old_id,
    ready_is,
    reason,
)
from tests.rigs.rabbitmq_node import RabbitNode, available

pytestmark = [pytest.mark.rabbitmq]
# the flood tests' own node, and its CPU quota
NO_HELD_NODE = "rabbitmq-server is not installed" if not available() else cgroups.available()
needs_a_held_node = pytest.mark.skipif(NO_HELD_NODE is not None, reason=f"{NO_HELD_NODE}")

CORES = 0.3  # the node's share of a core while it floods and gives back
# The weight (cpu.shares) of the node's group and of the rest of the test's (a process outside
# any group weighs 1024). At 1024, a busy machine gave the node less than its quota, or the
# flooders too little to fill it, so the quota never bit: 0 periods throttled in make test on
# five workers, twice, once with the node weighted and the flooders not. Weighted, the node
# gets its quota and the flooders the CPU to fill it, and the command the CPU to give back as
# on a quiet machine (unweighted beside 48 busy loops, the flood grew to 155,640 while it did),
# whatever else runs.
SHARES = 64 * 1024
# The rest of the test's quota: weighted without one, the flooders (who always want CPU) and
# this process can take both cores for the flood's seconds, and every other test waits. One
# core leaves the machine the other. (Beside 8 busy loops, by hand, the loops got 64.6 CPU-s in
# the module's 55 s without it, 68.7 with it; the node was throttled either way.)
REST_CORES = 1.0
LIMIT = 500  # messages a replay takes: acks in their hundreds, each a command
STALLED_ACKS = 100  # acks sent to a stalled leader: past the 32 a channel keeps unapplied
# The stalled leader resumed this long after the give back starts (by the node: a resume
# through rabbitmqctl takes as long as the CLI starts, 3 s and more on a loaded machine), well
# inside the give back's wait for the acks (GIVE_BACK_WAIT_S, 5 s).
RESUMED_S = 1.0


@pytest.fixture
def held_node(tmp_path: Path) -> Iterator[tuple[RabbitNode, CpuLimit]]:
    with RabbitNode(f"brpace{uuid.uuid4().hex[:8]}", tmp_path / "rabbit") as node:
        assert node.proc is not None
        limit = CpuLimit(None, f"pace-{uuid.uuid4().hex[:8]}")
        try:
            limit.set_shares(SHARES)
            limit.add(node.proc.pid)
            yield node, limit
        finally:
            limit.close()


@pytest.fixture
def flood_group(held_node: tuple[RabbitNode, CpuLimit]) -> Iterator[CpuLimit]:
    """The rest of the test, weighted, held to ``REST_CORES``: this process (not its node, a
    child of it), and the flooders as they start."""
    group = CpuLimit(REST_CORES, f"flood-{uuid.uuid4().hex[:8]}")
    try:
        group.set_shares(SHARES)
        group.add(os.getpid(), descendants=False)
        yield group
    finally:
        group.close()


@pytest.fixture
async def node_broker(held_node: tuple[RabbitNode, CpuLimit], topology) -> AsyncIterator[Broker]:
    node, _ = held_node
    broker = Broker(node.url, topology)
    await broker.open()
    yield broker
    await broker.close()


@pytest.mark.parametrize("command", ["inspect", "replay"])
@needs_a_held_node
async def test_a_flood_on_a_broker_held_to_its_quota_keeps_the_dlq_in_its_order(
    make_settings,
    held_node: tuple[RabbitNode, CpuLimit],
    node_broker: Broker,
    flood_group: CpuLimit,
    monkeypatch: pytest.MonkeyPatch,
    command: str,
) -> None:
    """``inspect`` gives back every message it read; ``replay --reason --limit`` first gives
    back its survey's (at full speed), then takes ``LIMIT`` with the node held, so its acks
    are still unapplied commands of the channel as its give back starts."""
    node, limit = held_node
    settings = make_settings(rabbitmq_url=node.url)
    dlq = settings.dead_letter_queue
    olds = await fill(node_broker, dlq)
    original_give_back = dlq_pass.Kept.give_back
    before = limit.throttling()
    give_backs = 0
    out = io.StringIO()
    async with flooding(node_broker, flood_group) as flooders:
        weighted = set(flood_group.pids())
        assert {os.getpid(), *(p.pid for p in flooders.processes)} <= weighted

        async def give_back(kept: dlq_pass.Kept) -> None:
            nonlocal give_backs
            give_backs += 1
            if command == "replay" and give_backs == 1:  # the survey's
                await original_give_back(kept)
                limit.set_quota(CORES)
                return
            limit.set_quota(CORES)
            await flooders.go()
            try:
                await original_give_back(kept)
            finally:
                limit.set_quota(None)
                flooders.stop()

        monkeypatch.setattr(dlq_pass.Kept, "give_back", give_back)
        try:
            if command == "inspect":
                assert await inspect_dlq(settings, out=out) == 0
            else:
                assert await replay_dlq(settings, LIMIT, out=out, reason=TARGET) == 0
            counts = await flooders.counted()
        finally:
            limit.set_quota(None)
    monkeypatch.undo()
    held = limit.throttling() - before
    print(f"{sum(counts)} dead letters during the give back; the node held back {held}")
    assert held.throttled > 0  # the quota did hold the node back
    assert sum(counts) > len(olds)  # and the flood outran the give back
    if command == "replay":
        assert f"replayed {LIMIT} of " in out.getvalue(), out.getvalue()
        shown = {old_id(n) for n in range(len(olds)) if reason(n) == TARGET}
        olds = [i for i in olds if i not in set(sorted(shown)[:LIMIT])]
    total = len(olds) + sum(counts)
    await wait_for(lambda: ready_is(node_broker, dlq, total), timeout=120)
    assert await old_ones_in_order(node.url, dlq, total) == olds


async def old_ones_in_order(url: str, queue: str, total: int) -> list[str]:
    """The ``old-`` ids among the ``total`` messages of ``queue``, in the queue's order: a
    consumer (prefetch 1,000, acked) reads tens of thousands much faster than a basic.get each."""
    found: list[str] = []
    done = asyncio.Event()
    read = 0
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1000)
        q = await channel.declare_queue(queue, passive=True)

        async def on_message(message: AbstractIncomingMessage) -> None:
            nonlocal read
            read += 1
            if (message.message_id or "").startswith("old-"):
                found.append(message.message_id or "")
            await message.ack()
            if read == total:
                done.set()

        await q.consume(on_message)
        await asyncio.wait_for(done.wait(), timeout=120)
    return found


async def test_acks_unapplied_as_a_give_back_starts_keep_the_dlq_in_its_order(
    make_settings, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay acks each message it moved: an ack is a command of the channel too, so with
    the DLQ's Raft server suspended (a stalled leader) as the replay acks ``STALLED_ACKS`` of
    them, the channel holds more than 32 unapplied as the give back starts. Its first batch
    waits for the consumer count to show those acks applied; nacked at once, it went into the
    channel's stash with them and came back in an order of its own. (On the shared broker: the
    node resumes the server RESUMED_S after the give back starts, well inside its wait.)"""
    settings = make_settings()
    dlq = settings.dead_letter_queue
    olds = await fill(broker, dlq)
    stalled = contextlib.AsyncExitStack()
    resume_clock: list[Callable[[], Awaitable[None]]] = []
    all_read = asyncio.Event()
    original_hold, original_one = dlq_pass.hold_arrivals, dlq_pass.Pass._one
    original_give_back = dlq_pass.Kept.give_back

    async def hold_arrivals(queue: Any, kept: dlq_pass.Kept, start: int) -> bool:
        # the replay's pass (the survey's reads call it through consumer.tools.dlq's name) has
        # read every message: its acks go to a stalled leader
        in_order = await original_hold(queue, kept, start)
        resume_clock.append(
            await stalled.enter_async_context(leader_suspended_for(broker.url, dlq, RESUMED_S))
        )
        all_read.set()
        return in_order

    async def one(self: dlq_pass.Pass, *args: Any) -> None:
        await all_read.wait()
        await original_one(self, *args)

    async def give_back(kept: dlq_pass.Kept) -> None:
        for start in resume_clock:
            await start()
        await original_give_back(kept)

    monkeypatch.setattr(dlq_pass, "hold_arrivals", hold_arrivals)
    monkeypatch.setattr(dlq_pass.Pass, "_one", one)
    monkeypatch.setattr(dlq_pass.Kept, "give_back", give_back)
    out = io.StringIO()
    try:
        assert await replay_dlq(settings, STALLED_ACKS, out=out, reason=TARGET) == 0
    finally:
        await stalled.aclose()
    monkeypatch.undo()
    assert all_read.is_set()
    assert f"replayed {STALLED_ACKS} of " in out.getvalue(), out.getvalue()
    shown = sorted(old_id(n) for n in range(len(olds)) if reason(n) == TARGET)
    moved = set(shown[:STALLED_ACKS])
    assert await ids(broker, dlq) == [i for i in olds if i not in moved]
