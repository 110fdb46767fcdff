"""Queue shards when a node is cut off, not killed: the other shards' drain while one RabbitMQ
node is partitioned from its two peers and from the recorders, then healed (issue 41).

    python -m benchmarks.bench_shards_partition                # 300,000 records, 5 s windows
    python -m benchmarks.bench_shards_partition --quick        # small counts (the soak test's)

``benchmarks/bench_shards.py`` measures the node SIGKILLed; this is its partition variant, the
same measurement on the namespace rig (tests/rigs/hosted.py): the three RabbitMQ nodes on hosts
mq1..mq3 of their own, ``cluster_partition_handling = pause_minority`` and ``net_ticktime = 10``
(tests/partitions/conftest.py's RABBIT_CONFIG), the ``rabbitmq_random_exchange`` plugin on every
node; each node in a cgroup with ``--node-cpus`` cores, as bench_shards does
(benchmarks/support/quota_cluster.py). PostgreSQL is the rig's own pair on pg1/pg2, the standby
asynchronous, so that a commit waits for one server as with the machine's shared one. The
recorders (``--recorders``, at most three) run on hosts rec1, rec2 and relay, each given every
node's address with ``?heartbeat=2`` (as the partition tests' processes) and
``RABBITMQ_QUEUE_SHARDS=3``; this process reaches the nodes and the database through the rig's
forwarders from the observer, which no partition cuts.

The run, on fresh names and a fresh database: the three shards declared through mq1 (shard 1
leads there, shards 2 and 3 placed by the balanced locator); ``--count`` records published
(confirmed, one publisher a node); the quotas on, then the recorders started (not started first
and held with SIGSTOP, as bench_shards does: held that long, they would miss their 2 s
heartbeats and lose their connections). Once every recorder is ready, the shards' ready counts
are read every 0.25 s on a connection to mq1. A second later and ``--window`` s of drain after,
the leader of one shard (not mq1, and a node a recorder consumes through if there is one) is
cut from every other host, silently (nft drops in both directions, ``Net.isolate``): its peers
and the recorders alike. The gap is from the cut until that shard
drains again (a leader elected on the majority, deliveries flowing); the other shards' drain in
the gap, and over the ``--window`` s from the cut, against the ``--window`` s before (target >=
0.8x); which shards' leaders moved, asked on mq1 during the cut and again after the heal (only
the cut node's should). Then the quotas off, the partition healed, the wait until every node
runs in the cluster again (a node left stuck in ``global`` by RabbitMQ 3.10.8 on OTP 25 is
nudged, as tests/partitions does), every record drained, the recorders stopped (exit 0), and the
audit of tests/faults/audit.py: every published record recorded once, nothing left in a shard,
nothing in the DLQ.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.bench_shards import (
    PROBE_S,
    Timeline,
    choose_victim,
    delete,
    describe_leaders,
    emit_kill,
    fill,
    kill_report,
    make_topology,
    plain,
    probe,
    wait_resumed,
)
from benchmarks.support import cgroups
from benchmarks.support.env import add_recorder_arguments, run_main, unique
from benchmarks.support.machine import facts_table, machine_facts
from benchmarks.support.quota_cluster import QuotaCluster
from benchmarks.support.recorder import http_get
from benchmarks.support.stats import emit, progress, save_json
from bulk_recorder.infra import pg_hosts
from bulk_recorder.infra.migrate import migrate
from consumer.topology import RANDOM_PLUGIN, Topology
from tests.cluster.failover_support import merge
from tests.conftest import wait_for
from tests.faults.conftest import RecorderPool, RecorderProcess
from tests.partitions.conftest import RABBIT_CONFIG, cluster_whole
from tests.partitions.harness import HEARTBEAT, settle_and_audit
from tests.rigs import netns
from tests.rigs.hosted import METRICS_PORT, Hosted, Hosts, service_settings, start_pg
from tests.rigs.topology import declare_through

RECORDER_HOSTS = ("rec1", "rec2", "relay")  # the rig's service hosts that hold broker clients
HANDLING = "pause_minority"  # RABBIT_CONFIG's cluster_partition_handling


@dataclass
class HostedRecorder:
    """A recorder process on a host of the rig."""

    hosted: Hosted
    name: str
    process: RecorderProcess

    @property
    def pid(self) -> int:
        """``ip netns exec`` execs the recorder: the pid is the recorder's own."""
        assert self.process.proc is not None
        return self.process.proc.pid

    async def wait_ready(self) -> None:
        """Until its /readyz (through a forwarder from the observer) answers 200."""
        port = (await self.hosted.forward(self.name, METRICS_PORT)).port

        async def ready() -> bool:
            if not self.process.running:
                raise RuntimeError(f"recorder on {self.name} exited: {self.process.log_path}")
            with contextlib.suppress(OSError, TimeoutError, IndexError, ValueError):
                return (await http_get(port, "/readyz", 2))[0] == 200
            return False

        await wait_for(ready, timeout=120, interval=0.3)


async def start_recorders(
    hosted: Hosted, args: argparse.Namespace, topology: Topology, database: str
) -> list[HostedRecorder]:
    settings = service_settings(
        hosted.database_url(database),
        hosted.rabbitmq_url(HEARTBEAT),
        topology,
        "recorder",
        rabbitmq_queue_shards=topology.shards,
        rabbitmq_numbers_of_workers=args.workers,
        rabbitmq_numbers_of_prefetch=args.prefetch,
        bulk_recorder_size=args.size,
        bulk_recorder_flush_timeout_ms=args.timeout_ms,
        log_level="INFO",
    )
    names = RECORDER_HOSTS[: args.recorders]
    return [HostedRecorder(hosted, n, await hosted.start(n, settings)) for n in names]


async def node_cut(
    cluster: QuotaCluster, hosted: Hosted, args: argparse.Namespace
) -> dict[str, Any]:
    """The measured cut and the heal; the report of :func:`bench_shards.kill_report` with the
    heal's figures and the audit added."""
    topology = make_topology(3)
    await declare_through(cluster.url(0), topology)
    try:
        return await _cut_and_heal(cluster, hosted, args, topology)
    finally:
        await asyncio.to_thread(hosted.net.heal)  # (done already unless the run failed)
        await delete(cluster.url(0), topology)


async def leaders_now(cluster: QuotaCluster, queues: list[str]) -> dict[str, str | None]:
    """Each shard's leader, asked on mq1. During the cut a listing can wait for the cut node
    until the majority declares it down (net_ticktime): asked again, up to three times."""
    for attempt in range(3):
        try:
            return await cluster.leaders(queues)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            progress(f"  the leaders are unknown yet ({type(exc).__name__}); asking again")
            await asyncio.sleep(2.0 * (attempt + 1))
    return await cluster.leaders(queues)


async def _cut_and_heal(
    cluster: QuotaCluster, hosted: Hosted, args: argparse.Namespace, topology: Topology
) -> dict[str, Any]:
    net = hosted.net
    queues = topology.shard_queues()
    before = await cluster.leaders(queues)
    progress(f"node cut: leaders {describe_leaders(cluster, before)}")
    database = unique("bench_shards")
    await migrate(hosted.test_dsn(database))
    timeline = Timeline()
    consumers: list[dict[str, int]] = []
    stop = asyncio.Event()
    task: asyncio.Task[None] | None = None

    async def where() -> None:
        try:
            consumers.append(await asyncio.to_thread(cluster.consumers, queues))
        except (RuntimeError, subprocess.TimeoutExpired) as exc:  # reported, not fatal
            progress(f"  where the consumers are is unknown: {exc}")
            consumers.append({"unknown": -1})

    try:
        # filled first, the recorders started after: held with SIGSTOP through the filling (as
        # bench_shards holds them), they would miss their heartbeats (2 s) and lose their
        # connections; their start-up is over before the window (a second after all are ready)
        sent = await fill(cluster, topology, args, args.kill_count)
        # the quotas before the recorders: started on unlimited nodes, three recorders drained
        # the quick run's 150,000 records before the cut (soak-partitions SHARDS=3, seed 4142)
        cluster.limit(True)
        recorders = await start_recorders(hosted, args, topology, database)
        await asyncio.gather(*(r.wait_ready() for r in recorders))
        for r in recorders:
            cluster.add_recorder(r.pid)
        await where()  # at the quota: the two listings take some 10 s, the drain goes on
        victim_shard = choose_victim(cluster, queues, before, consumers[0])
        victim = cluster.cluster.node(before[queues[victim_shard]] or cluster.nodes[-1].node)
        host = hosted.hosts.broker_host(victim.node)
        others = [k for k in range(len(queues)) if before[queues[k]] != victim.node]
        task = asyncio.create_task(probe(cluster, cluster.url(0), topology, timeline, stop))
        await asyncio.sleep(1.0 + args.window)  # a second to settle, then the window before
        progress(
            f"node cut: {host} ({victim.name}, the leader of shard {victim_shard + 1}) cut off"
        )
        cut_at = time.monotonic()
        await asyncio.to_thread(net.isolate, host)
        resumed_at = await wait_resumed(timeline, victim_shard, cut_at, args.gap_max, args.window)
        await asyncio.sleep(max(0.0, cut_at + args.window - time.monotonic()) + PROBE_S)
        stop.set()
        await task
        task = None
        cluster.limit(False)  # measured: the listings below run unlimited
        await where()  # during the cut: where the consumers are now
        during = await leaders_now(cluster, queues)  # asked on mq1, on the majority's side
    finally:
        stop.set()
        if task is not None:
            await task
        cluster.limit(False)
    heal_at = time.monotonic()
    progress(f"node cut: healed after {heal_at - cut_at:.1f} s; waiting for the cluster")
    await asyncio.to_thread(net.heal)
    nudges = await asyncio.to_thread(cluster_whole, hosted.hosts)
    whole_at = time.monotonic()
    after = await leaders_now(cluster, queues)
    progress(f"node cut: whole after {whole_at - heal_at:.1f} s; draining the rest, then the audit")
    total, shapes = merge(*sent)
    processes = {r.name: r.process for r in recorders}
    audit, unready, _ = await settle_and_audit(
        hosted, database, topology, processes, total, 1, expected_dlq=shapes, settle_timeout=600
    )
    logfiles = [r.process.log_path for r in recorders]
    report = kill_report(
        cluster, args, timeline, queues, (before, during), victim, victim_shard, others,
        (cut_at, resumed_at), logfiles, consumers, event="cut",
    )  # fmt: skip
    moved_after = [q for q in queues if before[q] != after[q]]
    rows = await count_records(hosted.test_dsn(database))
    return report | {
        "victim_host": host,
        "handling": HANDLING,
        "cut_s": heal_at - cut_at,
        "whole_after_s": whole_at - heal_at,
        "nudges": nudges,
        "leaders_after_heal": {q: cluster.short(v) for q, v in after.items()},
        "moved_after_heal": moved_after,
        "only_victims_moved_after_heal": moved_after == report["moved"],
        "rows": rows,
        "audit": dataclasses.asdict(audit),
        "audit_line": audit.line(),
        "unready": unready,
        # the probe's samples: seconds from the cut, each shard's ready count (None: no answer)
        "timeline": [(round(t - cut_at, 2), counts) for t, counts, _ in timeline.points],
    }


async def count_records(dsn: str) -> int:
    conn = await pg_hosts.connect(dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT (SELECT count(*) FROM transactions)"
                " + (SELECT count(*) FROM credit_annotations)"
            )
        )
    finally:
        await conn.close()


def emit_heal(report: dict[str, Any]) -> None:
    audit = report["audit"]
    exact = (
        audit["lost"] == 0
        and audit["doubled"] == 0
        and audit["phantom"] == 0
        and audit["main_queue_ready"] == 0
        and audit["dlq_total"] == 0
        and not report["unready"]
    )
    leaders = ", ".join(
        f"shard {k} {v}" for k, v in enumerate(report["leaders_after_heal"].values(), 1)
    )
    emit(
        f"After the heal ({HANDLING}; the cut lasted {report['cut_s']:.1f} s)",
        "\n".join(
            [
                f"every node running in the cluster {report['whole_after_s']:.1f} s after the "
                f"heal; nudged in global: {report['nudges'] or 'none'}",
                f"leaders after the heal: {leaders}; moved since before the cut: "
                f"{report['moved_after_heal']}; only the cut node's: "
                f"{report['only_victims_moved_after_heal']}",
                f"the audit: {report['audit_line']}, {report['rows']:,} rows; left in the shards "
                f"{audit['main_queue_ready']}, DLQ {audit['dlq_total']}; recorders not ready at "
                f"the end: {report['unready'] or 'none'}: "
                + ("every record recorded exactly once" if exact else "NOT EXACT"),
            ]
        ),
    )


async def rig_facts(
    hosted: Hosted, cluster: QuotaCluster, args: argparse.Namespace
) -> dict[str, str]:
    facts = await machine_facts()
    for shared in ("postgresql", "postgresql fsync / synchronous_commit", "rabbitmq"):
        facts.pop(shared, None)  # the machine's shared servers: not what this run uses
    conn = await pg_hosts.connect(hosted.test_dsn("postgres"))
    try:
        facts["postgresql (the rig's pg1, asynchronous standby on pg2)"] = str(
            await conn.fetchval("SHOW server_version")
        )
    finally:
        await conn.close()
    facts["rabbitmq (the namespace rig's three nodes)"] = await cluster.server_version()
    facts["partition handling"] = RABBIT_CONFIG.strip().replace("\n", "; ")
    facts["quota"] = (
        f"{args.node_cpus:g} core per RabbitMQ node (CFS, 100 ms period), cpu.shares "
        f"{cluster.shares} a node; recorders unlimited, "
        + (
            f"in one group of cpu.shares {cluster.recorder_shares}"
            if cluster.recorder_shares
            else "at the default weight"
        )
        + "; PostgreSQL and this process unlimited"
    )
    facts["command"] = "python -m benchmarks.bench_shards_partition " + shlex.join(
        args.argv if args.argv is not None else sys.argv[1:]
    )
    return facts


async def run(args: argparse.Namespace, hosts: Hosts, folder: Path) -> dict[str, Any]:
    """The benchmark on ``hosts`` (the namespace rig, running; its cluster with the random
    exchange plugin): prints the tables, writes ``--json``, returns what it wrote. Leaves the
    rig as it found it: healed, whole, its own PostgreSQL and processes stopped."""
    if not 1 <= args.recorders <= len(RECORDER_HOSTS):
        raise SystemExit(f"--recorders: 1 to {len(RECORDER_HOSTS)} (hosts {RECORDER_HOSTS})")
    if args.quick:
        args.kill_count, args.window = 150_000, 1.5
    logs = Path(args.logs or tempfile.mkdtemp(prefix="bench-shards-partition-logs-"))
    await asyncio.to_thread(logs.mkdir, parents=True, exist_ok=True)
    pg = await asyncio.to_thread(start_pg, folder / "pg", hosts, False)
    hosted = Hosted(hosts, pg, RecorderPool(logs))
    cluster: QuotaCluster | None = None
    try:
        await hosted.open()
        cluster = QuotaCluster(
            folder,
            args.node_cpus,
            rig=hosts.rabbit,
            shares=args.node_shares,
            recorder_shares=args.recorder_shares,
            client_urls=hosted.test_amqp_urls(),
        )
        cluster.start()
        facts = await rig_facts(hosted, cluster, args)
        emit("Machine", facts_table(facts))
        report = await node_cut(cluster, hosted, args)
    finally:
        if cluster is not None:
            cluster.limit(False)
            cluster.stop()  # the nodes back in the root group, the groups removed
        await asyncio.to_thread(hosts.net.heal)
        try:
            await hosted.close()  # any recorder still running stopped, the forwarders closed
        finally:
            await asyncio.to_thread(pg.stop)
            await asyncio.to_thread(cluster_whole, hosts)
    emit_kill(report, args)
    emit_heal(report)
    data = {
        "facts": facts,
        "args": {k: v for k, v in vars(args).items() if k != "argv"},
        "cut": plain(report),
    }
    save_json(args.json, data)
    return data


async def main_async(args: argparse.Namespace) -> None:
    for problem in (cgroups.available(), ", ".join(netns.missing()) or None):
        if problem is not None:
            raise SystemExit(f"bench_shards_partition needs cgroups and the netns rig: {problem}")
    with tempfile.TemporaryDirectory(prefix="bench-shards-partition-") as base:
        progress("starting the namespace rig (namespaces and the three-node cluster)")
        hosts = await asyncio.to_thread(Hosts.start, Path(base), RABBIT_CONFIG, (RANDOM_PLUGIN,))
        try:
            await run(args, hosts, Path(base))
        finally:
            progress("stopping the rig")
            left = await asyncio.to_thread(hosts.stop)
            if left:
                print(f"warning: the rig left {left}", file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--node-cpus", type=float, default=0.25, help="CPU quota of each node, cores"
    )
    parser.add_argument(
        "--recorders", type=int, default=3, help=f"recorder processes, on {RECORDER_HOSTS}"
    )
    parser.add_argument("--node-shares", type=int, default=8192, help="as bench_shards'")
    parser.add_argument("--recorder-shares", type=int, default=8192, help="as bench_shards'")
    parser.add_argument(
        "--count",
        dest="kill_count",
        type=int,
        default=300_000,
        help="records published before the drain: enough for the recorders' start, the window "
        "before, a gap of some 12 s and the window after at 6,000-10,000 records/s (the "
        "shards' rates at 0.25 core)",
    )
    parser.add_argument("--type", default="credit_annotation", choices=("credit_annotation",))
    parser.add_argument(
        "--window", type=float, default=5.0, help="s measured before and after the cut"
    )
    parser.add_argument(
        "--gap-max", type=float, default=90.0, help="s to wait for the shard to drain again"
    )
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--quick", action="store_true", help="seconds: small counts")
    parser.add_argument("--logs", help="folder for the recorders' logs")
    parser.add_argument("--json", help="write raw results here")
    parser.set_defaults(argv=None)  # the command line printed (a test passes its own)
    add_recorder_arguments(parser)
    return parser


def main() -> None:
    run_main(build_parser(), main_async)


if __name__ == "__main__":
    main()
