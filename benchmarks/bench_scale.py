"""Scale-out: 1, 2 and 3 recorder processes on one queue (and one database).

    python -m benchmarks.bench_scale                       # quick: 30,000 records
    python -m benchmarks.bench_scale --count 200000        # full size

Each round pre-fills the queue (loadgen, transactions) and drains it with N recorder
processes started together (``python -m consumer``, same settings, each its own metrics
port); the rate is the sum of their acks from the first 1% to the last. The raw aio-pika
consume-and-ack limit with one process is measured in the same round for reference. On this
2-core machine the broker and PostgreSQL share the cores with the recorders, so the second
process can only use what the first left idle.
"""

from __future__ import annotations

import argparse

from benchmarks.bench_limits import consume
from benchmarks.support.env import add_recorder_arguments, database_url, run_main
from benchmarks.support.machine import PgCpu, facts_table, machine_facts
from benchmarks.support.recorder import RecorderConfig, RecorderProcess, drain
from benchmarks.support.services import count_rows, fill, temp_database, temp_topology
from benchmarks.support.stats import Stat, emit, progress, ratio, save_json, table


async def run_processes(config: RecorderConfig, count: int, processes: int) -> tuple[float, float]:
    """(msg/s, recorder CPU us/msg summed over processes)."""
    async with (
        temp_topology("bench_scale") as topology,
        temp_database("bench_scale") as (
            dsn,
            name,
        ),
    ):
        await fill(topology, count, "transaction")
        recorders = [RecorderProcess(dsn, topology, config) for _ in range(processes)]
        try:
            result = await drain(recorders, count, PgCpu(database_url(), name))
        finally:
            codes = [r.stop() for r in recorders]
        if any(codes):
            raise RuntimeError(f"recorder exit codes {codes}")
        rows = await count_rows(dsn, "transactions")
        if rows != count:
            raise RuntimeError(f"{rows} rows recorded, {count} published")
    n = result.rate * result.seconds
    return result.rate, result.recorder_cpu_s / n * 1e6


async def run_raw(count: int, qos: int) -> float:
    async with temp_topology("bench_scale") as topology:
        await fill(topology, count, "transaction")
        return (await consume("aio-pika ack", topology.queue, qos, count)).rate


async def main_async(args: argparse.Namespace) -> None:
    facts = await machine_facts()
    emit("Machine", facts_table(facts))
    config = RecorderConfig(args.workers, args.prefetch, args.size, args.timeout_ms)
    rates: dict[str, Stat] = {}
    cpu: dict[str, Stat] = {}
    modes = ["raw aio-pika, 1 process", *(f"{n} recorder(s)" for n in args.processes)]
    for run in range(args.runs):
        shift = run % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            progress(f"run {run + 1}/{args.runs}: {mode}, {args.count:,} records")
            if mode.startswith("raw"):
                rates.setdefault(mode, Stat()).add(
                    await run_raw(args.count, config.channel_prefetch)
                )
                continue
            n = int(mode.split()[0])
            rate, us = await run_processes(config, args.count, n)
            rates.setdefault(mode, Stat()).add(rate)
            cpu.setdefault(mode, Stat()).add(us)
    one = rates.get(f"{args.processes[0]} recorder(s)")
    raw = rates["raw aio-pika, 1 process"]
    rows = []
    for mode in modes:
        rows.append(
            (
                mode,
                rates[mode].fmt(),
                ratio(rates[mode], one).fmt(2, "x") if one else "-",
                ratio(rates[mode], raw).fmt(2, "x"),
                cpu[mode].fmt(1) if mode in cpu else "-",
            )
        )
    emit(
        f"Scale-out ({args.count:,} transactions a run, {config.label()}, median (min-max) of "
        f"{args.runs} runs)",
        table(
            [
                "processes",
                "msg/s",
                f"vs {args.processes[0]} recorder",
                "vs raw aio-pika (1 process)",
                "recorder CPU us/msg",
            ],
            rows,
        ),
    )
    save_json(
        args.json,
        {
            "facts": facts,
            "config": config.label(),
            "rates": {k: s.values for k, s in rates.items()},
            "cpu_us": {k: s.values for k, s in cpu.items()},
        },
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=30_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 3])
    add_recorder_arguments(parser)
    parser.add_argument("--json", help="write raw results here (for the charts)")
    return parser


def main() -> None:
    run_main(build_parser(), main_async)


if __name__ == "__main__":
    main()
