"""Peak RSS of the recorder while it drains a 300,000-record run, and whether it grows.

    python -m benchmarks.bench_memory                     # quick: 60,000 records
    python -m benchmarks.bench_memory --count 300000      # full size (the main job's batch)

The queue is pre-filled with ``--count`` records (half transactions, half credit annotations,
loadgen), then the recorder (``python -m consumer``) drains it while VmRSS is read from
/proc/<pid>/status at every /metrics poll (every 50 ms). Reported: RSS once connected (first
1% acked), at 25/50/75/100% of the run, the peak, and the growth from 25% to 100% (a leak
would show as growth that scales with the count; a flat line is the goal: <= 200 MB).
"""

from __future__ import annotations

import argparse

from benchmarks.support.env import add_recorder_arguments, database_url, run_main
from benchmarks.support.machine import PgCpu, facts_table, machine_facts
from benchmarks.support.recorder import RecorderConfig, RecorderProcess, drain
from benchmarks.support.services import fill, temp_database, temp_topology
from benchmarks.support.stats import Stat, emit, progress, save_json, table

MARKS = (0.01, 0.25, 0.5, 0.75, 1.0)


async def run_once(config: RecorderConfig, count: int) -> tuple[dict[float, float], float, float]:
    """(RSS MiB at each mark, peak MiB, msg/s)."""
    half = count // 2
    at: dict[float, float] = {}
    async with (
        temp_topology("bench_memory") as topology,
        temp_database("bench_memory") as (
            dsn,
            name,
        ),
    ):
        await fill(topology, half, "transaction")
        await fill(topology, count - half, "credit_annotation", ready=count)
        recorder = RecorderProcess(dsn, topology, config)

        def on_sample(now: float, acked: float, rss: list[float]) -> None:
            for mark in MARKS:
                if mark not in at and acked >= mark * count:
                    at[mark] = rss[0]

        try:
            result = await drain(
                [recorder], count, PgCpu(database_url(), name), on_sample=on_sample
            )
        finally:
            recorder.stop()
    return at, result.rss_peak_mib, result.rate


async def main_async(args: argparse.Namespace) -> None:
    facts = await machine_facts()
    emit("Machine", facts_table(facts))
    config = RecorderConfig(args.workers, args.prefetch, args.size, args.timeout_ms)
    marks: dict[float, Stat] = {m: Stat() for m in MARKS}
    peak, growth, rate = Stat(), Stat(), Stat()
    raw = []
    for run in range(args.runs):
        progress(f"run {run + 1}/{args.runs}: {args.count:,} records, {config.label()}")
        at, top, r = await run_once(config, args.count)
        for m in MARKS:
            marks[m].add(at.get(m, float("nan")))
        peak.add(top)
        growth.add(at.get(1.0, float("nan")) - at.get(0.25, float("nan")))
        rate.add(r)
        raw.append({"run": run, "at": at, "peak": top, "rate": r})
    rows = [(f"{int(m * 100)}% acked", marks[m].fmt(1)) for m in MARKS]
    rows += [
        ("**peak**", peak.fmt(1)),
        ("growth 25% -> 100%", growth.fmt(1)),
        ("peak vs 200 MB target", f"{peak.median * 1.048576 / 200:.2f}x"),
        ("msg/s while sampled", rate.fmt()),
    ]
    emit(
        f"Recorder RSS (MiB) while draining {args.count:,} records ({config.label()}), "
        f"median (min-max) of {args.runs} runs",
        table(["when", "RSS MiB"], rows),
    )
    save_json(args.json, {"facts": facts, "config": config.label(), "results": raw})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=60_000)
    parser.add_argument("--runs", type=int, default=3)
    add_recorder_arguments(parser)
    parser.add_argument("--json", help="write raw results here (for the charts)")
    return parser


def main() -> None:
    run_main(build_parser(), main_async)


if __name__ == "__main__":
    main()
