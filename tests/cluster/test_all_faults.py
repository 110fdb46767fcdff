"""Every fault in one run (issue 23, item 2): a schedule drawn from a printed seed, overlapping.

The rig: the three-node RabbitMQ cluster and a PostgreSQL primary with its synchronous standby;
two recorders, the relay and the API as real processes, each reaching every broker node and
both database servers through TCP proxies. Traffic runs all along: API clients post
transactions and NDJSON jobs, retrying each request with its own ``Idempotency-Key`` (and
repeating some accepted ones on purpose), and a publisher sends valid, duplicate and invalid
messages straight to the exchange. Meanwhile the schedule applies broker-node SIGKILLs and
restarts, one database failover (the standby promoted; the processes follow through the
multi-host DATABASE_URL), recorder and relay SIGKILLs and restarts, a broker connection held
past the heartbeat and a database connection held past the command timeout.

Then the audit of ``tests/faults/audit.py``: every 202 and every published valid record in
PostgreSQL exactly once, balances equal to the unique APPROVED transactions, the DLQ exactly
the invalid messages (repeats allowed: the DLQ is at-least-once), the main queue drained and
nothing unacked; the outbox holds nothing but parked rows; every process is ready at the end.

The seed: ``SOAK_SEED`` (one, or several comma-separated), else today's date (a different
schedule each day, as the mutants' pair). ``SOAK_CLUSTER=1`` (``make soak-cluster``) makes the
long run: ``SOAK_SECONDS`` (default 240) of traffic with about 1.5 faults of each kind a minute,
for ``SOAK_CLUSTER_RUNS`` (default 3) random seeds unless ``SOAK_SEED`` names them. The seed and
the schedule are printed first; the report last, and again in pytest's summary.

The shards: ``SOAK_SHARDS`` (default 1, ``make soak-cluster SHARDS=N``) runs every role with
``RABBITMQ_QUEUE_SHARDS=N``: the records spread over N quorum queues (the cluster rig's nodes
run the random exchange plugin), each node kill may take the leader of several, and the audit
reads every shard (drained, nothing unacked).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg
import httpx
import pytest

from bulk_recorder.infra import pg_hosts
from consumer.tools.generator import Generator
from consumer.topology import Topology, delete_topology
from tests.cluster.conftest import SOAK_REPORTS, PgClusterFactory
from tests.cluster.failover_support import CommitWatch, cluster_settings, open_broker
from tests.cluster.fault_runner import Applied, FaultRunner
from tests.cluster.schedule import Fault, Plan, draw, run_seeds
from tests.cluster.traffic import Client, JobClient, QueueTraffic
from tests.conftest import free_port, unique_name, wait_for
from tests.faults.audit import Audit, audit_run, wait_until_settled
from tests.faults.conftest import API, RELAY, RecorderProcess, via_proxy
from tests.faults.proxy import TcpProxy
from tests.integration.producer_support import bearer, provision_key
from tests.rigs.rabbitmq_cluster import RabbitCluster

LONG = os.environ.get("SOAK_CLUSTER", "") not in ("", "0")
HEARTBEAT = 2  # ?heartbeat= on every broker URL: aiormq gives up after (2 + 1) x 3 s
DB_COMMAND_TIMEOUT = 3.0  # BULK_RECORDER_DB_COMMAND_TIMEOUT_S: a held connection's limit
PLAN = (
    Plan(float(os.environ.get("SOAK_SECONDS", "240")), (HEARTBEAT + 1) * 3, DB_COMMAND_TIMEOUT, 1.5)
    if LONG
    else Plan(30.0, (HEARTBEAT + 1) * 3, DB_COMMAND_TIMEOUT)
)


# RABBITMQ_QUEUE_SHARDS of every role (make soak-cluster SHARDS=N)
SHARDS = int(os.environ.get("SOAK_SHARDS", "1"))


def _seeds() -> list[int]:
    return run_seeds(LONG, int(os.environ.get("SOAK_CLUSTER_RUNS", "3")))


def reproduce(seed: int) -> str:
    if LONG:
        return f"make soak-cluster SEED={seed}" + (f" SHARDS={SHARDS}" if SHARDS > 1 else "")
    shards = f"SOAK_SHARDS={SHARDS} " if SHARDS > 1 else ""
    return (
        f"SOAK_SEED={seed} {shards}.venv/bin/pytest -p no:cacheprovider "
        "tests/cluster/test_all_faults.py"
    )


pytestmark = [
    pytest.mark.cluster,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.timeout(int(PLAN.seconds * 6 + 300)),
]


@dataclass
class Phases:
    """Wall time of each phase of a run, for the report (the short run's budget is ~90 s)."""

    took: dict[str, float] = field(default_factory=dict)
    _mark: float = field(default_factory=time.monotonic)

    def end(self, phase: str) -> None:
        now = time.monotonic()
        self.took[phase], self._mark = now - self._mark, now


@dataclass
class Rig:
    """The processes and the proxies in front of the broker nodes and the database servers."""

    procs: dict[str, RecorderProcess]
    ports: dict[str, int]  # each process's /readyz port
    mq_proxies: list[TcpProxy]
    db_proxies: list[TcpProxy]
    direct_dsn: str  # the test's own: both servers, not through the proxies
    api: str


@contextlib.asynccontextmanager
async def proxies(targets: list[int]) -> AsyncIterator[list[TcpProxy]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(TcpProxy("127.0.0.1", p)) for p in targets]


def heartbeat(url: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, parts.path or "/", f"heartbeat={HEARTBEAT}", ""))


async def start_processes(
    recorders, cluster: RabbitCluster, topo: Topology, dsn: str, mq: list[TcpProxy]
) -> tuple[dict[str, RecorderProcess], dict[str, int]]:
    mq_url = ",".join(
        heartbeat(via_proxy(n.url, p)) for n, p in zip(cluster.nodes, mq, strict=True)
    )
    ports = {name: free_port() for name in ("recorder-0", "recorder-1", "relay", "api")}

    def settings(name: str, **more: object):
        return cluster_settings(
            dsn,
            mq_url,
            topo,
            bulk_recorder_db_command_timeout_s=DB_COMMAND_TIMEOUT,
            metrics_port=0 if name == "api" else ports[name],
            rabbitmq_queue_shards=topo.shards,
            **more,
        )

    procs = {
        "recorder-0": await recorders.start(settings("recorder-0")),
        "recorder-1": await recorders.start(
            settings("recorder-1", bulk_recorder_size=200, rabbitmq_numbers_of_workers=3)
        ),
        "relay": await recorders.start(
            settings("relay"), args=(*RELAY, "--poll-interval", "0.2"), name="relay"
        ),
        "api": await recorders.start(
            settings("api"), args=API, name="api", env={"API_PORT": str(ports["api"])}
        ),
    }
    return procs, ports


async def not_ready(ports: dict[str, int]) -> list[str]:
    """The processes whose /readyz does not answer 200 now."""
    out = []
    async with httpx.AsyncClient(timeout=3) as http:
        for name, port in ports.items():
            try:
                answer = await http.get(f"http://127.0.0.1:{port}/readyz")
            except httpx.HTTPError:
                out.append(f"{name}: no answer")
                continue
            if answer.status_code != 200:
                out.append(f"{name}: {answer.status_code} {answer.text.strip()[:120]}")
    return out


@pytest.fixture
async def soak_topology(
    rabbit_cluster: RabbitCluster, cluster_topology: Topology
) -> AsyncIterator[Topology]:
    """The test's names with SOAK_SHARDS shards; shards 2..N and their exchange deleted
    afterwards (``cluster_topology`` deletes the rest)."""
    topo = dataclasses.replace(cluster_topology, shards=SHARDS)
    yield topo
    if topo.shards == 1:
        return
    connection = await aio_pika.connect(rabbit_cluster.running_nodes()[0].url, timeout=30)
    try:
        left = await delete_topology(connection, topo)
    finally:
        await connection.close()
    assert not left, f"test topology left on the cluster: {left}"


@pytest.mark.parametrize("seed", _seeds(), ids=lambda s: f"seed={s}")
async def test_every_fault_in_one_run(
    seed: int,
    rabbit_cluster: RabbitCluster,
    soak_topology: Topology,
    pg_clusters: PgClusterFactory,
    recorders,
) -> None:
    schedule = draw(seed, PLAN)
    print(f"\nall-faults run, seed {seed}, {SHARDS} shard(s) (reproduce: {reproduce(seed)})")
    print(f"schedule ({len(schedule)} faults over {PLAN.seconds:.0f} s of traffic):")
    print("\n".join("  " + f.line() for f in schedule))

    cluster, topo = rabbit_cluster, soak_topology
    phases = Phases()
    pg = await asyncio.to_thread(pg_clusters, True)
    name = unique_name("brsoak")
    direct = pg.multi_host_dsn(name, connect_timeout="2")
    key = await provision_key(direct)  # migrates (creates the database on the primary)
    broker = await open_broker(cluster, topo)
    await broker.close()
    for queue in topo.shard_queues():
        await asyncio.to_thread(cluster.wait_all_online, queue)
    async with (
        proxies([n.amqp_port for n in cluster.nodes]) as mq,
        proxies([pg.primary.port, pg.standby.port]) as dbp,
    ):
        proxied = (
            f"postgresql://postgres@127.0.0.1:{dbp[0].port},127.0.0.1:{dbp[1].port}/{name}"
            "?target_session_attrs=read-write&connect_timeout=2"
        )
        procs, ports = await start_processes(recorders, cluster, topo, proxied, mq)
        await wait_for(lambda: _all_ready(ports), timeout=90, interval=0.2)
        rig = Rig(procs, ports, mq, dbp, direct, f"http://127.0.0.1:{ports['api']}")
        phases.end("setup")
        report = await run_and_audit(seed, schedule, rig, cluster, topo, pg, key, phases)
    SOAK_REPORTS.append(report)
    print(report)


async def _all_ready(ports: dict[str, int]) -> bool:
    return not await not_ready(ports)


async def run_and_audit(
    seed: int,
    schedule: list[Fault],
    rig: Rig,
    cluster: RabbitCluster,
    topo: Topology,
    pg,
    key: str,
    phases: Phases,
) -> str:
    auth = bearer(key)
    gens = random.Random(seed)
    clients = [
        Client(
            base_url=rig.api, gen=Generator.create(gens.randrange(2**32)), auth=auth, replay_every=7
        )
        for _ in range(2)
    ]
    jobs = JobClient(base_url=rig.api, gen=Generator.create(gens.randrange(2**32)), auth=auth)
    queue = QueueTraffic(cluster.rabbitmq_url, topo.exchange, seed)
    runner = FaultRunner(
        cluster,
        pg,
        (*topo.shard_queues(), topo.dead_letter_queue),
        rig.mq_proxies,
        rig.db_proxies,
        rig.procs,
    )
    await runner.prepare()
    watch = await CommitWatch(rig.direct_dsn).start()
    stop = asyncio.Event()
    runs = [c.run(stop) for c in clients] + [jobs.run(stop), queue.run(stop)]
    traffic = [asyncio.create_task(r) for r in runs]
    faults = asyncio.create_task(runner.run(schedule))
    try:
        await asyncio.sleep(PLAN.seconds)
        await faults  # every fault over: nodes back, processes started again, proxies open
        stop.set()
        await asyncio.gather(*traffic)
        ended = runner.now()
        phases.end("traffic and faults")
        sent, shapes = queue.merged()
        for client in clients:
            sent.ids["transaction"] |= client.accepted.keys()
        sent.ids["credit_annotation"] |= jobs.annotations
        api_records = sum(len(c.accepted) for c in clients) + len(jobs.annotations)
        sent.published += api_records
        sent.valid += api_records
        audit, parked, unready = await settle_and_audit(
            rig, cluster, topo, sent, shapes, len(runner.applied), queue.unconfirmed
        )
    finally:
        stop.set()
        for task in (*traffic, faults):
            task.cancel()
        await asyncio.gather(*traffic, faults, return_exceptions=True)
        await watch.stop()
    phases.end("settle and audit")
    text = render(seed, runner, watch, clients, jobs, queue, audit, parked, ended)
    text += "\n  phases: " + ", ".join(f"{k} {v:.0f} s" for k, v in phases.took.items())
    print(text)
    assert unready == [], f"not ready at the end: {unready}"
    problems = [p for c in (*clients, jobs) for p in c.other]
    assert problems == [], f"answers no client should see: {problems[:10]}"
    assert Counter(f.kind for f in schedule) == Counter(a.kind for a in runner.applied)
    audit.assert_exact(dlq_surplus_allowed=True)
    return text


async def settle_and_audit(
    rig: Rig,
    cluster: RabbitCluster,
    topo: Topology,
    sent,
    shapes: Counter[str],
    faults: int,
    unconfirmed: dict[str, set[str]],
) -> tuple[Audit, int, list[str]]:
    opened: list[asyncpg.Connection] = []

    async def connect() -> asyncpg.Connection:
        opened.append(await pg_hosts.connect(rig.direct_dsn))
        return opened[-1]

    broker = await open_broker(cluster, topo)
    try:
        conn = await connect()
        await wait_until_settled(connect, broker, sent, timeout=PLAN.seconds * 3 + 120)

        async def outbox_sent() -> bool:
            return (
                int(await conn.fetchval("SELECT count(*) FROM outbox WHERE parked_at IS NULL")) == 0
            )

        await wait_for(outbox_sent, timeout=120, interval=0.25)
        with contextlib.suppress(AssertionError):
            await wait_for(lambda: _all_ready(rig.ports), timeout=60, interval=0.5)
        unready = await not_ready(rig.ports)
        parked = int(await conn.fetchval("SELECT count(*) FROM outbox"))
        for name, proc in rig.procs.items():
            assert proc.running, f"{name} died"
            assert await proc.terminate() == 0, f"{name} did not stop cleanly"
        audit = await audit_run(
            conn, broker, sent, faults=faults, expected_dlq=shapes, unconfirmed=unconfirmed
        )
    finally:
        await broker.close()
        for each in opened:
            each.terminate()
    return audit, parked, unready


def _active(applied: list[Applied], start: float, end: float) -> list[str]:
    return [f"{a.kind} {a.target}" for a in applied if a.began <= end and a.ended + 1 >= start]


def _sample_gap(watch: CommitWatch, since: float) -> float:
    """How long the commit watch itself went without a sample (its reconnects, a busy loop)
    between ``since`` and the last change it saw: a stretch without a commit no longer than this
    may be the watch's, not the recorders'."""
    changes = [t for (_, before), (t, v) in itertools.pairwise(watch.samples) if v != before]
    last = changes[-1] if changes else since
    times = [t for t, _ in watch.samples if since <= t <= last]
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def render(
    seed, runner, watch, clients, jobs, queue, audit: Audit, parked: int, ended: float
) -> str:
    t0 = runner.t0
    at, gap, _ = watch.longest_stall_span_after(t0)
    sent, _ = queue.merged()
    lines = [
        f"all-faults run, seed {seed}, {SHARDS} shard(s): reproduce with {reproduce(seed)}",
        f"  traffic {PLAN.seconds:.0f} s, faults over at t+{ended:.1f} s",
        f"  rows: {watch.latest()} records ({sum(len(c.accepted) for c in clients)} transactions"
        f" and {len(jobs.annotations)} annotations in {len(jobs.jobs)} jobs through the API,"
        f" {sum(len(i) for i in sent.ids.values())} valid records through the queue)",
        f"  queue: {sent.published} published ({sent.valid} valid, {sent.duplicates} duplicates,"
        f" {sent.invalid} invalid); {len(queue.failed_attempts)} chunks published again after a"
        f" failed publish (<= {queue.invalid_republished} invalid repeats)",
        f"  API: {sum(c.replays for c in clients)} deliberate replays, "
        f"{sum(len(c.unavailable) for c in (*clients, jobs))} answers 503 + Retry-After, "
        f"{sum(c.lost_answers for c in (*clients, jobs))} lost answers sent again",
        f"  DLQ: {audit.dlq_total} = {audit.dlq_total - audit.dlq_surplus} invalid + "
        f"{audit.dlq_surplus} repeats; outbox left: {parked} parked rows",
        "  faults applied:",
        *("    " + a.line() for a in sorted(runner.applied, key=lambda a: a.began)),
        "  by kind: "
        + ", ".join(
            f"{k} x{n}" for k, n in sorted(Counter(a.kind for a in runner.applied).items())
        ),
        f"  longest stretch without a commit: {gap:.2f} s from t+{at:.1f} s"
        f" (faults then: {', '.join(_active(runner.applied, at, at + gap)) or 'none'})",
        f"  (the watch's own longest gap between two samples: {_sample_gap(watch, t0):.2f} s)",
        f"  lost {audit.lost}, doubled {audit.doubled}",
    ]
    return "\n".join(lines)
