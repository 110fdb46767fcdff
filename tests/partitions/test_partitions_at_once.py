"""Partitions all at once (issue 31): a nemesis schedule drawn from a printed seed, overlapping.

The hosted rig (tests/rigs/hosted.py): three broker nodes, PostgreSQL primary + synchronous
standby, two recorders, the relay and the API, each on a host of its own. Traffic runs all
along (API clients, and a publisher of valid, duplicate and invalid messages through every
node); meanwhile tests/partitions/nemesis.py applies its kinds (a broker node cut from its
peers, a broker node or a service isolated, one direction between a client and a broker node
lost, random halves of all hosts), overlapping as they fall. Then every node back in the
cluster, the audit (lost 0, doubled 0, balances exact, DLQ exact) and every process ready.

The seed: ``SOAK_SEED`` (one or several, comma-separated), else today's date. ``make test``
runs 30 s with three faults; ``SOAK_PARTITIONS=1`` (``make soak-partitions``) runs
``SOAK_SECONDS`` (180) with four faults a minute for ``SOAK_PARTITION_RUNS`` (2) random seeds.
The seed and schedule are printed first, the report last (and in pytest's summary).
``SOAK_SHARDS`` (default 1; ``make soak-partitions SHARDS=N``) runs every role with
``RABBITMQ_QUEUE_SHARDS=N``, the audit reading every shard.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter

import pytest

from consumer.topology import Topology
from tests.cluster.schedule import run_seeds
from tests.partitions.conftest import REPORTS, SHARDS, cluster_whole
from tests.partitions.harness import Run
from tests.partitions.nemesis import KINDS, SHORT_KINDS, Nemesis, Plan, draw
from tests.rigs.hosted import Hosted

LONG = os.environ.get("SOAK_PARTITIONS", "") not in ("", "0")
SECONDS = float(os.environ.get("SOAK_SECONDS", "180")) if LONG else 30.0
PLAN = Plan(SECONDS, max(len(KINDS), round(SECONDS / 60 * 4))) if LONG else Plan(SECONDS, 3)

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.timeout(int(SECONDS * 4 + 420)),
    # Side by side, on the namespace rig's worker: it times nothing. The node that once stayed
    # paused past the 240 s wait was stuck in OTP's global (RabbitMQ 3.10.8 on OTP 25), not
    # slowed by the CPU; cluster_whole nudges it now (tests/partitions/conftest.py, GlobalNudge).
]


def _seeds() -> list[int]:
    return run_seeds(LONG, int(os.environ.get("SOAK_PARTITION_RUNS", "2")))


@pytest.fixture
def shards() -> int:
    """This run's queue shards: SOAK_SHARDS (``hosted_topology`` makes that many)."""
    return SHARDS


def reproduce(seed: int) -> str:
    if LONG:
        return f"make soak-partitions SEED={seed}" + (f" SHARDS={SHARDS}" if SHARDS > 1 else "")
    shards = f"SOAK_SHARDS={SHARDS} " if SHARDS > 1 else ""
    return (
        f"SOAK_SEED={seed} {shards}.venv/bin/pytest -p no:cacheprovider "
        "tests/partitions/test_partitions_at_once.py"
    )


@pytest.mark.parametrize("seed", _seeds(), ids=lambda s: f"seed={s}")
async def test_partitions_all_at_once(seed: int, hosted: Hosted, hosted_topology: Topology) -> None:
    schedule = draw(seed, PLAN, None if LONG else SHORT_KINDS)
    print(f"\npartitions run, seed {seed}, {SHARDS} shard(s) (reproduce: {reproduce(seed)})")
    print(f"schedule ({len(schedule)} faults over {PLAN.seconds:.0f} s of traffic):")
    print("\n".join("  " + f.line() for f in schedule))
    run = await Run.begin(hosted, hosted_topology, seed)
    nemesis = Nemesis(hosted)
    try:
        await run.start_services()
        run.start_traffic()
        assert run.watch is not None
        await nemesis.run(schedule)
        over = nemesis.now()
        nudges = await asyncio.to_thread(cluster_whole, hosted.hosts, 240)
        whole = nemesis.now()
        await run.wait_rows(run.records() + 300, timeout=240)  # committing again
        signals = await run.counters()
        audit, unready = await run.finish(faults=len(schedule))
    except BaseException:
        await run.abort()
        raise
    at, gap, _ = run.watch.longest_stall_span_after(nemesis.t0)
    during = [a.fault.kind for a in nemesis.applied if a.began <= at + gap and a.ended + 1 >= at]
    assert run.queue is not None
    lines = [
        f"partitions run, seed {seed}, {SHARDS} shard(s): reproduce with {reproduce(seed)}",
        f"  traffic {PLAN.seconds:.0f} s; faults over at t+{over:.1f} s, every broker node "
        f"back in the cluster at t+{whole:.1f} s",
        *(f"    nudged (RabbitMQ 3.10.8 on OTP 25, stuck in global): {n}" for n in nudges),
        "  faults applied:",
        *("    " + a.line() for a in sorted(nemesis.applied, key=lambda a: a.began)),
        f"  longest stretch without a commit: {gap:.1f} s from t+{at:.1f} s"
        f" (faults then: {', '.join(during) or 'none'})",
        f"  records {run.records()}; {len(run.queue.failed_attempts)} publisher chunks sent"
        f" again; {sum(c.replays for c in run.clients)} API replays",
        f"  {audit.line()}; DLQ {audit.dlq_total} ({audit.dlq_surplus} at-least-once repeats)",
    ]
    lines += ["  metrics moved (at the end):", *(f"    {line}" for line in signals)]
    report = "\n".join(lines)
    REPORTS.append(report)
    print(report)
    assert unready == [], f"not ready at the end: {unready}"
    assert Counter(f.kind for f in schedule) == Counter(a.fault.kind for a in nemesis.applied)
    audit.assert_exact(dlq_surplus_allowed=True)
