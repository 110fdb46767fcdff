"""Sweep workers x prefetch x size x timeout: throughput and how full the flushes are.

    python -m benchmarks.bench_sweep                        # the standard points, 20,000 records
    python -m benchmarks.bench_sweep --grid --workers 1 5 10 --prefetch 10 100 200 \\
        --size 0 1000 --timeout-ms 100 1000 --count 50000     # a full grid

For every configuration: pre-fill the queue (loadgen, transactions), drain it with the real
recorder (``python -m consumer``), and read its /metrics: msg/s (first 1% to last ack),
``bulk_recorder_flush_size`` (mean, median bucket, share of full flushes) and
``bulk_recorder_flushes_total{reason}`` (does the batch fill, or does the timer cut it?), and
the recorder's CPU per message. The default configuration (workers 5, prefetch 10, size 0 =
workers x prefetch, 100 ms) is run in every round and every other point is also given as a
ratio to it in the same round. The order of the points is shuffled per round.
"""

from __future__ import annotations

import argparse
import itertools
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.support.env import database_url, run_main
from benchmarks.support.machine import PgCpu, facts_table, machine_facts
from benchmarks.support.recorder import (
    RecorderConfig,
    RecorderProcess,
    drain,
    histogram_buckets,
    histogram_quantile,
)
from benchmarks.support.services import fill, temp_database, temp_topology
from benchmarks.support.stats import Stat, emit, progress, save_json, table

DEFAULT = (5, 10, 0, 100)
# (workers, prefetch, size, timeout ms): defaults, then what the tuning guide needs to know.
STANDARD = [
    DEFAULT,
    (5, 10, 0, 1000),  # default sizes, longer timeout
    (5, 40, 0, 100),  # size 200
    (5, 100, 0, 100),  # size 500
    (5, 200, 0, 100),  # size 1000
    (5, 10, 1000, 100),  # size 1000 set explicitly, small per-worker prefetch
    (2, 500, 0, 100),  # size 1000, two flush workers
    (10, 100, 0, 100),  # size 1000, ten flush workers
    (5, 400, 0, 100),  # size 2000
]


@dataclass(slots=True)
class Point:
    rate: Stat = field(default_factory=Stat)
    vs_default: Stat = field(default_factory=Stat)
    cpu_us: Stat = field(default_factory=Stat)
    pg_ms_per_1k: Stat = field(default_factory=Stat)
    mean_flush: Stat = field(default_factory=Stat)
    median_flush: Stat = field(default_factory=Stat)
    size_share: Stat = field(default_factory=Stat)  # % of flushes cut by size
    flushes: Stat = field(default_factory=Stat)


@dataclass(slots=True)
class Outcome:
    rate: float
    cpu_us: float
    pg_ms_per_1k: float
    mean_flush: float
    median_flush: float
    size_share: float
    flushes: float
    by_reason: dict[str, float]
    buckets: list[tuple[float, float]]


async def run_point(config: RecorderConfig, count: int) -> Outcome:
    async with (
        temp_topology("bench_sweep") as topology,
        temp_database("bench_sweep") as (
            dsn,
            name,
        ),
    ):
        await fill(topology, count, "transaction")
        recorder = RecorderProcess(dsn, topology, config)
        try:
            result = await drain([recorder], count, PgCpu(database_url(), name))
        finally:
            code = recorder.stop()
        if code != 0:
            raise RuntimeError(f"recorder exited with {code}")
    m = result.metrics
    n = result.seconds * result.rate
    buckets = histogram_buckets(m, "bulk_recorder_flush_size")
    flushes = m.get("bulk_recorder_flush_size_count", 0.0)
    by_reason = {
        reason: m.get(f"bulk_recorder_flushes_total{{reason={reason}}}", 0.0)
        for reason in ("size", "timeout", "shutdown")
    }
    return Outcome(
        rate=result.rate,
        cpu_us=result.recorder_cpu_s / n * 1e6,
        pg_ms_per_1k=result.pg_cpu_s / n * 1e6,
        mean_flush=m.get("bulk_recorder_flush_size_sum", 0.0) / flushes if flushes else 0.0,
        median_flush=histogram_quantile(buckets, 0.5),
        size_share=100 * by_reason["size"] / flushes if flushes else 0.0,
        flushes=flushes,
        by_reason=by_reason,
        buckets=buckets,
    )


async def main_async(args: argparse.Namespace) -> None:
    facts = await machine_facts()
    emit("Machine", facts_table(facts))
    if args.grid:
        points = list(itertools.product(args.workers, args.prefetch, args.size, args.timeout_ms))
    else:
        points = list(STANDARD)
    if DEFAULT not in points:
        points.insert(0, DEFAULT)
    results: dict[tuple[int, int, int, int], Point] = {p: Point() for p in points}
    raw: list[dict[str, Any]] = []
    for run in range(args.runs):
        order = list(points)
        random.Random(run).shuffle(order)
        rates: dict[tuple[int, int, int, int], float] = {}
        for i, point in enumerate(order, 1):
            config = RecorderConfig(*point)
            progress(
                f"run {run + 1}/{args.runs}, point {i}/{len(order)}: {config.label()} "
                f"(QoS {config.channel_prefetch})"
            )
            out = await run_point(config, args.count)
            raw.append({"run": run, "point": point, **asdict(out)})
            rates[point] = out.rate
            r = results[point]
            r.rate.add(out.rate)
            r.cpu_us.add(out.cpu_us)
            r.pg_ms_per_1k.add(out.pg_ms_per_1k)
            r.mean_flush.add(out.mean_flush)
            r.median_flush.add(out.median_flush)
            r.size_share.add(out.size_share)
            r.flushes.add(out.flushes)
        base_rate = rates[DEFAULT]
        for point, rate in rates.items():
            results[point].vs_default.add(rate / base_rate)
    rows = []
    for point in points:
        config = RecorderConfig(*point)
        r = results[point]
        rows.append(
            (
                point[0],
                point[1],
                f"{config.batch_size}" + ("" if point[2] else " (w x p)"),
                point[3],
                config.channel_prefetch,
                r.rate.fmt(),
                r.vs_default.fmt(2, "x"),
                r.mean_flush.fmt(0),
                r.median_flush.fmt(0),
                r.size_share.fmt(0, "%"),
                r.cpu_us.fmt(1),
                r.pg_ms_per_1k.fmt(0),
            )
        )
    emit(
        f"Sweep ({args.count:,} transactions a point, median (min-max) of {args.runs} runs; "
        "'median flush' is the upper bound of the histogram bucket holding the median)",
        table(
            [
                "workers",
                "prefetch",
                "size",
                "timeout ms",
                "QoS",
                "msg/s",
                "vs default (same run)",
                "mean flush",
                "median flush",
                "flushes cut by size",
                "CPU us/msg",
                "PG CPU ms/1k",
            ],
            rows,
        ),
    )
    save_json(args.json, {"facts": facts, "settings": vars(args), "results": raw})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--grid", action="store_true", help="sweep the lists below, not STANDARD")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 5, 10])
    parser.add_argument("--prefetch", type=int, nargs="+", default=[10, 100, 200])
    parser.add_argument("--size", type=int, nargs="+", default=[0, 1000])
    parser.add_argument("--timeout-ms", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--json", help="write raw results here (for the charts)")
    return parser


def main() -> None:
    run_main(build_parser(), main_async)


if __name__ == "__main__":
    main()
