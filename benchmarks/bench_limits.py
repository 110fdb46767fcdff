"""The machine's limits: raw consume-and-ack, publish with confirms, PostgreSQL COPY.

    python -m benchmarks.bench_limits                          # quick: 20,000 messages, 3 runs
    python -m benchmarks.bench_limits --count 200000 --runs 3  # full size

Consume (no work at all, one ack per delivery, never ``multiple=True``) on the recorder's own
topology (quorum queue) at the recorder's channel QoS:
- ``aio-pika ack``: ``queue.consume(callback)`` and ``await message.ack()`` (aio-pika's path);
- ``aiormq basic_ack``: ``channel.basic_consume`` and ``await channel.basic_ack(tag)`` (what
  the recorder's AmqpDelivery does);
- ``aiormq basic_ack wait=False``: the same without waiting for the frame to be written;
- ``aiormq acks, one write``: tags collected and written as one frame buffer per batch, still
  one basic.ack per delivery (the leanest ack path aiormq allows).

Publish with confirms (pre-generated ~600-byte transaction bodies, persistent): aio-pika with
1,000 and 100 unconfirmed in flight, and awaiting each confirm in turn. The windowed publishes
are also the fills of the consume runs.

PostgreSQL: plain COPY of the same rows (1,000-row chunks, one transaction each, and one COPY
of everything), and one INSERT + COMMIT per row on 1 and 5 connections.

Rates are measured from the first 1% of messages to the last, with the CPU time of this
process over the same window (us/msg). Each figure: median (min-max) over ``--runs`` rounds,
every variant once per round; ratios are taken per round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
import asyncpg
from aiormq.abc import ChannelFrame, DeliveredMessage
from pamqp import commands as spec

from benchmarks.bench_writer import TABLES, make_records, row_of
from benchmarks.support.env import rabbitmq_url, run_main
from benchmarks.support.machine import facts_table, machine_facts
from benchmarks.support.services import temp_database, temp_topology, wait_visible
from benchmarks.support.stats import Stat, emit, progress, ratio, save_json, table
from consumer.tools.generator import Generator
from consumer.topology import Topology

CONSUMERS = ("aio-pika ack", "aiormq basic_ack", "aiormq basic_ack wait=False", "aiormq one write")


@dataclass(slots=True)
class Measure:
    rate: float
    cpu_us: float  # CPU of this process per message over the measured window


class Window:
    """Times the span from the first 1% of ``expected`` events to the last."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.mark = max(1, expected // 100)
        self.count = 0
        self.t0 = self.c0 = 0.0
        self.n0 = 0
        self.done = asyncio.Event()
        self.result: Measure | None = None

    def tick(self, n: int = 1) -> None:
        before = self.count
        self.count += n
        if before < self.mark <= self.count:
            self.t0, self.c0 = time.perf_counter(), time.process_time()
            self.n0 = self.count
        if before < self.expected <= self.count:
            seconds = time.perf_counter() - self.t0
            cpu = time.process_time() - self.c0
            n = self.count - self.n0
            self.result = Measure(n / seconds, cpu / n * 1e6)
            self.done.set()


# -- consume ---------------------------------------------------------------------------------


async def consume_aiopika(queue_name: str, prefetch: int, expected: int) -> Measure:
    connection = await aio_pika.connect(rabbitmq_url())
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=prefetch)
        queue = await channel.get_queue(queue_name, ensure=False)
        window = Window(expected)

        async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            await message.ack()
            window.tick()

        tag = await queue.consume(on_message)
        await window.done.wait()
        await queue.cancel(tag)
    finally:
        await connection.close()
    assert window.result is not None
    return window.result


async def consume_aiormq(queue_name: str, prefetch: int, expected: int, mode: str) -> Measure:
    connection = await aiormq.connect(rabbitmq_url())
    try:
        channel = await connection.channel()
        await channel.basic_qos(prefetch_count=prefetch)
        window = Window(expected)
        tags: list[int] = []
        batch = max(1, prefetch // 2)
        timer: asyncio.TimerHandle | None = None
        loop = asyncio.get_running_loop()

        def write_acks() -> None:
            nonlocal timer, tags
            if timer is not None:
                timer.cancel()
                timer = None
            if not tags:
                return
            frames = [spec.Basic.Ack(delivery_tag=t) for t in tags]
            channel.connection.write_queue.put_nowait(ChannelFrame.marshall(channel.number, frames))
            window.tick(len(tags))
            tags = []

        async def on_ack(message: DeliveredMessage) -> None:
            await channel.basic_ack(message.delivery_tag or 0)
            window.tick()

        async def on_nowait(message: DeliveredMessage) -> None:
            await channel.basic_ack(message.delivery_tag or 0, wait=False)
            window.tick()

        async def on_batch(message: DeliveredMessage) -> None:
            nonlocal timer
            tags.append(message.delivery_tag or 0)
            if len(tags) >= batch:
                write_acks()
            elif timer is None:
                timer = loop.call_later(0.005, write_acks)

        callback = {"ack": on_ack, "nowait": on_nowait, "batch": on_batch}[mode]
        ok = await channel.basic_consume(queue_name, callback, no_ack=False)
        await window.done.wait()
        assert ok.consumer_tag is not None
        await channel.basic_cancel(ok.consumer_tag)
    finally:
        await connection.close()
    assert window.result is not None
    return window.result


async def consume(kind: str, queue_name: str, prefetch: int, expected: int) -> Measure:
    if kind == "aio-pika ack":
        return await consume_aiopika(queue_name, prefetch, expected)
    mode = {
        "aiormq basic_ack": "ack",
        "aiormq basic_ack wait=False": "nowait",
        "aiormq one write": "batch",
    }[kind]
    return await consume_aiormq(queue_name, prefetch, expected, mode)


# -- publish ---------------------------------------------------------------------------------


def make_bodies(count: int, record_type: str = "transaction") -> list[bytes]:
    gen = Generator.create(7)
    return [
        json.dumps(gen.record(record_type), separators=(",", ":")).encode() for _ in range(count)
    ]


async def publish(
    topology: Topology, bodies: Sequence[bytes], in_flight: int, record_type: str = "transaction"
) -> Measure:
    """Publish with confirms, ``in_flight`` unconfirmed at most (1: await each in turn)."""
    connection = await aio_pika.connect(rabbitmq_url())
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(topology.exchange, ensure=False)
        window = Window(len(bodies))
        slots = asyncio.Semaphore(in_flight)
        failures: list[BaseException] = []

        async def send(body: bytes) -> None:
            try:
                await exchange.publish(
                    aio_pika.Message(
                        body,
                        content_type="application/json",
                        type=record_type,
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    routing_key=record_type,
                )
                window.tick()
            except BaseException as exc:
                failures.append(exc)
                raise
            finally:
                slots.release()

        tasks = set()
        for body in bodies:
            await slots.acquire()
            if failures:
                raise RuntimeError(f"publish failed: {failures[0]!r}")
            task = asyncio.create_task(send(body))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await window.done.wait()
    finally:
        await connection.close()
    assert window.result is not None
    return window.result


async def purge(queue: str) -> None:
    connection = await aio_pika.connect(rabbitmq_url())
    try:
        channel = await connection.channel()
        q = await channel.get_queue(queue, ensure=False)
        await q.purge()
    finally:
        await connection.close()


# -- PostgreSQL --------------------------------------------------------------------------------


async def pg_copy_chunks(dsn: str, table_name: str, rows: list[tuple[Any, ...]]) -> float:
    conn = await asyncpg.connect(dsn)
    try:
        started = time.perf_counter()
        for start in range(0, len(rows), 1000):
            async with conn.transaction():
                await conn.copy_records_to_table(
                    table_name, records=rows[start : start + 1000], columns=TABLES[table_name]
                )
        return len(rows) / (time.perf_counter() - started)
    finally:
        await conn.close()


async def pg_copy_all(dsn: str, table_name: str, rows: list[tuple[Any, ...]]) -> float:
    conn = await asyncpg.connect(dsn)
    try:
        started = time.perf_counter()
        await conn.copy_records_to_table(table_name, records=rows, columns=TABLES[table_name])
        return len(rows) / (time.perf_counter() - started)
    finally:
        await conn.close()


async def pg_insert_each(
    dsn: str, table_name: str, rows: list[tuple[Any, ...]], connections: int
) -> float:
    cols = TABLES[table_name]
    sql = (
        f"INSERT INTO {table_name} ({','.join(cols)}) "
        f"VALUES ({','.join(f'${i + 1}' for i in range(len(cols)))}) ON CONFLICT (id) DO NOTHING"
    )
    conns = [await asyncpg.connect(dsn) for _ in range(connections)]
    try:

        async def worker(conn: asyncpg.Connection, part: list[tuple[Any, ...]]) -> None:
            for row in part:
                async with conn.transaction():
                    await conn.execute(sql, *row)

        started = time.perf_counter()
        await asyncio.gather(*(worker(c, rows[i::connections]) for i, c in enumerate(conns)))
        return len(rows) / (time.perf_counter() - started)
    finally:
        for c in conns:
            await c.close()


async def pg_limits(runs: int, count: int, each_count: int) -> dict[str, Stat]:
    out: dict[str, Stat] = {}
    for run in range(runs):
        for table_name in TABLES:
            progress(f"PostgreSQL limits, run {run + 1}/{runs}, {table_name}")
            records = make_records(table_name, count, "sorted", seed=run + 11)
            rows = sorted((row_of(r) for r in records), key=lambda row: row[0])
            half = len(rows) // 2
            async with temp_database("bench_limits") as (dsn, _):
                out.setdefault(f"{table_name}: COPY, 1,000-row chunks", Stat()).add(
                    await pg_copy_chunks(dsn, table_name, rows[:half])
                )
                out.setdefault(f"{table_name}: COPY, one statement", Stat()).add(
                    await pg_copy_all(dsn, table_name, rows[half:])
                )
            async with temp_database("bench_limits") as (dsn, _):
                out.setdefault(f"{table_name}: INSERT + COMMIT per row, 1 conn", Stat()).add(
                    await pg_insert_each(dsn, table_name, rows[:each_count], 1)
                )
                out.setdefault(f"{table_name}: INSERT + COMMIT per row, 5 conns", Stat()).add(
                    await pg_insert_each(dsn, table_name, rows[each_count : 2 * each_count], 5)
                )
    return out


# -- main --------------------------------------------------------------------------------------


async def broker_limits(
    runs: int, count: int, prefetches: Sequence[int], serial_count: int
) -> tuple[dict[tuple[str, int], Stat], dict[tuple[str, int], Stat], dict[str, Stat]]:
    consume_rate: dict[tuple[str, int], Stat] = {}
    consume_cpu: dict[tuple[str, int], Stat] = {}
    publish_rate: dict[str, Stat] = {}
    bodies = make_bodies(count)
    windows = (1000, 100)
    async with temp_topology("bench_limits") as topology:
        for run in range(runs):
            fills = 0
            for prefetch in prefetches:
                kinds = list(CONSUMERS[run % len(CONSUMERS) :] + CONSUMERS[: run % len(CONSUMERS)])
                for kind in kinds:
                    in_flight = windows[fills % len(windows)]
                    fills += 1
                    progress(
                        f"run {run + 1}/{runs}: fill {count:,} (window {in_flight}), "
                        f"consume '{kind}' at QoS {prefetch}"
                    )
                    pub = await publish(topology, bodies, in_flight)
                    publish_rate.setdefault(f"confirms, {in_flight} in flight", Stat()).add(
                        pub.rate
                    )
                    await wait_visible(topology.queue, count)
                    m = await consume(kind, topology.queue, prefetch, count)
                    consume_rate.setdefault((kind, prefetch), Stat()).add(m.rate)
                    consume_cpu.setdefault((kind, prefetch), Stat()).add(m.cpu_us)
                    await purge(topology.queue)  # redelivered leftovers, if any
            progress(f"run {run + 1}/{runs}: publish awaiting each confirm ({serial_count:,})")
            pub = await publish(topology, bodies[:serial_count], 1)
            publish_rate.setdefault("confirms, awaiting each in turn", Stat()).add(pub.rate)
            await purge(topology.queue)
    return consume_rate, consume_cpu, publish_rate


async def main_async(args: argparse.Namespace) -> None:
    facts = await machine_facts()
    emit("Machine", facts_table(facts))
    consume_rate, consume_cpu, publish_rate = await broker_limits(
        args.runs, args.count, args.prefetch, args.serial_count
    )
    rows = []
    for prefetch in args.prefetch:
        base = consume_rate[("aio-pika ack", prefetch)]
        for kind in CONSUMERS:
            stat = consume_rate[(kind, prefetch)]
            rows.append(
                (
                    prefetch,
                    kind,
                    stat.fmt(),
                    consume_cpu[(kind, prefetch)].fmt(1),
                    ratio(stat, base).fmt(2, "x"),
                )
            )
    emit(
        f"Consume, no work, one ack per delivery ({args.count:,} messages a run, quorum queue, "
        f"median (min-max) of {args.runs} runs)",
        table(["QoS", "client / ack path", "msg/s", "CPU us/msg", "vs aio-pika (same run)"], rows),
    )
    emit(
        f"Publish with confirms ({args.count:,} messages; awaiting each: {args.serial_count:,})",
        table(["publisher", "msg/s"], [(k, s.fmt()) for k, s in publish_rate.items()]),
    )
    pg = await pg_limits(args.runs, args.pg_count, args.pg_each_count)
    emit(
        f"PostgreSQL, no conflict handling ({args.pg_count:,} rows for COPY, "
        f"{args.pg_each_count:,} for per-row INSERT)",
        table(["what", "rows/s"], [(k, s.fmt()) for k, s in pg.items()]),
    )
    save_json(
        args.json,
        {
            "facts": facts,
            "consume": [
                {"kind": k[0], "prefetch": k[1], "rate": s.values, "cpu_us": consume_cpu[k].values}
                for k, s in consume_rate.items()
            ],
            "publish": {k: s.values for k, s in publish_rate.items()},
            "postgresql": {k: s.values for k, s in pg.items()},
        },
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=20_000, help="messages per consume run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--prefetch",
        type=int,
        nargs="+",
        default=[100, 2000],
        help="channel QoS values (100: the recorder's default; 2000: with size 1000)",
    )
    parser.add_argument("--serial-count", type=int, default=2000)
    parser.add_argument("--pg-count", type=int, default=20_000, help="rows for COPY")
    parser.add_argument("--pg-each-count", type=int, default=2000, help="rows per INSERT run")
    parser.add_argument("--json", help="write raw results here (for the charts)")
    return parser


def main() -> None:
    run_main(build_parser(), main_async)


if __name__ == "__main__":
    main()
