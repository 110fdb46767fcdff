"""A RabbitMQ node cut from its two peers while both recorders and the relay are on it.

The rig (tests/rigs/hosted.py): three broker nodes, PostgreSQL primary + synchronous standby,
two recorders, the relay and the API, each on a host of its own. The recorders and the relay
are placed on mq1 (their connects to mq2 and mq3 refused while they start), and mq1 leads the
queue and its DLQ (declared through it). Traffic: the API clients, and a publisher through mq2
and mq3 (the majority side: the world outside the cut). Then mq1 is cut from mq2 and mq3 both
ways, silently, but not from its clients: the quorum queues elect leaders on the majority, and
the clients on mq1 must find their way there.

Measured and printed: what each client logged before it moved (how it noticed), when it
connected to a majority node, when the queue's leader moved, and the longest time without a
commit while records waited (published and confirmed on the majority). Then heal, the audit
(lost 0, doubled 0, balances exact, DLQ exact) and every process ready at the end.

``cluster_partition_handling`` is the rig's ``pause_minority`` (``tests/partitions/conftest.py``)
in ``make test``; ``SOAK_PARTITIONS=1`` (``make soak-partitions``) runs ``autoheal`` too, set
on every node at run time, for the comparison docs/high-availability.md states.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import pytest

from consumer.topology import Topology
from tests.conftest import wait_for
from tests.partitions.conftest import NET_TICKTIME, REPORTS, cluster_whole
from tests.partitions.harness import Run
from tests.rigs.hosted import Hosted
from tests.rigs.rabbitmq_node import RabbitNode

SOAK = os.environ.get("SOAK_PARTITIONS", "") not in ("", "0")
HANDLINGS = ["pause_minority", "autoheal"] if SOAK else ["pause_minority"]
# How long the cut lasts at most (pause_minority: until every client moved; autoheal: this long)
CUT_FOR = 40.0

pytestmark = [pytest.mark.netns, pytest.mark.slow, pytest.mark.timeout(420)]


def set_handling(node: RabbitNode, handling: str) -> None:
    node.erl(f"application:set_env(rabbit, cluster_partition_handling, {handling})")


def leaders(node: RabbitNode, queues: tuple[str, ...]) -> dict[str, str | None]:
    """Each queue's leader as ``node`` sees it (asked there: the majority's view)."""
    rows = {r["name"]: r.get("leader") for r in node.queue_rows("name", "leader", timeout=30)}
    return {q: rows.get(q) for q in queues}


async def watch_leaders(
    node: RabbitNode, queues: tuple[str, ...], moved: dict[str, float], start: float, old: str
) -> None:
    """Note when each queue's leader (asked on ``node``) is no longer ``old``."""
    while len(moved) < len(queues):
        try:
            now = await asyncio.to_thread(leaders, node, queues)
        except (RuntimeError, TimeoutError, ValueError):
            now = {}
        for queue, leader in now.items():
            if queue not in moved and isinstance(leader, str) and leader != old:
                moved[queue] = time.monotonic() - start
        await asyncio.sleep(0.5)


@pytest.mark.parametrize("handling", HANDLINGS)
async def test_a_broker_node_cut_from_its_peers_under_its_clients(
    handling: str, hosted: Hosted, hosted_topology: Topology
) -> None:
    rabbit, net = hosted.rabbit, hosted.net
    mq1, mq2 = rabbit.nodes[0], rabbit.nodes[1]
    queues = (hosted_topology.queue, hosted_topology.dead_letter_queue)
    if handling != "pause_minority":
        for node in rabbit.nodes:
            await asyncio.to_thread(set_handling, node, handling)
    run = await Run.begin(hosted, hosted_topology)
    try:
        before = await asyncio.to_thread(leaders, mq2, queues)
        await run.start_services(on="mq1")
        run.start_traffic(via=["mq2", "mq3"])
        assert run.watch is not None
        assert run.logs is not None
        await run.wait_rows(200)
        cut_at = time.monotonic()
        await asyncio.to_thread(net.cut, ["mq1"], ["mq2", "mq3"])
        moved_leaders: dict[str, float] = {}
        leader_task = asyncio.create_task(
            watch_leaders(mq2, queues, moved_leaders, cut_at, mq1.node)
        )
        clients = ("rec1", "rec2", "relay")
        logs = run.logs

        def everyone_moved() -> bool:
            return all(logs.connected_after(c, cut_at) for c in clients)

        if handling == "pause_minority":  # the cut lasts until they all moved
            with contextlib.suppress(AssertionError):
                await wait_for(everyone_moved, timeout=CUT_FOR, interval=0.2)
        else:
            await asyncio.sleep(CUT_FOR)
        heal_at = time.monotonic()
        await asyncio.to_thread(net.heal)
        with contextlib.suppress(AssertionError):  # asserted after the report
            await wait_for(everyone_moved, timeout=120, interval=0.2)
        await asyncio.to_thread(cluster_whole, hosted.hosts)
        whole_at = time.monotonic()
        leader_task.cancel()
        await asyncio.gather(leader_task, return_exceptions=True)
        await run.wait_rows(run.records() + 400)  # traffic flows again after the heal
        signals = await run.counters()
        audit, unready = await run.finish(faults=1)
    except BaseException:
        await run.abort()
        raise
    finally:
        if handling != "pause_minority":
            for node in rabbit.nodes:
                await asyncio.to_thread(set_handling, node, "pause_minority")

    at, gap, _ = run.watch.longest_stall_span_after(cut_at)
    assert run.queue is not None
    # the cut's own stretch: from the cut until the first commits after every client moved
    moves = [found[0] for c in clients if (found := logs.connected_after(c, cut_at))]
    rows_then = run.watch._before(max(moves, default=heal_at) + 3.0)
    c_at, c_gap, _ = run.watch.longest_stall_span_after(cut_at, rows_then)
    lines = [
        f"broker node cut from its peers, cluster_partition_handling = {handling}, "
        f"net_ticktime = {NET_TICKTIME}: mq1 | mq2, mq3 for {heal_at - cut_at:.1f} s",
        f"  leaders before: {before}",
        "  leaders moved off mq1 after: "
        + ", ".join(f"{q} {moved_leaders[q]:.1f} s" for q in sorted(moved_leaders))
        if moved_leaders
        else "  leaders: no move seen",
    ]
    for name in clients:
        found = logs.connected_after(name, cut_at)
        until = found[0] if found else time.monotonic()
        where = f"on {found[1]} at +{found[0] - cut_at:.1f} s" if found else "never moved"
        lines.append(f"  {name}: {where}; logged before:")
        noticed = logs.noticed(name, cut_at, until) or ["nothing"]
        lines += [f"      {line}" for line in noticed]
    lines += [
        f"  healed at +{heal_at - cut_at:.1f} s, every node running in the cluster at "
        f"+{whole_at - cut_at:.1f} s",
        f"  longest stretch without a commit: {c_gap:.1f} s from +{c_at:.1f} s until the clients"
        f" moved (or the heal, if some never did); {gap:.1f} s from +{at:.1f} s over the whole"
        " run after the cut",
        f"  records {run.records()}; {len(run.queue.failed_attempts)} publisher chunks sent again",
        f"  {audit.line()}; DLQ {audit.dlq_total} ({audit.dlq_surplus} at-least-once repeats)",
    ]
    lines += ["  metrics moved (at the end):", *(f"    {line}" for line in signals)]
    report = "\n".join(lines)
    REPORTS.append(report)
    print("\n" + report)
    assert unready == [], f"not ready at the end: {unready}"
    audit.assert_exact(dlq_surplus_allowed=True)
    if handling == "pause_minority":  # autoheal may keep them on mq1: it can win the heal
        assert all(logs.connected_after(c, cut_at) for c in clients), report
