"""Queue shards under per-node CPU quotas: records recorded per second at N = 1 and at N = 3
with the same recorders, and the other shards' drain while one node is lost (issue 41).

    python -m benchmarks.bench_shards                  # 3 rounds of N = 1 / N = 3, then a node kill
    python -m benchmarks.bench_shards --quick          # seconds, small counts (the test's run)
    python -m benchmarks.bench_shards --shard-replicas 0 1 2 --no-kill
                                       # N = 3 also with shards 2-3 at 1 and at 2 replicas
    python -m benchmarks.bench_shards --nodes 5 --node-cpus 0.15 --shard-replicas 0 3 --no-kill

A three-node cluster of the rig (tests/rigs/rabbitmq_cluster.py, the ``rabbitmq_random_exchange``
plugin on every node), each node in a cgroup of its own with ``--node-cpus`` cores (a CFS quota,
what a container's ``limits.cpu`` is) and a high cpu.shares (``--node-shares``), so that on this
shared two-core machine the nodes get their quota whenever they can use it and the quota, not
the machine, is their limit. The recorders share one cgroup of the same weight without a quota
(``--recorder-shares``). The quota is on only while a run is measured; the queues are filled and
cleaned up without it. Each measured run, on fresh names and a fresh database:

1. the topology with N shards declared on node 1 (shard 1 and the DLQ lead there; shards
   2..N are placed by ``x-queue-leader-locator: balanced``), each shard's leader printed;
2. ``--recorders`` recorder processes started with ``RABBITMQ_QUEUE_SHARDS=N``, recorder i
   connected to node i (mod 3), and once consuming held with SIGSTOP (their start-up is not
   measured), while ``--count`` records are published (confirmed, one publisher a node);
3. the quotas on, the recorders let go together (SIGCONT), the shards drained: the rate is the
   sum of their acks from the first 1% to the last, as bench_scale's; over the same window,
   each node's CPU against its quota (and the share of CFS periods the quota held it back),
   the recorders', PostgreSQL's and the machine's.

N = 1 and N = 3 alternate (the order swaps each round); the ratio is taken in each round.
With ``--shard-replicas``, N = 3 is measured once a round for each value given
(``RABBITMQ_QUEUE_SHARD_REPLICAS``: shards 2-3 with that many members, 0 a member on every
node), the order rotating by one each round. RabbitMQ 3.10 makes a new quorum queue's first
member the node its declaring client is on, so with fewer replicas than nodes shard k is
declared first through node k (:func:`place_shards`); each run prints every shard's members.
``--nodes`` sets the cluster's size (recorder i is still connected to node i). Where
the ratio is short of the issue's 2.2x, the run says what was full (a node at its quota, a
recorder process at one core, the machine's cores), and what the nodes' CPU per record allows:
with N = 1's CPU per record, the rate of the three quotas, against N = 1's.

Then the node kill, at N = 3: the recorders given every node's URL (each starts at a random
one and moves on when it loses it), held while the shards are filled with ``--kill-count``
records, let go, and the shards' ready counts read every 0.25 s on a connection to node 1.
After ``--window`` seconds of drain, the leader of one shard (not node 1, and a node a recorder
is connected to if there is one) gets SIGKILL; the gap is from the kill until that shard
drains again (a new leader elected, its consumers back). The other shards' drain rate during
the gap and over the ``--window`` seconds from the kill, against the ``--window`` seconds before
(target >= 0.8x), and which shards' leaders moved (only the killed node's should). The same
measurement with the node cut off by a network partition, then healed and audited:
benchmarks/bench_shards_partition.py, on the namespace rig.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import re
import shlex
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import aiormq

from benchmarks.support import cgroups
from benchmarks.support.cgroups import Throttling
from benchmarks.support.env import add_recorder_arguments, database_url, run_main, unique
from benchmarks.support.machine import PgCpu, facts_table, machine_facts
from benchmarks.support.quota_cluster import NodeUse, QuotaCluster, Sample
from benchmarks.support.recorder import RecorderConfig, RecorderProcess, drain
from benchmarks.support.services import count_rows, temp_database
from benchmarks.support.stats import Stat, emit, progress, ratio, save_json, table
from consumer.queue_count import timed_count
from consumer.tools.loadgen import LoadReport, LoadSpec, publish_load
from consumer.topology import Topology, delete_topology
from tests.rigs.topology import declare_through

TABLE = {"transaction": "transactions", "credit_annotation": "credit_annotations"}
TARGET_RATIO = 2.2
TARGET_KILL = 0.8
FULL = 0.9  # a resource at 90% of its limit or more counts as full
PROBE_S = 0.25


@dataclass
class Run:
    """One measured drain at N shards."""

    shards: int
    round: int
    rate: float
    seconds: float
    leaders: dict[str, str]
    nodes: dict[str, NodeUse]
    recorder_cores: list[float]
    pg_cores: float
    machine_cores: float
    replicas: int = 0  # RABBITMQ_QUEUE_SHARD_REPLICAS of the run (0: a member on every node)
    members: dict[str, str] = field(default_factory=dict)  # each shard's member nodes: n1+n2
    assigned: bool = False  # recorder i consumed shard i only (RABBITMQ_QUEUE_SHARDS_CONSUMED)

    @property
    def config(self) -> Config:
        return Config(self.shards, self.replicas, self.assigned)

    @property
    def node_us(self) -> float:
        """The nodes' CPU per record recorded, microseconds (all nodes together)."""
        return sum(u.cores for u in self.nodes.values()) / self.rate * 1e6

    def node_us_each(self) -> dict[str, float]:
        """Each node's CPU per record recorded, microseconds."""
        return {name: use.cores / self.rate * 1e6 for name, use in self.nodes.items()}

    def bounds(self, nproc: int, quota: float) -> list[str]:
        """What was at (or near) its limit during the window."""
        out = [
            f"node {name} at {use.of_quota:.0%} of its {quota:g}-core quota "
            f"(held back in {use.throttling.share:.0%} of periods)"
            for name, use in self.nodes.items()
            if use.of_quota >= FULL
        ]
        out += [
            f"recorder {i + 1} at {cores:.2f} core"
            for i, cores in enumerate(self.recorder_cores)
            if cores >= FULL
        ]
        if self.machine_cores >= FULL * nproc:
            out.append(f"the machine: {self.machine_cores:.2f} of its {nproc} cores busy")
        return out


@dataclass(frozen=True, slots=True, order=True)
class Config:
    """A measured configuration: N shards, shards 2..N with ``replicas`` members (0: every
    node's, the default)."""

    shards: int
    replicas: int = 0
    assigned: bool = False  # recorder i consumes shard i only, on node i

    @property
    def label(self) -> str:
        label = f"N = {self.shards}"
        if self.shards > 1 and self.replicas:
            plural = "" if self.replicas == 1 else "s"
            label += f", shards 2-{self.shards} at {self.replicas} replica{plural}"
        if self.assigned:
            label += ", recorder k on shard k"
        return label

    def consumed(self, recorder: int) -> dict[str, str]:
        """The recorder's RABBITMQ_QUEUE_SHARDS_CONSUMED (``recorder`` from 0), if assigned."""
        if not self.assigned:
            return {}
        return {"RABBITMQ_QUEUE_SHARDS_CONSUMED": str(recorder % self.shards + 1)}


def make_topology(shards: int, replicas: int = 0) -> Topology:
    name = unique("bench_shards")
    return Topology(
        exchange=name,
        queue=name + ".records",
        delivery_limit=5,
        shards=shards,
        shard_replicas=replicas,
    )


async def delete(url: str, topology: Topology) -> None:
    connection = await aio_pika.connect(url, timeout=30)
    try:
        left = await delete_topology(connection, topology, wait_s=120)
    finally:
        await connection.close()
    for what in left:
        print(f"warning: could not delete {what}", file=sys.stderr)


async def ready_counts(url: str, topology: Topology) -> list[int]:
    connection = await aio_pika.connect(url, timeout=30)
    try:
        channel = await connection.channel()
        counts = []
        for queue in topology.shard_queues():
            declared = await channel.declare_queue(queue, passive=True)
            counts.append(int(declared.declaration_result.message_count or 0))
        return counts
    finally:
        await connection.close()


async def fill(
    cluster: QuotaCluster, topology: Topology, args: argparse.Namespace, count: int, held: int = 0
) -> list[LoadReport]:
    """``count`` records published with confirms, one publisher a node; waits until the shards
    show them ready (a quorum queue confirms before it counts), but for the ``held`` at most
    that the consumers' prefetch took already. Returns each publisher's report."""
    nodes = cluster.nodes
    began = time.monotonic()
    share = [count // len(nodes) + (i < count % len(nodes)) for i in range(len(nodes))]
    reports = await asyncio.gather(
        *(
            publish_load(
                cluster.url(i), topology.exchange, LoadSpec(args.type, n, seed=args.seed + i)
            )
            for i, n in enumerate(share)
        )
    )
    deadline = time.monotonic() + 120
    while sum(counts := await ready_counts(cluster.url(0), topology)) < count - held:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {counts} of {count} records ready in the shards")
        await asyncio.sleep(0.2)
    progress(f"  filled: {counts} ready in {time.monotonic() - began:.1f} s")
    return list(reports)


def recorder_config(
    args: argparse.Namespace, shards: int, url: str, replicas: int = 0, **env: str
) -> RecorderConfig:
    return RecorderConfig(
        args.workers,
        args.prefetch,
        args.size,
        args.timeout_ms,
        extra_env={
            "RABBITMQ_URL": url,
            "RABBITMQ_QUEUE_SHARDS": str(shards),
            "RABBITMQ_QUEUE_SHARD_REPLICAS": str(replicas),
            **env,
        },
    )


async def measure_drain(
    cluster: QuotaCluster, args: argparse.Namespace, config: Config, round_: int
) -> Run:
    shards = config.shards
    topology = make_topology(shards, config.replicas)
    first = cluster.url(0)
    await place_shards(cluster, topology)
    await declare_through(first, topology)
    try:
        leaders = await cluster.leaders(topology.shard_queues())
        members = await shard_members(cluster, topology)
        progress(
            f"  {config.label}: leaders {describe_leaders(cluster, leaders)}; replicas {members}"
        )
        async with temp_database("bench_shards") as (dsn, name):
            nodes = cluster.nodes
            recorders = [
                RecorderProcess(
                    dsn,
                    topology,
                    recorder_config(
                        args,
                        shards,
                        nodes[i % len(nodes)].url,
                        config.replicas,
                        **config.consumed(i),
                    ),
                )
                for i in range(args.recorders)
            ]
            try:
                await held_while_filled(cluster, args, topology, recorders, args.count)
                try:
                    run = await _drain(
                        cluster, args, topology, recorders, dsn, name, leaders, round_
                    )
                    return dataclasses.replace(run, members=members, assigned=config.assigned)
                finally:
                    cluster.limit(False)
            finally:
                stop_all(recorders)
    finally:
        await delete(first, topology)


async def held_while_filled(
    cluster: QuotaCluster,
    args: argparse.Namespace,
    topology: Topology,
    recorders: list[RecorderProcess],
    count: int,
    before_release: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """The recorders up and consuming (their start-up's CPU out of the window), held with
    SIGSTOP while ``count`` records are published (and ``before_release`` runs), then the quotas
    on and every recorder let go at once (SIGCONT)."""
    await asyncio.gather(*(r.wait_ready() for r in recorders))
    for r in recorders:
        cluster.add_recorder(r.pid)
        os.kill(r.pid, signal.SIGSTOP)
    try:
        progress(f"  recorders ready and held; filling {count:,}")
        prefetch = recorder_config(args, topology.shards, "").channel_prefetch
        await fill(cluster, topology, args, count, held=len(recorders) * topology.shards * prefetch)
        if before_release is not None:
            await before_release()
        cluster.limit(True)
    finally:
        for r in recorders:
            os.kill(r.pid, signal.SIGCONT)


def stop_all(recorders: list[RecorderProcess]) -> None:
    codes = [r.stop() for r in recorders]
    if any(codes):
        raise RuntimeError(f"recorder exit codes {codes}")


async def _drain(
    cluster: QuotaCluster,
    args: argparse.Namespace,
    topology: Topology,
    recorders: list[RecorderProcess],
    dsn: str,
    name: str,
    leaders: dict[str, str | None],
    round_: int,
) -> Run:
    samples: list[tuple[float, float, Sample, list[float]]] = []

    def on_sample(now: float, acked: float, _rss: list[float]) -> None:
        samples.append((now, acked, cluster.sample(), [r.cpu_seconds() for r in recorders]))

    result = await drain(
        recorders, args.count, PgCpu(database_url(), name), poll_s=0.1, on_sample=on_sample
    )
    rows = await count_rows(dsn, TABLE[args.type])
    if rows != args.count:
        raise RuntimeError(f"{rows} rows recorded, {args.count} published")
    start = next(s for s in samples if s[1] >= max(1, args.count // 100))
    end = samples[-1]
    seconds = end[2].at - start[2].at
    return Run(
        shards=topology.shards,
        replicas=topology.shard_replicas,
        round=round_,
        rate=result.rate,
        seconds=result.seconds,
        leaders={q: cluster.short(leader) for q, leader in leaders.items()},
        nodes={cluster.short(n): u for n, u in end[2].use_since(start[2], args.node_cpus).items()},
        recorder_cores=[(b - a) / seconds for a, b in zip(start[3], end[3], strict=True)],
        pg_cores=result.pg_cpu_s / result.seconds,
        machine_cores=end[2].machine_cores_since(start[2]),
    )


async def place_shards(cluster: QuotaCluster, topology: Topology) -> None:
    """With fewer replicas than nodes, RabbitMQ 3.10 gives a new quorum queue the node its
    declaring client is connected to as the first member and picks the others at random (the
    leader locator chooses only among those), so one declaring connection would put every shard
    2..N on node 1. Each such shard k is declared first through node k (counted round the
    nodes), with the topology's own arguments; declaring the topology then finds it in place."""
    if not topology.shard_replicas:
        return
    nodes = cluster.nodes
    for number in range(2, topology.shards + 1):
        connection = await aio_pika.connect(cluster.url((number - 1) % len(nodes)), timeout=30)
        try:
            channel = await connection.channel()
            await channel.declare_queue(
                topology.shard_queue(number),
                durable=True,
                arguments=topology.queue_arguments(number),
            )
        finally:
            await connection.close()


async def shard_members(cluster: QuotaCluster, topology: Topology) -> dict[str, str]:
    """Each shard's member nodes, ``n1+n2``, by ``shard k`` (one rabbitmqctl call, in a
    thread)."""
    statuses = await asyncio.to_thread(cluster.cluster.queue_statuses)
    return {
        f"shard {k}": "+".join(sorted(cluster.short(m) for m in statuses[q].members))
        if q in statuses
        else "-"
        for k, q in enumerate(topology.shard_queues(), 1)
    }


def describe_leaders(cluster: QuotaCluster, leaders: dict[str, str | None]) -> str:
    return ", ".join(f"shard {k} on {cluster.short(v)}" for k, v in enumerate(leaders.values(), 1))


# -- the node kill ---------------------------------------------------------------------------


@dataclass
class Timeline:
    """The shards' ready counts (None: the probe got no answer in time) and the nodes' CPU."""

    points: list[tuple[float, list[int | None], Sample]] = field(default_factory=list)

    def count_at(self, at: float, shard: int, after: bool = False) -> tuple[float, int] | None:
        """The sample of ``shard`` nearest ``at`` (the first at or after it with ``after``,
        else the last at or before it) that has a count."""
        points = self.points if after else list(reversed(self.points))
        for t, counts, _ in points:
            if (t >= at if after else t <= at) and counts[shard] is not None:
                return t, int(counts[shard] or 0)
        return None

    def rate(self, shards: list[int], t0: float, t1: float) -> float:
        """Records/s the ``shards`` (0-based) drained together from ``t0`` to ``t1``."""
        total = 0.0
        for k in shards:
            a = self.count_at(t0, k, after=True)
            b = self.count_at(t1, k)
            if a is None or b is None or b[0] <= a[0]:
                return float("nan")
            total += (a[1] - b[1]) / (b[0] - a[0])
        return total

    def sample_at(self, at: float, before: bool = False) -> Sample:
        """The sample nearest ``at`` (with ``before``, the last one before it)."""
        if before:
            return [p for p in self.points if p[0] <= at][-1][2]
        return min(self.points, key=lambda p: abs(p[0] - at))[2]


async def probe(
    cluster: QuotaCluster, url: str, topology: Topology, timeline: Timeline, stop: asyncio.Event
) -> None:
    """Every PROBE_S, each shard's ready count by a passive declare on a channel of its own
    (a shard without a leader answers late or not at all, or with no reading: None)."""
    connection = await aio_pika.connect(url, timeout=30)
    channels: dict[str, aio_pika.abc.AbstractChannel] = {}

    async def one(queue: str) -> int | None:
        try:
            if queue not in channels or channels[queue].is_closed:
                channels[queue] = await connection.channel()
            channel = channels[queue]

            async def declare() -> aiormq.spec.Queue.DeclareOk:
                return (await channel.declare_queue(queue, passive=True)).declaration_result

            # a 0 and 0 its leader answered late is no reading (consumer/queue_count.py)
            return (await asyncio.wait_for(timed_count(declare), 1.0)).reading()
        except (TimeoutError, aio_pika.exceptions.AMQPError):
            channels.pop(queue, None)
            return None

    try:
        while not stop.is_set():
            began = time.monotonic()
            counts = await asyncio.gather(*(one(q) for q in topology.shard_queues()))
            timeline.points.append((time.monotonic(), list(counts), cluster.sample()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, PROBE_S - (time.monotonic() - began)))
    finally:
        await connection.close()


async def node_kill(cluster: QuotaCluster, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    topology = make_topology(3)
    nodes = cluster.nodes
    await declare_through(cluster.url(0), topology)
    queues = topology.shard_queues()
    before = await cluster.leaders(queues)
    progress(f"node kill: leaders {describe_leaders(cluster, before)}")
    timeline = Timeline()
    async with temp_database("bench_shards") as (dsn, _name):
        config = recorder_config(args, 3, cluster.cluster.rabbitmq_url, LOG_LEVEL="INFO")
        logfiles = [logs / f"kill-recorder-{i + 1}.log" for i in range(args.recorders)]
        recorders = [RecorderProcess(dsn, topology, config, log_path=p) for p in logfiles]
        stop = asyncio.Event()
        task: asyncio.Task[None] | None = None
        try:
            consumers: list[dict[str, int]] = []

            async def where() -> None:
                try:
                    consumers.append(await asyncio.to_thread(cluster.consumers, queues))
                except RuntimeError as exc:  # reported, not fatal: the drain is measured
                    progress(f"  where the consumers are is unknown: {exc}")
                    consumers.append({"unknown": -1})

            await held_while_filled(cluster, args, topology, recorders, args.kill_count, where)
            victim_shard = choose_victim(cluster, queues, before, consumers[0])
            victim = cluster.cluster.node(before[queues[victim_shard]] or nodes[-1].node)
            others = [k for k in range(len(queues)) if before[queues[k]] != victim.node]
            task = asyncio.create_task(probe(cluster, cluster.url(0), topology, timeline, stop))
            await asyncio.sleep(1.0 + args.window)  # a second to settle, then the window before
            progress(f"node kill: SIGKILL {victim.name}, the leader of shard {victim_shard + 1}")
            killed_at = time.monotonic()
            await asyncio.to_thread(cluster.cluster.kill, victim)
            resumed_at = await wait_resumed(
                timeline, victim_shard, killed_at, args.gap_max, args.window
            )
            await asyncio.sleep(max(0.0, killed_at + args.window - time.monotonic()) + PROBE_S)
            stop.set()  # measured: where the consumers are now
            await where()
        finally:
            stop.set()
            if task is not None:
                await task
            cluster.limit(False)
            stop_all(recorders)
    after = await cluster.leaders(queues)
    return kill_report(
        cluster, args, timeline, queues, (before, after), victim, victim_shard, others,
        (killed_at, resumed_at), logfiles, consumers,
    )  # fmt: skip


def choose_victim(
    cluster: QuotaCluster,
    queues: list[str],
    leaders: dict[str, str | None],
    consumers: dict[str, int],
) -> int:
    """The shard whose leader to kill: not node 1's (the probes read there), and one whose
    node holds one recorder's consumers (a consumer a shard) if any does, so that a recorder
    loses its connection and the others drain on; else one whose node holds none; else the
    one holding fewest. Each recorder starts at a random node, so one time in nine all three
    are on one: killing that node took every recorder, and the other shards' drain from the
    kill read as their deliveries coming back (-64 records/s)."""
    first = cluster.nodes[0].node
    candidates = [k for k, q in enumerate(queues) if leaders[q] not in (None, first)]
    if not candidates:
        return len(queues) - 1

    def held(k: int) -> int:
        return max(0, consumers.get(cluster.short(leaders[queues[k]]), 0))

    one = [k for k in candidates if held(k) == len(queues)]
    none = [k for k in candidates if held(k) == 0]
    if one:
        return one[0]
    if none:
        return none[-1]
    return min(candidates, key=held)


async def wait_resumed(
    timeline: Timeline, shard: int, killed_at: float, limit: float, window: float
) -> float | None:
    """When ``shard`` drains again after the kill: the first of three samples in a row, each
    lower than the one before, the last half a second's drain (at its rate in the window
    before) below the highest it showed since the kill. A follower may still apply a few
    entries committed before the kill (one drop, then nothing), and the deliveries its lost
    consumers held come back to it first (a rise). A shard whose rest (at least a step) goes
    within one probe, to 0, drains again at the sample before. None if not within ``limit`` s."""
    rate = timeline.rate([shard], killed_at - window, killed_at)
    step = max(20.0, 0.5 * rate) if rate == rate else 20.0
    highest = -1
    seen = 0
    run: list[tuple[float, int]] = []  # the samples of the current decline
    while time.monotonic() < killed_at + limit:
        for t, counts, _ in timeline.points[seen:]:
            seen += 1
            count = counts[shard]
            if t <= killed_at or count is None:
                continue
            run = [*run, (t, count)] if run and count < run[-1][1] else [(t, count)]
            if len(run) >= 3 and count <= highest - step:
                return run[-3][0]
            if count == 0 and len(run) >= 2 and run[-2][1] >= step:
                return run[-2][0]  # what was left went within one probe
            highest = max(highest, count)
        await asyncio.sleep(PROBE_S / 2)
    return None


def reconnects(logfiles: list[Path]) -> list[int]:
    """How many times each recorder consumed again on a new connection (its INFO log)."""
    out = []
    for path in logfiles:
        text = path.read_text(errors="replace") if path.exists() else ""
        out.append(max(0, text.count("consumer.consuming: consuming from") - 1))
    return out


def kill_report(
    cluster: QuotaCluster,
    args: argparse.Namespace,
    timeline: Timeline,
    queues: list[str],
    leaders: tuple[dict[str, str | None], dict[str, str | None]],
    victim: Any,
    victim_shard: int,
    others: list[int],
    times: tuple[float, float | None],
    logfiles: list[Path],
    consumers: list[dict[str, int]],
    event: str = "kill",
) -> dict[str, Any]:
    """The node's loss in figures; ``event``: how it was lost (a key of :data:`EVENTS`)."""
    killed_at, resumed_at = times
    w = args.window
    before = timeline.rate(others, killed_at - w, killed_at)
    gap = (resumed_at - killed_at) if resumed_at is not None else float("nan")
    during = timeline.rate(others, killed_at, resumed_at) if resumed_at else float("nan")
    after = timeline.rate(others, killed_at, killed_at + w)
    s0, s1 = timeline.sample_at(killed_at - w), timeline.sample_at(killed_at, before=True)
    s2 = timeline.sample_at(killed_at + w)
    moved = [q for q in queues if leaders[0][q] != leaders[1][q]]
    shards = range(len(queues))
    expected = [q for q in queues if leaders[0][q] == victim.node]
    last_counts = timeline.points[-1][1] if timeline.points else []
    return {
        "event": event,
        "victim": cluster.short(victim.node),
        "victim_shard": victim_shard + 1,
        "other_shards": [k + 1 for k in others],
        "leaders_before": {q: cluster.short(v) for q, v in leaders[0].items()},
        "leaders_after": {q: cluster.short(v) for q, v in leaders[1].items()},
        "moved": moved,
        "only_victims_moved": moved == expected,
        "gap_s": gap,
        "rate_before": before,
        "rate_gap": during,
        "rate_after": after,
        "ratio_gap": during / before if before else float("nan"),
        "ratio_after": after / before if before else float("nan"),
        "per_shard_before": [timeline.rate([k], killed_at - w, killed_at) for k in shards],
        "per_shard_after": [timeline.rate([k], killed_at, killed_at + w) for k in shards],
        "nodes_before": {cluster.short(n): u for n, u in s1.use_since(s0, args.node_cpus).items()},
        "nodes_after": {cluster.short(n): u for n, u in s2.use_since(s1, args.node_cpus).items()},
        "machine_before": s1.machine_cores_since(s0),
        "machine_after": s2.machine_cores_since(s1),
        "consumers_before": consumers[0] if consumers else {},
        "consumers_after": consumers[1] if len(consumers) > 1 else {},
        "reconnects": reconnects(logfiles),
        "left_in_shards": last_counts,
        "ran_dry": [k + 1 for k in others if last_counts and (last_counts[k] or 0) == 0],
    }  # fmt: skip


# -- output ----------------------------------------------------------------------------------


def config_key(config: Config) -> str:
    """``1``, ``3`` (every node a replica), ``3r1`` (shards 2..3 at one replica): JSON keys."""
    key = f"{config.shards}" + (f"r{config.replicas}" if config.replicas else "")
    return key + ("a" if config.assigned else "")


def emit_runs(runs: list[Run], args: argparse.Namespace, nproc: int) -> dict[str, Any]:
    configs = sorted({run.config for run in runs})
    rates = {c: Stat() for c in configs}
    for run in runs:
        rates[run.config].add(run.rate)
    base = Config(1)
    ratios = {c: ratio(rates[c], rates[base]) for c in configs if c != base}
    rows = []
    for run in runs:
        nodes = ", ".join(f"{n} {u.describe()}" for n, u in run.nodes.items())
        rows.append((
            run.round, run.config.label, f"{run.rate:,.0f}", f"{run.seconds:.1f}",
            " ".join(run.leaders.values()), " ".join(str(m) for m in run.members.values()),
            nodes, f"{run.node_us:.0f}",
            " ".join(f"{c:.2f}" for c in run.recorder_cores), f"{run.pg_cores:.2f}",
            f"{run.machine_cores:.2f}", "; ".join(run.bounds(nproc, args.node_cpus)) or "none",
        ))  # fmt: skip
    emit(
        f"Each run ({args.count:,} {args.type} records, {args.recorders} recorders, node quota "
        f"{args.node_cpus:g} core; CPU in cores over the measured window)",
        table(
            ["round", "configuration", "records/s", "s", "shard leaders", "shard replicas",
             "node CPU (of quota, throttled)", "nodes' CPU us/record", "recorders' CPU",
             "PostgreSQL", "machine", "at its limit"],
            rows,
        ),
    )  # fmt: skip
    main = Config(3) if Config(3) in ratios else next(iter(ratios))
    median_ratio = ratios[main].median
    verdict = "met" if median_ratio >= TARGET_RATIO else "missed"
    summary_rows = [(base.label, rates[base].fmt(), "", "")]
    for config, values in ratios.items():
        met = "met" if values.median >= TARGET_RATIO else "missed"
        summary_rows.append((config.label, rates[config].fmt(), values.fmt(2, "x"), met))
    emit(
        f"N = 1 against N = 3 (median (min-max) of {args.rounds} rounds, ratio in each round)",
        table(["", "records/s", "ratio to N = 1", f"target >= {TARGET_RATIO}x"], summary_rows),
    )
    bounds = {
        c: [b for run in runs if run.config == c for b in run.bounds(nproc, args.node_cpus)]
        for c in configs
    }
    for config in configs:
        measured = sum(run.config == config for run in runs)
        print(f"what bounds {config.label}: {summarise(bounds[config], measured)}")
    ceiling = emit_ceiling(runs, args, main)
    per_node = emit_per_node(runs, args, configs)
    return {
        "ceiling": ceiling,
        "per_node": per_node,
        "rates": {config_key(c): s.values for c, s in rates.items()},
        "ratios": ratios[main].values,
        "ratios_by_config": {config_key(c): s.values for c, s in ratios.items()},
        "median_ratio": median_ratio,
        "verdict": verdict,
        "bounds_n1": bounds[base],
        "bounds_n3": bounds[main],
    }


def emit_ceiling(runs: list[Run], args: argparse.Namespace, main: Config) -> dict[str, float]:
    """What the nodes' CPU per record allows: with every node at its quota and the CPU per
    record of N = 1, the records/s of the nodes' quotas together, against N = 1's rate; and how
    much more a shard's leader spends than the other nodes at N = 1."""
    one = [r for r in runs if r.shards == 1]
    three = [r for r in runs if r.config == main]
    us1 = statistics.median(r.node_us for r in one)
    us3 = statistics.median(r.node_us for r in three)
    quotas = args.node_cpus * len(one[0].nodes)
    at_quotas = quotas / us1 * 1e6
    rate1 = statistics.median(r.rate for r in one)
    leader_share = statistics.median(_leader_share(r) for r in one)
    print(
        f"the nodes' CPU per record: N = 1 {us1:.0f} us, {main.label} {us3:.0f} us (medians). "
        f"At N = 1 the leader's node spent {leader_share:.2f}x the mean of the others. With "
        f"N = 1's CPU per record, the {len(one[0].nodes)} quotas ({quotas:g} core) carry at most "
        f"{at_quotas:,.0f} records/s: {at_quotas / rate1:.2f}x N = 1's rate; with "
        f"{main.label}'s, {quotas / us3 * 1e6 / rate1:.2f}x",
        flush=True,
    )
    return {
        "node_us_n1": us1,
        "node_us_n3": us3,
        "leader_share_n1": leader_share,
        "ratio_at_quotas_n1_cost": at_quotas / rate1,
        "ratio_at_quotas_n3_cost": quotas / us3 * 1e6 / rate1,
    }


def emit_per_node(
    runs: list[Run], args: argparse.Namespace, configs: list[Config]
) -> dict[str, dict[str, float]]:
    """Each node's CPU per record recorded (medians over the rounds), and what it allows: the
    node that spends the most per record reaches its quota first, so the configuration carries
    at most ``quota / its CPU per record``, against N = 1's rate measured."""
    rate1 = statistics.median(r.rate for r in runs if r.config == Config(1))
    names = list(runs[0].nodes)
    rows, out = [], {}
    for config in configs:
        mine = [r for r in runs if r.config == config]
        each = {n: statistics.median(r.node_us_each()[n] for r in mine) for n in names}
        busiest = max(each, key=lambda n: each[n])
        allows = args.node_cpus / each[busiest] * 1e6
        rate = statistics.median(r.rate for r in mine)
        rows.append((
            config.label, *(f"{each[n]:.0f}" for n in names), f"{sum(each.values()):.0f}",
            busiest, f"{allows:,.0f} ({allows / rate1:.2f}x)", f"{rate:,.0f} ({rate / rate1:.2f}x)",
        ))  # fmt: skip
        out[config_key(config)] = {
            **each,
            "allows": allows,
            "allows_ratio": allows / rate1,
            "rate_ratio": rate / rate1,
        }
    emit(
        "Each node's CPU per record recorded, us (medians of the rounds), and the rate at which "
        f"the busiest reaches its {args.node_cpus:g}-core quota, against N = 1's rate",
        table(
            ["", *names, "all nodes", "busiest", "its quota allows, records/s", "measured"],
            rows,
        ),
    )
    return out


def _leader_share(run: Run) -> float:
    leader = next(iter(run.leaders.values()))
    others = [u.cores for n, u in run.nodes.items() if n != leader]
    return run.nodes[leader].cores / statistics.mean(others) if others else float("nan")


def summarise(bounds: list[str], runs: int) -> str:
    if not bounds:
        return (
            "nothing measured was at 90% of its limit (the recorders waited: on the broker's "
            "deliveries or on PostgreSQL)"
        )
    kinds: dict[str, int] = {}
    for b in bounds:
        key = re.sub(r" at [\d.]+%? .*| at [\d.]+ core|: [\d.]+ of its.*", "", b)
        kinds[key] = kinds.get(key, 0) + 1
    return (
        "; ".join(f"{k} (in {n} of {runs} runs)" for k, n in kinds.items()) + f" — e.g. {bounds[0]}"
    )


# How a node is lost (a report's "event"): the title's words, and the node's participle
EVENTS = {
    "kill": ("A node lost at N = 3: SIGKILL {victim} (the leader of shard {shard})", "killed"),
    "cut": (
        "A node cut off at N = 3: {victim} (the leader of shard {shard}) cut from its two peers "
        "and the recorders",
        "cut",
    ),
}


def emit_kill(report: dict[str, Any], args: argparse.Namespace) -> None:
    event = report.get("event", "kill")
    title, participle = EVENTS[event]
    rows = [
        (
            q,
            report["leaders_before"][q],
            report["leaders_after"][q],
            "moved" if q in report["moved"] else "",
        )
        for q in report["leaders_before"]
    ]
    emit(
        title.format(victim=report["victim"], shard=report["victim_shard"])
        + f"; {args.kill_count:,} records, {args.recorders} recorders",
        table(["shard", "leader before", f"leader after the {event}", ""], rows),
    )
    fmt = lambda x: f"{x:,.0f}" if x == x else "-"  # noqa: E731
    ratio_gap = report["ratio_gap"]
    victim = report["victim_shard"]
    verdict = "met" if ratio_gap == ratio_gap and ratio_gap >= TARGET_KILL else "missed"
    emit(
        f"The other shards' drain ({', '.join(map(str, report['other_shards']))}), records/s",
        table(
            ["window", "records/s", "vs before", f"target >= {TARGET_KILL}x"],
            [
                (f"{args.window:g} s before the {event}", fmt(report["rate_before"]), "", ""),
                (f"the gap ({report['gap_s']:.1f} s, until shard {victim} drains again)",
                 fmt(report["rate_gap"]), f"{ratio_gap:.2f}x", verdict),
                (f"{args.window:g} s from the {event}", fmt(report["rate_after"]),
                 f"{report['ratio_after']:.2f}x", ""),
            ],
        ),
    )  # fmt: skip
    pairs = zip(report["per_shard_before"], report["per_shard_after"], strict=True)
    per = " / ".join(f"shard {k} {fmt(a)} -> {fmt(b)}" for k, (a, b) in enumerate(pairs, 1))
    print(f"per shard, before -> from the {event}: {per}")
    for label in ("before", "after"):
        nodes = ", ".join(f"{n} {u.describe()}" for n, u in report[f"nodes_{label}"].items())
        machine = report[f"machine_{label}"]
        print(f"node CPU {label} the {event}: {nodes}; machine {machine:.2f} cores")
    print(
        f"consumers by node before the {event}: {report['consumers_before']}, after: "
        f"{report['consumers_after']}; each recorder's reconnects: {report['reconnects']}"
    )
    print(
        f"leaders moved: {report['moved']}; only the {participle} node's: "
        f"{report['only_victims_moved']}"
    )
    if report["ran_dry"]:
        print(f"warning: shards {report['ran_dry']} ran dry: the window after is cut short")
    print(flush=True)


# -- main ------------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> None:
    problem = cgroups.available()
    if problem is not None:
        raise SystemExit(f"bench_shards puts each RabbitMQ node under a CPU quota: {problem}")
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as base:
        cluster = QuotaCluster(
            Path(base),
            args.node_cpus,
            shares=args.node_shares,
            recorder_shares=args.recorder_shares,
            size=args.nodes,
        )
        progress(f"starting the {args.nodes}-node cluster")
        await asyncio.to_thread(cluster.start)
        try:
            await run(args, cluster)
        finally:
            progress("stopping the cluster")
            await asyncio.to_thread(cluster.stop)


async def run(args: argparse.Namespace, cluster: QuotaCluster) -> dict[str, Any]:
    """The benchmark on ``cluster`` (started, its nodes in their groups): prints the tables,
    writes ``--json``, returns what it wrote."""
    if args.assigned and args.recorders < 3:
        raise SystemExit("--assigned gives recorder k shard k: it needs 3 recorders or more")
    if args.quick:  # a drain of 2 s or more: at 0.1 core a node's CPU shows in 10 ms ticks,
        # and 6,000 records drained in 0.5-0.7 s once read a throttled node's use as 0
        args.count, args.rounds, args.window, args.gap_allow = 20_000, 1, 1.5, 4.0
    command = "python -m benchmarks.bench_shards " + shlex.join(args.argv or sys.argv[1:])
    logs = Path(args.logs or tempfile.mkdtemp(prefix="bench-shards-logs-"))
    await asyncio.to_thread(logs.mkdir, parents=True, exist_ok=True)
    facts = await machine_facts()
    nodes = {3: "three", 5: "five"}.get(len(cluster.nodes), str(len(cluster.nodes)))
    facts[f"rabbitmq (the rig's {nodes} nodes)"] = await cluster.server_version()
    facts["quota"] = (
        f"{args.node_cpus:g} core per RabbitMQ node (CFS, 100 ms period), cpu.shares "
        f"{cluster.shares} a node; recorders unlimited, "
        + (
            f"in one group of cpu.shares {cluster.recorder_shares}"
            if cluster.recorder_shares
            else "at the default weight"
        )
        + "; PostgreSQL (the machine's shared server) and this process unlimited"
    )
    facts["command"] = command
    emit("Machine", facts_table(facts))
    runs = await throughput_rounds(cluster, args)
    summary = emit_runs(runs, args, os.cpu_count() or 1)
    kill = None
    if not args.no_kill:
        if args.kill_count is None:  # enough not to run dry, with a gap of up to --gap-allow s
            rate = statistics.median(r.rate for r in runs if r.shards == 3)
            seconds = 2 * args.window + 1 + args.gap_allow
            args.kill_count = int(rate * seconds * 1.2 // 1000 + 1) * 1000
            if args.quick:  # seconds, not a minute of filling: a shard may run dry (said so)
                args.kill_count = min(args.kill_count, 30_000)
        kill = await node_kill(cluster, args, logs)
        emit_kill(kill, args)
    data = {
        "facts": facts,
        "args": {k: v for k, v in vars(args).items() if k != "argv"},
        "runs": [plain(dataclasses.asdict(r)) for r in runs],
        "summary": summary,
        "kill": plain(kill),
    }
    save_json(args.json, data)
    return data


def plain(value: Any) -> Any:
    """``value`` with every node's use as cores, share of quota and throttled share (JSON)."""
    if isinstance(value, NodeUse):
        return {
            "cores": value.cores,
            "of_quota": value.of_quota,
            "throttled": value.throttling.share,
        }
    if isinstance(value, dict):
        if {"cpu_s", "seconds", "quota", "throttling"} <= value.keys():  # an asdict'ed NodeUse
            use = NodeUse(
                value["cpu_s"], value["seconds"], value["quota"], Throttling(**value["throttling"])
            )
            return plain(use)
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


async def throughput_rounds(cluster: QuotaCluster, args: argparse.Namespace) -> list[Run]:
    """Each round measures every configuration (N = 1, then N = 3 at each ``--shard-replicas``),
    the order rotated by one each round, so that no configuration always goes first."""
    assigned = (False, True) if args.assigned else (False,)
    configs = [Config(1), *(Config(3, r, a) for r in args.shard_replicas for a in assigned)]
    runs = []
    for round_ in range(1, args.rounds + 1):
        shift = (round_ - 1) % len(configs)
        for config in configs[shift:] + configs[:shift]:
            progress(f"round {round_}/{args.rounds}: {config.label}")
            run = await measure_drain(cluster, args, config, round_)
            progress(f"  {config.label}: {run.rate:,.0f} records/s")
            runs.append(run)
    return runs


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--node-cpus", type=float, default=0.25, help="CPU quota of each node, cores"
    )
    parser.add_argument("--recorders", type=int, default=3, help="recorder processes")
    parser.add_argument(
        "--nodes", type=int, default=3, help="RabbitMQ nodes in the cluster (3 or more)"
    )
    parser.add_argument(
        "--assigned",
        action="store_true",
        help="measure each N = 3 configuration also with recorder k consuming shard k only "
        "(RABBITMQ_QUEUE_SHARDS_CONSUMED=k), on node k, where shard k leads",
    )
    parser.add_argument(
        "--shard-replicas",
        type=int,
        nargs="+",
        default=[0],
        help="N = 3 is measured once for each: RABBITMQ_QUEUE_SHARD_REPLICAS (shards 2-3's "
        "replicas; 0: one on every node, the default)",
    )
    parser.add_argument(
        "--node-shares",
        type=int,
        default=8192,
        help="cpu.shares of each node's group: high, so that on a busy machine a node gets its "
        "quota whenever it can use it (1024: the weight of any other process)",
    )
    parser.add_argument(
        "--recorder-shares",
        type=int,
        default=8192,
        help="cpu.shares of a group (no quota) holding the recorders; 0: no group",
    )
    parser.add_argument("--count", type=int, default=60_000, help="records a measured drain")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of N = 1 and N = 3")
    parser.add_argument("--type", default="credit_annotation", choices=sorted(TABLE))
    parser.add_argument(
        "--kill-count",
        type=int,
        help="records of the kill run (default: the N = 3 rate measured, for 2 windows, a "
        "second and --gap-allow s, and a fifth more)",
    )
    parser.add_argument(
        "--gap-allow", type=float, default=10.0, help="s of gap the default --kill-count allows"
    )
    parser.add_argument(
        "--window", type=float, default=8.0, help="s measured before and after the kill"
    )
    parser.add_argument(
        "--gap-max", type=float, default=60.0, help="s to wait for the shard to drain again"
    )
    parser.add_argument("--no-kill", action="store_true", help="leave out the node kill")
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--quick", action="store_true", help="seconds: small counts, one round")
    parser.add_argument("--logs", help="folder for the recorders' logs of the kill run")
    parser.add_argument("--json", help="write raw results here")
    parser.set_defaults(argv=None)  # the command line printed (a test passes its own)
    add_recorder_arguments(parser)
    return parser


def main() -> None:
    run_main(build_parser(), main_async)


if __name__ == "__main__":
    main()
