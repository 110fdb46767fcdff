"""Publish-to-commit latency at a steady offered load.

    python -m benchmarks.bench_latency                              # 250, 1,000, 2,000 msg/s, 8 s
    python -m benchmarks.bench_latency --loads 250 1000 4000 --seconds 30   # full size

The recorder (``python -m consumer``, settings from env vars) runs on an empty queue. A
publisher sends transactions at a steady rate (a tick every 10 ms, its messages in one write,
confirms on, many in flight) and notes the time just before each publish. A poller asks
PostgreSQL every ``--poll-ms`` which of the published ids are visible (``id = ANY($1)``,
primary-key lookups): a row is visible once its flush committed, so publish -> visible is
publish -> commit, within the poll interval. The row's ``recorded_at`` (``now()`` when the
flush's statement starts) gives publish -> insert as well. The target: p99 <= flush timeout +
50 ms.

Each load is then run again with a bare aiormq consume+ack consumer (``benchmarks.bare_consumer``,
a process of its own, at the recorder's channel QoS) instead of the recorder: its publish ->
delivered is the broker-only floor, and its CPU per message (CPU seconds from /proc over the
publishing window / messages published) is what the recorder's is judged against. The target:
recorder CPU per message <= 1.2x the bare consumer's at 1,000 msg/s (ratio taken per round).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
import aiormq
import asyncpg

from benchmarks.support.env import REPO, add_recorder_arguments, rabbitmq_url, run_main
from benchmarks.support.machine import cpu_seconds, facts_table, machine_cpu, machine_facts
from benchmarks.support.recorder import RecorderConfig, RecorderProcess
from benchmarks.support.services import temp_database, temp_topology
from benchmarks.support.stats import Stat, emit, progress, ratio, save_json, table
from bulk_recorder.infra.aiormq_internals import write_publishes
from consumer.tools.generator import Generator
from consumer.topology import Topology


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(slots=True)
class Outcome:
    offered: float
    achieved: float
    published: int  # messages published in the measured window
    commit_ms: list[float] = field(default_factory=list)
    insert_ms: list[float] = field(default_factory=list)
    missing: int = 0
    cpu_s: float = 0.0  # CPU seconds of the consumer (recorder or bare) over the window
    machine_busy: float = 0.0  # share of all cores busy while the load ran (0..1)


def delays_ms(sent: dict[str, float], arrived: dict[str, float]) -> list[float]:
    """Arrival minus publish time, in ms, for every id sent that arrived."""
    return [(arrived[i] - t) * 1000 for i, t in sent.items() if i in arrived]


async def publish_steady(
    topology: Topology,
    rate: int,
    seconds: float,
    sent: dict[str, float],
    fresh: list[str] | None = None,
) -> float:
    """Publish ``rate`` msg/s for ``seconds``; records id -> publish time in ``sent``.

    Each id also goes to ``fresh``, if given, for a poller to take without rescanning ``sent``.
    """
    gen = Generator.create(3)
    connection = await aio_pika.connect(rabbitmq_url())
    try:
        channel = await connection.channel(publisher_confirms=True)
        await channel.get_exchange(topology.exchange)
        raw = await channel.get_underlay_channel()
        confirms: set[asyncio.Future[list[aiormq.abc.ConfirmationFrameType]]] = set()
        tick = 0.01
        started = time.monotonic()
        count = 0
        while (now := time.monotonic()) - started < seconds:
            batch = []  # this tick's messages, in one write (the load generator's lean path)
            while count < int(rate * (now - started)):
                record = gen.transaction()
                record["metadata"] = {"bench": "latency"}
                body = json.dumps(record, separators=(",", ":")).encode()
                properties = aiormq.spec.Basic.Properties(
                    message_id=record["id"],
                    content_type="application/json",
                    message_type="transaction",
                    delivery_mode=2,
                )
                batch.append((topology.exchange, "transaction", properties, body))
                sent[record["id"]] = time.time()
                if fresh is not None:
                    fresh.append(record["id"])
                count += 1
            if batch:
                done = asyncio.gather(*await write_publishes(raw, batch))
                confirms.add(done)
                done.add_done_callback(confirms.discard)
            await asyncio.sleep(max(0.0, now + tick - time.monotonic()))
        if confirms:
            await asyncio.gather(*confirms)
        return count / (time.monotonic() - started)
    finally:
        await connection.close()


async def poll_visible(
    dsn: str,
    fresh: list[str],
    seen: dict[str, float],
    stop: asyncio.Event,
    poll_s: float,
) -> None:
    """Every ``poll_s``, look up the ids published and not seen yet.

    Only the pending ids are walked (the publisher hands new ids over in ``fresh``): a poller
    that rescanned everything sent would burn a good part of a core at 1,000 msg/s and take it
    from the system it measures.
    """
    conn = await asyncpg.connect(dsn)
    pending: set[str] = set()
    try:
        while True:
            if fresh:
                pending.update(fresh)
                fresh.clear()
            if pending:
                rows = await conn.fetch(
                    "SELECT id::text FROM transactions WHERE id = ANY($1::uuid[])", list(pending)
                )
                now = time.time()
                for row in rows:
                    seen[row[0]] = now
                    pending.discard(row[0])
            elif stop.is_set():
                return
            await asyncio.sleep(poll_s)
    finally:
        await conn.close()


async def run_broker_only(config: RecorderConfig, rate: int, seconds: float) -> Outcome:
    """The floor: the same load and queue with a bare aiormq consumer that acks each message.

    The consumer (``benchmarks.bare_consumer``) is a process of its own, with the recorder's
    channel QoS, so that its CPU is measured over the same window as the recorder's in
    ``run_load`` (from just before publishing starts to just after it ends). publish ->
    delivered there is what the broker (a quorum queue: replicated log, fsync) costs before any
    recorder could see a message; the recorder's latency is judged against it.
    """
    async with temp_topology("bench_latency_raw") as topology:
        sent: dict[str, float] = {}
        with tempfile.TemporaryDirectory(prefix="bench_latency_") as tmp:
            out = Path(tmp) / "delivered.json"
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "benchmarks.bare_consumer",
                "--url",
                rabbitmq_url(),
                "--queue",
                topology.queue,
                "--prefetch",
                str(config.channel_prefetch),
                "--out",
                str(out),
                cwd=REPO,
                stdout=asyncio.subprocess.PIPE,
            )
            try:
                assert proc.stdout is not None
                line = await asyncio.wait_for(proc.stdout.readline(), timeout=30)
                if line.strip() != b"ready":
                    raise RuntimeError(f"bare consumer did not start: {line!r}")
                cpu_before = cpu_seconds(proc.pid)
                achieved = await publish_steady(topology, rate, seconds, sent)
                consumer_cpu_s = cpu_seconds(proc.pid) - cpu_before
                # Wait (up to 30 s) for every message to arrive: SIGUSR1 makes it print a count.
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    proc.send_signal(signal.SIGUSR1)
                    count = await asyncio.wait_for(proc.stdout.readline(), timeout=5)
                    if int(count) >= len(sent):
                        break
                    await asyncio.sleep(0.05)
                proc.send_signal(signal.SIGTERM)
                if await asyncio.wait_for(proc.wait(), timeout=30) != 0:
                    raise RuntimeError(f"bare consumer exited with {proc.returncode}")
                delivered: dict[str, float] = json.loads(out.read_text(encoding="utf-8"))[
                    "delivered"
                ]
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
    delays = delays_ms(sent, delivered)  # in commit_ms: "commit" is "delivered" here
    return Outcome(
        rate,
        achieved,
        published=len(sent),
        commit_ms=delays,
        missing=len(sent) - len(delays),
        cpu_s=consumer_cpu_s,
    )


async def run_load(config: RecorderConfig, rate: int, seconds: float, poll_s: float) -> Outcome:
    async with (
        temp_topology("bench_latency") as topology,
        temp_database("bench_latency") as (
            dsn,
            _,
        ),
    ):
        recorder = RecorderProcess(dsn, topology, config)
        try:
            await recorder.wait_ready()
            sent: dict[str, float] = {}
            seen: dict[str, float] = {}
            stop = asyncio.Event()
            fresh: list[str] = []
            poller = asyncio.create_task(poll_visible(dsn, fresh, seen, stop, poll_s))
            cpu_before, (busy_before, total_before) = recorder.cpu_seconds(), machine_cpu()
            achieved = await publish_steady(topology, rate, seconds, sent, fresh)
            busy_after, total_after = machine_cpu()
            recorder_cpu_s = recorder.cpu_seconds() - cpu_before
            stop.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(poller, timeout=30)
        finally:
            recorder.stop()
        conn = await asyncpg.connect(dsn)
        try:
            rows = await conn.fetch(
                "SELECT id::text, extract(epoch FROM recorded_at)::float8 FROM transactions"
            )
        finally:
            await conn.close()
    commit_ms = delays_ms(sent, seen)
    return Outcome(
        rate,
        achieved,
        published=len(sent),
        commit_ms=commit_ms,
        insert_ms=delays_ms(sent, {r[0]: r[1] for r in rows}),
        missing=len(sent) - len(commit_ms),
        cpu_s=recorder_cpu_s,
        machine_busy=(busy_after - busy_before) / max(total_after - total_before, 1e-9),
    )


async def main_async(args: argparse.Namespace) -> None:
    facts = await machine_facts()
    emit("Machine", facts_table(facts))
    config = RecorderConfig(args.workers, args.prefetch, args.size, args.timeout_ms)
    stats: dict[int, dict[str, Stat]] = {}
    raw = []
    for run in range(args.runs):
        for rate in args.loads:
            progress(f"run {run + 1}/{args.runs}: {rate:,} msg/s for {args.seconds:g} s")
            o = await run_load(config, rate, args.seconds, args.poll_ms / 1000)
            floor = await run_broker_only(config, rate, args.seconds)
            s = stats.setdefault(rate, {})
            figures = {
                "broker p50": quantile(floor.commit_ms, 0.5),
                "broker p99": quantile(floor.commit_ms, 0.99),
                "achieved": o.achieved,
                "commit p50": quantile(o.commit_ms, 0.5),
                "commit p99": quantile(o.commit_ms, 0.99),
                "commit max": max(o.commit_ms, default=float("nan")),
                "insert p50": quantile(o.insert_ms, 0.5),
                "insert p99": quantile(o.insert_ms, 0.99),
                "missing": float(o.missing),
                "broker missing": float(floor.missing),
                "recorder us/msg": o.cpu_s / max(o.published, 1) * 1e6,
                "bare aiormq us/msg": floor.cpu_s / max(floor.published, 1) * 1e6,
                "machine busy %": o.machine_busy * 100,
            }
            figures["p99 over broker"] = figures["commit p99"] - figures["broker p99"]
            figures["recorder / bare CPU"] = (
                figures["recorder us/msg"] / figures["bare aiormq us/msg"]
                if figures["bare aiormq us/msg"]
                else float("nan")
            )
            for k, v in figures.items():
                s.setdefault(k, Stat()).add(v)
            raw.append({"run": run, "rate": rate, **figures})
    target = args.timeout_ms + 50
    rows = []
    for rate in args.loads:
        s = stats[rate]
        p99 = s["commit p99"].median
        rows.append(
            (
                f"{rate:,}",
                s["achieved"].fmt(),
                s["commit p50"].fmt(1),
                s["commit p99"].fmt(1),
                s["commit max"].fmt(1),
                s["insert p50"].fmt(1),
                s["insert p99"].fmt(1),
                f"{p99 / target:.2f}x of {target} ms",
                s["broker p50"].fmt(1),
                s["broker p99"].fmt(1),
                s["p99 over broker"].fmt(1),
                s["recorder us/msg"].fmt(),
                s["bare aiormq us/msg"].fmt(),
                ratio(s["recorder us/msg"], s["bare aiormq us/msg"]).fmt(2, "x"),
                s["machine busy %"].fmt(),
                s["missing"].fmt(),
            )
        )
    emit(
        f"Publish -> commit latency, {config.label()} (size {config.batch_size}), "
        f"{args.seconds:g} s a load, poll every {args.poll_ms:g} ms, median (min-max) of "
        f"{args.runs} runs, in ms",
        table(
            [
                "offered msg/s",
                "published msg/s",
                "commit p50",
                "commit p99",
                "commit max",
                "insert p50",
                "insert p99",
                "p99 vs target",
                "broker-only p50",
                "broker-only p99",
                "commit p99 - broker-only p99",
                "recorder CPU us/msg",
                "bare aiormq consume+ack CPU us/msg",
                "recorder / bare CPU",
                "machine busy % (all cores)",
                "not seen",
            ],
            rows,
        ),
    )
    save_json(
        args.json,
        {"facts": facts, "config": config.label(), "target_ms": target, "results": raw},
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--loads", type=int, nargs="+", default=[250, 1000, 2000])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--poll-ms", type=float, default=5.0)
    add_recorder_arguments(parser)
    parser.add_argument("--json", help="write raw results here (for the charts)")
    return parser


def main() -> None:
    run_main(build_parser(), main_async)


if __name__ == "__main__":
    main()
