"""Where the recorder's time goes, per message: py-spy on the real process under load.

    python -m benchmarks.bench_profile                      # 30,000 transactions, defaults
    python -m benchmarks.bench_profile --count 100000 --workers 10 --prefetch 100

The queue is pre-filled, the recorder (``python -m consumer``) drains it, and py-spy samples
it (``--nonblocking``, so the process is never paused) from the first 1% to the last ack.
Samples are put into categories by the frames on their stack (first matching rule wins, see
``CATEGORIES``), and each category's share of the samples is turned into microseconds per
message with the CPU time the process used over the same window (/proc). The raw collapsed
stacks are kept (``--out``) for a flame graph. A second table times the pieces of the hot
path in isolation (timeit, this process), for the suggestions in RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import shutil
import signal
import subprocess
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.support.env import add_recorder_arguments, run_main
from benchmarks.support.machine import facts_table, machine_facts
from benchmarks.support.recorder import RecorderConfig, RecorderProcess
from benchmarks.support.services import fill, temp_database, temp_topology
from benchmarks.support.stats import Stat, emit, progress, save_json, table

# (category, substrings any of which in a frame "function (file:line)" puts a sample there);
# the first category that matches any frame of the stack wins.
CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("/metrics scrapes (the benchmark's polling)", ("HealthServer._handle",)),
    ("decode + validate (records/)", ("bulk_recorder/records/",)),
    ("prometheus_client counters/gauges/histograms", ("prometheus_client",)),
    ("ack: AmqpDelivery.ack -> aiormq basic_ack", ("AmqpDelivery.ack", "Channel.basic_ack")),
    ("asyncpg (protocol, encode, decode)", ("asyncpg/",)),
    ("writer Python (split, dedupe, sort, arrays, deltas)", ("bulk_recorder/recorder/writer.py",)),
    ("flusher bookkeeping (Flusher.*)", ("bulk_recorder/recorder/flusher.py",)),
    ("collector (BulkCollector)", ("bulk_recorder/recorder/collector.py",)),
    ("on_message rest (AmqpDelivery(), Pending)", ("Recorder._on_message",)),
    (
        "aiormq receive: frames, pamqp, a task per delivery",
        ("Channel._reader", "Connection.__reader", "pamqp/", "_on_deliver_frame"),
    ),
    ("aiormq writer task (one socket write per frame)", ("Connection.__writer",)),
    (
        "flush worker loop / asyncio.Queue",
        ("FlushPool._work",),
    ),
]
OTHER = "other (event loop, task switches, unattributed)"


def categorize(stack: list[str]) -> str:
    for name, needles in CATEGORIES:
        for frame in stack:
            if any(n in frame for n in needles):
                return name
    return OTHER


def summarize(raw: str) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """(samples, samples per category, samples per leaf frame) of py-spy's raw output."""
    total = 0
    cats: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text:
            continue
        n = int(count_text)
        stack = stack_text.split(";")
        total += n
        cats[categorize(stack)] += n
        leaves[stack[-1]] += n
    return total, cats, leaves


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy not found: pip install -e '.[bench]'")
    return found


def start_py_spy(pid: int, rate_hz: int, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            py_spy(),
            "record",
            *("--pid", str(pid), "--format", "raw", "--rate", str(rate_hz)),
            *("--nonblocking", "-o", str(out)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def profile_run(
    config: RecorderConfig, count: int, rate_hz: int, out: Path, src: Path | None = None
) -> tuple[float, float, float]:
    """(msg/s, CPU us/msg, seconds) of one profiled drain; the stacks go to ``out``."""
    async with (
        temp_topology("bench_profile") as topology,
        temp_database("bench_profile") as (
            dsn,
            _,
        ),
    ):
        await fill(topology, count, "transaction")
        recorder = RecorderProcess(dsn, topology, config, src=src)
        spy: subprocess.Popen[bytes] | None = None
        try:
            acked = 0.0
            while acked < count // 100:
                with contextlib.suppress(OSError):
                    acked = (await recorder.metrics()).get("bulk_recorder_messages_acked_total", 0)
                await asyncio.sleep(0.01)
            spy = start_py_spy(recorder.pid, rate_hz, out)
            t0, c0 = time.monotonic(), recorder.cpu_seconds()
            a0 = acked
            while acked < count:
                await asyncio.sleep(0.1)
                acked = (await recorder.metrics()).get("bulk_recorder_messages_acked_total", 0)
            t1, c1 = time.monotonic(), recorder.cpu_seconds()
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        finally:
            if spy is not None and spy.poll() is None:
                spy.kill()
            recorder.stop()
    n = acked - a0
    return n / (t1 - t0), (c1 - c0) / n * 1e6, t1 - t0


# -- the pieces in isolation -------------------------------------------------------------------


def micro() -> list[tuple[str, float]]:
    """CPU microseconds per call of hot-path pieces, median of 5 timeit runs."""
    from benchmarks.bench_decode import CASES
    from bulk_recorder.infra.metrics import Metrics
    from bulk_recorder.recorder.collector import BulkCollector
    from bulk_recorder.recorder.flusher import Pending
    from bulk_recorder.records import decode

    metrics = Metrics()
    body = CASES["transaction"]
    record = decode(body, "transaction")

    class FakeDelivery:
        delivery_count = 0

    batches: list[Any] = []
    collector: BulkCollector[Pending] = BulkCollector(
        1000, 1.0, lambda b, r: batches.append(b), loop=asyncio.new_event_loop()
    )
    delivery = FakeDelivery()

    def per_message_metrics() -> None:
        metrics.messages_received.inc()
        metrics.buffer_messages.inc()

    def pending_and_add() -> None:
        collector.add(Pending(record, delivery))  # type: ignore[arg-type]
        if len(batches) > 10:
            batches.clear()

    cases: list[tuple[str, Callable[[], object]]] = [
        ("decode + validate, transaction", lambda: decode(body, "transaction")),
        (
            "decode + validate, credit_annotation",
            lambda: decode(CASES["credit_annotation"], "credit_annotation"),
        ),
        ("2 prometheus inc() a message (received, buffer gauge)", per_message_metrics),
        ("Pending(...) + BulkCollector.add", pending_and_add),
    ]
    out = []
    for name, call in cases:
        number = 20_000
        # CPU time of this process, not wall time: other work on the shared cores would
        # otherwise inflate every figure.
        runs = timeit.Timer(call, timer=time.process_time).repeat(number=number, repeat=5)
        out.append((name, sorted(runs)[2] / number * 1e6))
    return out


async def main_async(args: argparse.Namespace) -> None:
    facts = await machine_facts()
    emit("Machine", facts_table(facts))
    config = RecorderConfig(args.workers, args.prefetch, args.size, args.timeout_ms)
    per_run: list[dict[str, Any]] = []
    cat_us: dict[str, Stat] = {}
    leaf_total: collections.Counter[str] = collections.Counter()
    rates, cpus = Stat(), Stat()
    for run in range(args.runs):
        progress(f"profile run {run + 1}/{args.runs}: {config.label()}, {args.count:,} records")
        out = Path(args.out).with_suffix(f".{run + 1}.txt")
        out.parent.mkdir(parents=True, exist_ok=True)
        rate, cpu_us, seconds = await profile_run(
            config, args.count, args.rate, out, Path(args.src) if args.src else None
        )
        raw = out.read_text()
        total, cats, leaves = summarize(raw)
        rates.add(rate)
        cpus.add(cpu_us)
        leaf_total.update(leaves)
        for name in [c for c, _ in CATEGORIES] + [OTHER]:
            cat_us.setdefault(name, Stat()).add(cats[name] / total * cpu_us if total else 0.0)
        per_run.append(
            {"rate": rate, "cpu_us": cpu_us, "seconds": seconds, "samples": total, **cats}
        )
    rows = [
        (name, stat.fmt(1), f"{stat.median / cpus.median:.0%}")
        for name, stat in sorted(cat_us.items(), key=lambda kv: -kv[1].median)
    ]
    rows.append(("**total (process CPU / messages)**", cpus.fmt(1), "100%"))
    emit(
        f"Where the time goes: {config.label()} (QoS {config.channel_prefetch}), "
        f"{args.count:,} transactions, {rates.fmt()} msg/s under py-spy, median (min-max) "
        f"of {args.runs} runs",
        table(["category", "CPU us/msg", "share"], rows),
    )
    total = sum(leaf_total.values())
    emit(
        "Top 25 leaf frames (self time, all runs)",
        table(
            ["share", "frame"],
            [(f"{n / total:.1%}", f"`{f}`") for f, n in leaf_total.most_common(25)],
        ),
    )
    pieces = micro()
    emit(
        "Hot-path pieces in isolation (CPU time of this process, median of 5 timeit runs)",
        table(["piece", "CPU us/call"], [(name, f"{us:.2f}") for name, us in pieces]),
    )
    save_json(
        args.json,
        {
            "facts": facts,
            "config": config.label(),
            "runs": per_run,
            "micro": pieces,
            "leaves": leaf_total.most_common(60),
        },
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=30_000)
    parser.add_argument("--runs", type=int, default=3)
    add_recorder_arguments(parser)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument(
        "--out", default="benchmarks/out/profile.txt", help="collapsed stacks (per run)"
    )
    parser.add_argument("--src", help="profile the recorder of another source tree (scratch copy)")
    parser.add_argument("--json", help="write raw results here")
    return parser


def main() -> None:
    run_main(build_parser(), main_async)


if __name__ == "__main__":
    main()
