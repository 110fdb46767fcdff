"""Publish-to-commit latency at a steady offered load.

    python -m benchmarks.bench_latency                              # 250, 1,000, 2,000 msg/s, 8 s
    python -m benchmarks.bench_latency --loads 250 1000 4000 --seconds 30   # full size

The recorder (``python -m consumer``, settings from env vars) runs on an empty queue. A
publisher sends transactions at a steady rate (a tick every 10 ms, confirms on, many in
flight) and notes the time just before each publish. A poller asks PostgreSQL every
``--poll-ms`` which of the published ids are visible (``id = ANY($1)``, primary-key lookups):
a row is visible once its flush COMMITted, so publish -> visible is publish -> commit, within
the poll interval. The row's ``recorded_at`` (``now()`` at the start of the flush's DB
transaction) gives publish -> insert as well. The target: p99 <= flush timeout + 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field

import aio_pika
import asyncpg

from benchmarks.common import (
    RecorderConfig,
    RecorderProcess,
    Stat,
    add_recorder_arguments,
    emit,
    facts_table,
    machine_facts,
    progress,
    rabbitmq_url,
    run_main,
    save_json,
    table,
    temp_database,
    temp_topology,
)
from bulk_recorder.loadgen import Generator
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
    commit_ms: list[float] = field(default_factory=list)
    insert_ms: list[float] = field(default_factory=list)
    missing: int = 0


async def publish_steady(
    topology: Topology, rate: int, seconds: float, sent: dict[str, float]
) -> float:
    """Publish ``rate`` msg/s for ``seconds``; records id -> publish time in ``sent``."""
    gen = Generator.create(3)
    connection = await aio_pika.connect(rabbitmq_url())
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(topology.exchange, ensure=False)
        tasks: set[asyncio.Task[object]] = set()
        tick = 0.01
        started = time.monotonic()
        count = 0
        while (now := time.monotonic()) - started < seconds:
            while count < int(rate * (now - started)):
                record = gen.transaction()
                record["metadata"] = {"bench": "latency"}
                body = json.dumps(record, separators=(",", ":")).encode()
                sent[record["id"]] = time.time()
                task = asyncio.create_task(
                    exchange.publish(
                        aio_pika.Message(
                            body,
                            content_type="application/json",
                            type="transaction",
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                        ),
                        routing_key="transaction",
                    )
                )
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                count += 1
            await asyncio.sleep(max(0.0, now + tick - time.monotonic()))
        if tasks:
            await asyncio.gather(*tasks)
        return count / (time.monotonic() - started)
    finally:
        await connection.close()


async def poll_visible(
    dsn: str,
    sent: dict[str, float],
    seen: dict[str, float],
    stop: asyncio.Event,
    poll_s: float,
) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        while True:
            pending = [i for i in sent if i not in seen]
            if pending:
                rows = await conn.fetch(
                    "SELECT id::text FROM transactions WHERE id = ANY($1::uuid[])", pending
                )
                now = time.time()
                for row in rows:
                    seen[row[0]] = now
            elif stop.is_set():
                return
            if stop.is_set() and len(seen) >= len(sent):
                return
            await asyncio.sleep(poll_s)
    finally:
        await conn.close()


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
            poller = asyncio.create_task(poll_visible(dsn, sent, seen, stop, poll_s))
            achieved = await publish_steady(topology, rate, seconds, sent)
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
    out = Outcome(offered=rate, achieved=achieved)
    recorded = {r[0]: r[1] for r in rows}
    for record_id, t in sent.items():
        if record_id in seen:
            out.commit_ms.append((seen[record_id] - t) * 1000)
        else:
            out.missing += 1
        if record_id in recorded:
            out.insert_ms.append((recorded[record_id] - t) * 1000)
    return out


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
            s = stats.setdefault(rate, {})
            figures = {
                "achieved": o.achieved,
                "commit p50": quantile(o.commit_ms, 0.5),
                "commit p99": quantile(o.commit_ms, 0.99),
                "commit max": max(o.commit_ms, default=float("nan")),
                "insert p50": quantile(o.insert_ms, 0.5),
                "insert p99": quantile(o.insert_ms, 0.99),
                "missing": float(o.missing),
            }
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
                "not seen",
            ],
            rows,
        ),
    )
    save_json(args.json, {"facts": facts, "config": config.label(), "results": raw})


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
