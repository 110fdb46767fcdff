"""Bulk recorder against the FastStream per-message subscriber, side by side (issue 22).

    python -m benchmarks.bench_faststream --count 100000 --faststream-count 20000 --runs 3

Each round, for each record type, the queue (the recorder's own topology, unique names) is
pre-filled and drained by
- ``bulk``: ``python -m consumer`` in bulk mode with the service's defaults (5 workers,
  prefetch 10, batch 50), as ``bench_e2e`` runs it;
- ``per-message`` (with ``--with-per-message``): the recorder with ``BULK_RECORDER_ENABLED=false``,
  to show the peer is not handicapped: per-message work costs about the same in both;
- ``faststream``: ``benchmarks/faststream_subscriber.py``, a FastStream subscriber with channel
  QoS 50 and an asyncpg pool of 5 that decodes and writes each record in a transaction of its
  own and is acked after it (the same decoder and statements as the recorder).
The order alternates per round. Rates and CPU are read over the same window for both: from
the first 1% of the records to the last. Each run gets a fresh database, checked afterwards to
hold exactly the records published. The issue's target: bulk x5 or more.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys

from benchmarks.bench_e2e import run_recorder
from benchmarks.support.env import REPO, add_recorder_arguments, rabbitmq_url, run_main
from benchmarks.support.machine import facts_table, machine_facts
from benchmarks.support.recorder import RecorderConfig
from benchmarks.support.services import count_rows, fill, temp_database, temp_topology
from benchmarks.support.stats import Stat, emit, progress, ratio, save_json, table

TABLE_OF = {"transaction": "transactions", "credit_annotation": "credit_annotations"}


async def run_faststream(
    record_type: str, count: int, prefetch: int, pool: int
) -> tuple[float, float]:
    """Fill, drain with the FastStream subscriber; (msg/s, subscriber CPU us/msg)."""
    async with temp_topology("bench_fs") as topology, temp_database("bench_fs") as (dsn, _):
        await fill(topology, count, record_type)
        command = [
            sys.executable,
            "-m",
            "benchmarks.faststream_subscriber",
            f"--url={rabbitmq_url()}",
            f"--dsn={dsn}",
            f"--queue={topology.queue}",
            f"--count={count}",
            f"--prefetch={prefetch}",
            f"--pool={pool}",
        ]
        process = await asyncio.create_subprocess_exec(*command, cwd=REPO, stdout=subprocess.PIPE)
        assert process.stdout is not None
        figures: dict[str, float] = {}
        async for line in process.stdout:
            if line.startswith(b"{"):
                figures = json.loads(line)
        code = await process.wait()
        if code != 0 or not figures:
            raise RuntimeError(f"the FastStream subscriber exited with {code}")
        rows = await count_rows(dsn, TABLE_OF[record_type])
        if rows != count:
            raise RuntimeError(f"{rows} rows recorded, {count} published")
        handled = figures["handled"]
        return handled / figures["seconds"], figures["cpu_s"] / handled * 1e6


async def main_async(args: argparse.Namespace) -> None:
    facts = await machine_facts()
    emit("Machine", facts_table(facts))
    bulk = RecorderConfig(args.workers, args.prefetch, args.size, args.timeout_ms, bulk=True)
    emit(
        "Settings",
        f"bulk: workers {args.workers}, prefetch {args.prefetch}, size {bulk.batch_size}, "
        f"channel QoS {bulk.channel_prefetch}, {args.count:,} records a run; FastStream: QoS "
        f"{args.fs_prefetch}, pool {args.fs_pool}, {args.faststream_count:,} records a run.",
    )
    single = RecorderConfig(args.workers, args.prefetch, args.size, args.timeout_ms, bulk=False)
    rates: dict[tuple[str, str], Stat] = {}
    cpu: dict[tuple[str, str], Stat] = {}
    for run in range(args.runs):
        for record_type in args.types:
            modes = ["bulk", "faststream", *(["per-message"] if args.with_per_message else [])]
            for mode in modes if run % 2 == 0 else modes[::-1]:
                count = args.count if mode == "bulk" else args.faststream_count
                progress(f"run {run + 1}/{args.runs}: {record_type}, {mode}, {count:,} records")
                if mode != "faststream":
                    config = bulk if mode == "bulk" else single
                    rate, us, _, _ = await run_recorder(record_type, count, config, None)
                else:
                    rate, us = await run_faststream(
                        record_type, count, args.fs_prefetch, args.fs_pool
                    )
                rates.setdefault((record_type, mode), Stat()).add(rate)
                cpu.setdefault((record_type, mode), Stat()).add(us)
    rows = []
    for record_type in args.types:
        peer = rates[(record_type, "faststream")]
        for mode in ("bulk", "faststream", "per-message"):
            if (record_type, mode) not in rates:
                continue
            rows.append(
                (
                    record_type,
                    mode,
                    rates[(record_type, mode)].fmt(),
                    ratio(rates[(record_type, mode)], peer).fmt(1, "x"),
                    cpu[(record_type, mode)].fmt(1),
                )
            )
    emit(
        f"Bulk recorder vs FastStream per-message subscriber, median (min-max) of {args.runs} "
        "rounds",
        table(["type", "mode", "msg/s", "vs FastStream", "consumer CPU us/msg"], rows),
    )
    save_json(
        args.json,
        {
            "facts": facts,
            "settings": vars(args),
            "results": [
                {"type": k[0], "mode": k[1], "rate": v.values, "cpu_us": cpu[k].values}
                for k, v in rates.items()
            ],
        },
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=50_000, help="records per bulk run")
    parser.add_argument(
        "--faststream-count", type=int, default=10_000, help="records per FastStream run"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--types", nargs="+", choices=tuple(TABLE_OF), default=["transaction", "credit_annotation"]
    )
    add_recorder_arguments(parser)
    parser.add_argument("--fs-prefetch", type=int, default=50, help="FastStream channel QoS")
    parser.add_argument("--fs-pool", type=int, default=5, help="FastStream asyncpg pool size")
    parser.add_argument(
        "--with-per-message",
        action="store_true",
        help="also run the recorder's own per-message mode (--faststream-count records)",
    )
    parser.add_argument("--json", help="write raw results here")
    return parser


def main() -> None:
    run_main(build_parser(), main_async)


if __name__ == "__main__":
    main()
