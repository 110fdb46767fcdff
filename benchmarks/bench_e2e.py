"""End to end: the real recorder in bulk mode vs per-message mode vs the raw consume limit.

    python -m benchmarks.bench_e2e                                  # quick: 20,000 records
    python -m benchmarks.bench_e2e --count 200000 --db-latency-ms 0 1   # full size, + remote DB

Each round, for each record type: the queue (the recorder's own topology, unique names) is
pre-filled with ``--count`` records by ``consumer.tools.loadgen``, then drained by
- ``raw aio-pika``: aio-pika consume + ``ack()`` each, no work, at the recorder's channel QoS;
- ``raw aiormq``: aiormq ``basic_consume`` + ``basic_ack`` each, no work, same QoS;
- ``bulk``: ``python -m consumer`` (a subprocess, settings from env vars) in bulk mode;
- ``per-message``: the same with ``BULK_RECORDER_ENABLED=false`` and the same workers.
The order of the four rotates per round. The recorder's rate is read from its /metrics (acks)
from the first 1% to the last message, so connecting and migrating are not counted; over the
same window the CPU of the recorder process and of the PostgreSQL backends serving its
database are read from /proc. Every recorder run gets a fresh database, checked afterwards to
hold exactly the records published.

``--tracing`` measures the cost of OpenTelemetry traces instead: transactions, each message with
a ``traceparent`` header of its own (as the relay publishes them), drained by the bulk recorder
with tracing off, on at ratio 0.01 (``parentbased_traceidratio``) and on at 1.0, exporting over
OTLP/HTTP to a local receiver (``benchmarks/support/otlp_sink.py``), side by side in each round:

    python -m benchmarks.bench_e2e --tracing --count 20000 --runs 3

``--db-latency-ms 1`` runs the recorder modes again with its database behind
``benchmarks/delay_proxy.py`` (the added round trip is measured and printed); the raw limits do
not touch the database and are not repeated.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.bench_limits import consume
from benchmarks.support.env import add_recorder_arguments, database_url, use_uvloop
from benchmarks.support.machine import PgCpu, facts_table, machine_facts
from benchmarks.support.proxy import delay_proxy, round_trip_ms
from benchmarks.support.recorder import RecorderConfig, RecorderProcess, drain
from benchmarks.support.services import count_rows, fill, temp_database, temp_topology, with_port
from benchmarks.support.stats import Stat, emit, progress, ratio, save_json, table

TABLE_OF = {"transaction": "transactions", "credit_annotation": "credit_annotations"}
RAW = {"raw aio-pika": "aio-pika ack", "raw aiormq": "aiormq basic_ack"}


@dataclass(slots=True)
class Figures:
    rate: Stat = field(default_factory=Stat)
    recorder_us: Stat = field(default_factory=Stat)  # recorder CPU per message
    pg_ms_per_1k: Stat = field(default_factory=Stat)  # PostgreSQL CPU per 1,000 records
    flush_mean: Stat = field(default_factory=Stat)


@contextlib.contextmanager
def maybe_proxy(latency_ms: float, delay_ms: float, zero: bool) -> Iterator[int | None]:
    if latency_ms <= 0 and not zero:
        yield None
        return
    with delay_proxy(delay_ms) as port:
        yield port


async def calibrate(latency_ms: float) -> tuple[float, float, float]:
    """(proxy delay setting, measured direct RTT ms, measured RTT through the proxy ms)."""
    direct = await round_trip_ms(database_url())
    delay = latency_ms
    measured = direct
    for _ in range(2):
        with delay_proxy(delay) as port:
            measured = await round_trip_ms(with_port(database_url(), port))
        added = measured - direct
        if abs(added - latency_ms) < 0.1 * latency_ms:
            break
        delay = max(0.05, delay - (added - latency_ms))
    return delay, direct, measured


async def run_recorder(
    record_type: str,
    count: int,
    config: RecorderConfig,
    proxy_port: int | None,
    src: Path | None = None,
    traced: bool = False,
) -> tuple[float, float, float, float]:
    """Fill, drain with the recorder; (msg/s, recorder us/msg, PG ms per 1k, mean flush)."""
    async with temp_topology("bench_e2e") as topology, temp_database("bench_e2e") as (dsn, name):
        await fill(topology, count, record_type, traced=traced)
        recorder_dsn = with_port(dsn, proxy_port) if proxy_port else dsn
        recorder = RecorderProcess(recorder_dsn, topology, config, src=src)
        try:
            result = await drain([recorder], count, PgCpu(database_url(), name))
        finally:
            code = recorder.stop()
        if code != 0:
            raise RuntimeError(f"recorder exited with {code}")
        rows = await count_rows(dsn, TABLE_OF[record_type])
        if rows != count:
            raise RuntimeError(f"{rows} rows recorded, {count} published")
        n = result.seconds * result.rate
        flushes = result.metrics.get("bulk_recorder_flush_size_count", 0.0)
        mean_flush = result.metrics.get("bulk_recorder_flush_size_sum", 0.0) / flushes
        return (
            result.rate,
            result.recorder_cpu_s / n * 1e6,
            result.pg_cpu_s / n * 1000 * 1000,
            mean_flush,
        )


TRACING = {
    "tracing off": {},
    "tracing on, ratio 0.01": {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.01",
    },
    "tracing on, ratio 1.0": {
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "1.0",
    },
}


async def run_tracing(args: argparse.Namespace) -> None:
    """Tracing off / 0.01 / 1.0, side by side in each round, on the same traced messages."""
    from benchmarks.support.otlp_sink import OtlpSink

    sink = OtlpSink()
    figures: dict[str, Figures] = {}
    spans: dict[str, list[int]] = {}
    try:
        for run in range(args.runs):
            modes = list(TRACING)
            shift = run % len(modes)
            for mode in modes[shift:] + modes[:shift]:
                progress(f"run {run + 1}/{args.runs}: transactions, {mode}, {args.count:,}")
                env = dict(TRACING[mode])
                if env:
                    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.endpoint
                config = RecorderConfig(
                    args.workers, args.prefetch, args.size, args.timeout_ms, True, env
                )
                rate, us, pg, flush = await run_recorder(
                    "transaction", args.count, config, None, traced=True
                )
                fig = figures.setdefault(mode, Figures())
                fig.rate.add(rate)
                fig.recorder_us.add(us)
                fig.pg_ms_per_1k.add(pg)
                fig.flush_mean.add(flush)
                spans.setdefault(mode, []).append(sink.take_spans())
    finally:
        sink.close()
    off = figures["tracing off"]
    rows = [
        (
            mode,
            fig.rate.fmt(),
            ratio(fig.rate, off.rate).fmt(3, "x"),
            fig.recorder_us.fmt(1),
            fig.pg_ms_per_1k.fmt(0),
            fig.flush_mean.fmt(0),
            "/".join(f"{n:,}" for n in spans[mode]),
        )
        for mode, fig in figures.items()
    ]
    emit(
        f"Tracing cost: transactions, {args.count:,} traced messages a run, bulk recorder, "
        f"median (min-max) of {args.runs} runs, modes rotated each round",
        table(
            [
                "mode",
                "msg/s",
                "vs off",
                "recorder CPU us/msg",
                "PG CPU ms / 1k records",
                "mean flush size",
                "spans exported (each run)",
            ],
            rows,
        ),
    )
    save_json(
        args.json,
        {
            "settings": vars(args),
            "results": [
                {"mode": m, "rate": f.rate.values, "cpu_us": f.recorder_us.values}
                for m, f in figures.items()
            ],
        },
    )


async def run_raw(record_type: str, count: int, kind: str, prefetch: int) -> tuple[float, float]:
    async with temp_topology("bench_e2e") as topology:
        await fill(topology, count, record_type)
        m = await consume(kind, topology.queue, prefetch, count)
        return m.rate, m.cpu_us


async def main_async(args: argparse.Namespace) -> None:
    facts = await machine_facts()
    emit("Machine", facts_table(facts))
    if args.tracing:
        await run_tracing(args)
        return
    bulk = RecorderConfig(args.workers, args.prefetch, args.size, args.timeout_ms, bulk=True)
    single = RecorderConfig(args.workers, args.prefetch, args.size, args.timeout_ms, bulk=False)
    qos = bulk.channel_prefetch
    emit(
        "Settings",
        f"workers {args.workers}, prefetch {args.prefetch}, size {bulk.batch_size}, flush "
        f"timeout {args.timeout_ms} ms, channel QoS {qos} (bulk) / {single.channel_prefetch} "
        f"(per-message); raw consumers use QoS {qos}.",
    )
    latencies = {}
    alts = {name: Path(path) for name, _, path in (a.partition("=") for a in args.alt)}
    for latency in args.db_latency_ms:
        if latency > 0:
            delay, direct, measured = await calibrate(latency)
            latencies[latency] = delay
            emit(
                f"Delay proxy for --db-latency-ms {latency:g}",
                f"proxy delay setting {delay:.2f} ms; SELECT 1 round trip: direct {direct:.3f} "
                f"ms, through the proxy {measured:.3f} ms (added {measured - direct:.2f} ms).",
            )
    figures: dict[tuple[str, float, str], Figures] = {}
    for run in range(args.runs):
        for record_type in args.types:
            for latency in args.db_latency_ms:
                modes = ["bulk", "per-message", *(f"bulk [{name}]" for name in alts)]
                if latency == args.db_latency_ms[0]:
                    modes += [k for k in RAW if k.split()[1] in args.raw]
                shift = run % len(modes)
                for mode in modes[shift:] + modes[:shift]:
                    count = args.count if mode != "per-message" else args.per_message_count
                    progress(
                        f"run {run + 1}/{args.runs}: {record_type}, db +{latency:g} ms, {mode}, "
                        f"{count:,} records"
                    )
                    fig = figures.setdefault((record_type, latency, mode), Figures())
                    if mode in RAW:
                        rate, cpu_us = await run_raw(record_type, count, RAW[mode], qos)
                        fig.rate.add(rate)
                        fig.recorder_us.add(cpu_us)
                        continue
                    config = single if mode == "per-message" else bulk
                    src = alts.get(mode[6:-1]) if mode.startswith("bulk [") else None
                    with maybe_proxy(
                        latency, latencies.get(latency, 0.0), args.proxy_at_zero
                    ) as port:
                        rate, us, pg, flush = await run_recorder(
                            record_type, count, config, port, src
                        )
                    fig.rate.add(rate)
                    fig.recorder_us.add(us)
                    fig.pg_ms_per_1k.add(pg)
                    fig.flush_mean.add(flush)
    report(figures, args)
    report_distance(figures, args)
    save_json(
        args.json,
        {
            "facts": facts,
            "settings": vars(args),
            "results": [
                {
                    "type": k[0],
                    "db_latency_ms": k[1],
                    "mode": k[2],
                    "rate": f.rate.values,
                    "cpu_us": f.recorder_us.values,
                    "pg_ms_per_1k": f.pg_ms_per_1k.values,
                    "flush_mean": f.flush_mean.values,
                }
                for k, f in figures.items()
            ],
        },
    )


def report(figures: dict[tuple[str, float, str], Figures], args: argparse.Namespace) -> None:
    base_latency = args.db_latency_ms[0]
    for latency in args.db_latency_ms:
        rows = []
        for record_type in args.types:
            limit = figures.get((record_type, base_latency, "raw aio-pika"))
            limit2 = figures.get((record_type, base_latency, "raw aiormq"))
            per_msg = figures[(record_type, latency, "per-message")]
            alt_modes = [f"bulk [{a.partition('=')[0]}]" for a in args.alt]
            for mode in ("raw aio-pika", "raw aiormq", "bulk", *alt_modes, "per-message"):
                key_latency = base_latency if mode in RAW else latency
                fig = figures.get((record_type, key_latency, mode))
                if fig is None:
                    continue
                rows.append(
                    (
                        record_type,
                        mode,
                        fig.rate.fmt(),
                        ratio(fig.rate, limit.rate).fmt(2, "x") if limit else "-",
                        ratio(fig.rate, limit2.rate).fmt(2, "x") if limit2 else "-",
                        ratio(fig.rate, per_msg.rate).fmt(1, "x"),
                        fig.recorder_us.fmt(1),
                        fig.pg_ms_per_1k.fmt(0) if fig.pg_ms_per_1k.values else "-",
                        fig.flush_mean.fmt(0) if fig.flush_mean.values else "-",
                    )
                )
            bulk = figures[(record_type, latency, "bulk")]
            rows.append(
                (
                    record_type,
                    "**PG CPU per record, per-message / bulk**",
                    "",
                    "",
                    "",
                    "",
                    "",
                    ratio(per_msg.pg_ms_per_1k, bulk.pg_ms_per_1k).fmt(1, "x"),
                    "",
                )
            )
        where = f"database +{latency:g} ms round trip (proxy)"
        if latency <= 0:
            where = "through a 0 ms proxy" if args.proxy_at_zero else "loopback"
        emit(
            f"End to end, {where}: bulk {args.count:,} / per-message {args.per_message_count:,} "
            f"records a run, median (min-max) of {args.runs} runs",
            table(
                [
                    "type",
                    "mode",
                    "msg/s",
                    "vs raw aio-pika",
                    "vs raw aiormq",
                    "vs per-message",
                    "consumer CPU us/msg",
                    "PG CPU ms / 1k records",
                    "mean flush size",
                ],
                rows,
            ),
        )


def report_distance(
    figures: dict[tuple[str, float, str], Figures], args: argparse.Namespace
) -> None:
    """Bulk at each added round trip over bulk at the first one, per round (issue 13)."""
    base = args.db_latency_ms[0]
    modes = ["bulk", *(f"bulk [{a.partition('=')[0]}]" for a in args.alt)]
    rows = []
    for record_type in args.types:
        for mode in modes:
            at_base = figures.get((record_type, base, mode))
            for latency in args.db_latency_ms[1:]:
                fig = figures.get((record_type, latency, mode))
                if fig is None or at_base is None:
                    continue
                rows.append(
                    (
                        record_type,
                        mode,
                        f"+{latency:g} ms",
                        fig.rate.fmt(),
                        at_base.rate.fmt(),
                        ratio(fig.rate, at_base.rate).fmt(2, "x"),
                    )
                )
    if rows:
        where = "a 0 ms proxy" if args.proxy_at_zero else "loopback"
        emit(
            f"Database distance: bulk throughput at each round trip over {where}, same rounds",
            table(["type", "mode", "round trip", "msg/s", f"msg/s via {where}", "ratio"], rows),
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=20_000, help="records per bulk/raw run")
    parser.add_argument(
        "--per-message-count", type=int, default=0, help="records per per-message run (0: --count)"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--types", nargs="+", choices=tuple(TABLE_OF), default=["transaction", "credit_annotation"]
    )
    add_recorder_arguments(parser)
    parser.add_argument(
        "--db-latency-ms",
        type=float,
        nargs="+",
        default=[0.0],
        help="added database round trips to run (0: loopback; e.g. 0 1)",
    )
    parser.add_argument(
        "--proxy-at-zero",
        action="store_true",
        help="run the 0 ms case through the proxy too (delay 0), so every case pays its hop",
    )
    parser.add_argument(
        "--raw", nargs="*", choices=("aio-pika", "aiormq"), default=["aio-pika", "aiormq"]
    )
    parser.add_argument(
        "--alt",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also run bulk mode from another source tree (a scratch copy with a change), "
        "in the same rounds",
    )
    parser.add_argument("--json", help="write raw results here (for the charts)")
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="measure OpenTelemetry tracing instead: off, ratio 0.01, ratio 1.0 (transactions)",
    )
    return parser


def main() -> None:
    args = build_parser().parse_args()
    if not args.per_message_count:
        args.per_message_count = args.count
    use_uvloop()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
