"""The job intake alone, as the API runs it, without HTTP or a database: a 300,000-line NDJSON
body fed in 64 KiB chunks on one event loop, validated there (``API_JOB_WORKERS=0``: JobIntake)
or by N job workers (BlockIntake and JobWorkers, answers applied in order), side by side.

    python -m benchmarks.bench_job_intake --count 300000 --workers 0 2 --rounds 3

Printed per variant: wall seconds to the last line validated and merged, lines/s, and the
loop's own CPU seconds (this thread) -- what is left for the API's other requests. Same result
checked: the counts of every variant are equal.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections import deque
from typing import Any

from benchmarks.bench_api_latency import make_job
from benchmarks.support.env import use_uvloop
from benchmarks.support.stats import emit, progress, table
from bulk_recorder.producer.ingest import JobIntake
from bulk_recorder.producer.job_blocks import BlockIntake, Validated
from bulk_recorder.producer.job_workers import JobWorkers
from bulk_recorder.producer.parsers import parser_for

JOB = "0193a3c4-0000-7000-8000-0000000000ff"
LIMIT = 1_048_576
CHUNK = 65_536


async def on_loop(body: bytes) -> int:
    intake = JobIntake(JOB, parser_for("ndjson", LIMIT), max_body_bytes=LIMIT, max_lines=10**6)
    for start in range(0, len(body), CHUNK):
        intake.feed(body[start : start + CHUNK])
        intake.take_rows()
        await asyncio.sleep(0)
    intake.finish()
    return intake.accepted


async def by_workers(body: bytes, workers: JobWorkers) -> int:
    intake = BlockIntake(parser_for("ndjson", LIMIT), max_lines=10**6)
    pending: deque[asyncio.Future[Validated]] = deque()
    for start in range(0, len(body) + 1, CHUNK):
        chunk = body[start : start + CHUNK]
        block = intake.feed(chunk) if chunk else intake.finish()
        if block is not None:
            pending.append(asyncio.ensure_future(workers.validate(JOB, LIMIT, block)))
        while pending and (pending[0].done() or len(pending) > 4 * workers.size):
            intake.apply(await pending.popleft())
            intake.take_rows()
    while pending:
        intake.apply(await pending.popleft())
    return intake.accepted


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    body = make_job(args.count, 1)
    pools = {n: JobWorkers(n) for n in args.workers if n}
    for pool in pools.values():  # started and warm before the first round
        await by_workers(make_job(100, 2), pool)
    out = []
    for number in range(args.rounds):
        turn = number % len(args.workers)
        for n in args.workers[turn:] + args.workers[:turn]:
            load = os.getloadavg()[0]
            wall, cpu = time.perf_counter(), time.thread_time()
            accepted = await (by_workers(body, pools[n]) if n else on_loop(body))
            wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
            progress(f"round {number + 1}, workers {n}: {wall:.2f} s, load {load:.1f}")
            out.append(
                {
                    "workers": n,
                    "wall_s": wall,
                    "loop_cpu_s": cpu,
                    "accepted": accepted,
                    "load": load,
                    "round": number + 1,
                }
            )
    for pool in pools.values():
        await pool.close(10)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    use_uvloop()
    runs = asyncio.run(run(args))
    assert len({r["accepted"] for r in runs}) == 1, "variants disagree"
    rows = []
    for n in args.workers:
        mine = [r for r in runs if r["workers"] == n]
        walls = [r["wall_s"] for r in mine]
        ratio = (
            [
                next(b["wall_s"] for b in runs if b["round"] == r["round"] and b["workers"] == 0)
                / r["wall_s"]
                for r in mine
            ]
            if 0 in args.workers
            else [float("nan")]
        )
        rows.append(
            (
                n,
                f"{statistics.median(walls):.2f} ({min(walls):.2f}-{max(walls):.2f})",
                f"{args.count / statistics.median(walls):,.0f}",
                f"{statistics.median(r['loop_cpu_s'] for r in mine):.2f}",
                f"{statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f})",
                " / ".join(f"{r['load']:.1f}" for r in mine),
            )
        )
    emit(
        f"bench_job_intake: {args.count:,} NDJSON lines, median (min-max) of {args.rounds} rounds",
        table(
            [
                "API_JOB_WORKERS",
                "wall s",
                "lines/s",
                "loop CPU s",
                "speed vs 0, same round",
                "load (1 min) per round",
            ],
            rows,
        ),
    )


if __name__ == "__main__":
    main()
