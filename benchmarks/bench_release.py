"""Releasing held deliveries: a nack with requeue, or a copy republished to the queue, then an ack.

    python -m benchmarks.bench_release                  # 2,000 held deliveries, 3 runs
    python -m benchmarks.bench_release --count 200 --runs 5
    python -m benchmarks.bench_release --consumer-timeout-ms 5000   # holding instead (~1 min)

The recorder releases what it holds during a long database outage (and a dead letter the DLQ
refuses). On quorum queues (RabbitMQ 3.10) every nack or return counts toward
``x-delivery-limit``, so each release by nack spends one of the message's deliveries; a copy
republished to the queue (default exchange, mandatory, confirmed) and then acked starts afresh.
This measures both on the recorder's own code (``CopyPublisher``, ``DeadLetterer``,
``AmqpDelivery.release`` through ``release_all``) against the local broker: how long releasing
``--count`` held deliveries takes, and the ``x-delivery-count`` the messages come back with.
Each figure: median (min-max) over ``--runs``.

``--consumer-timeout-ms`` measures the other option, holding deliveries for the whole outage:
on a throwaway node (``tests/rigs``) with that ``consumer_timeout``, one delivery is held
unacked; the script prints when the broker closes the channel and the ``x-delivery-count``
the message comes back with.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import aio_pika
import aiormq
from aiormq.abc import DeliveredMessage

from bulk_recorder.recorder.flusher import release_all
from consumer.copy_publisher import CopyPublisher
from consumer.delivery import AmqpDelivery, DeadLetterer
from consumer.topology import Topology, declare_topology, delete_topology

URL = "amqp://guest:guest@127.0.0.1:5672/"


async def _fill(topology: Topology, count: int) -> None:
    connection = await aio_pika.connect(URL)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await declare_topology(channel, topology)
        exchange = await channel.get_exchange(topology.exchange)
        body = b'{"id": "00000000-0000-0000-0000-000000000000"}'
        for start in range(0, count, 500):
            await asyncio.gather(
                *(
                    exchange.publish(
                        aio_pika.Message(body, type="credit_annotation"),
                        routing_key="credit_annotation",
                    )
                    for _ in range(start, min(count, start + 500))
                )
            )
    finally:
        await connection.close()


class Held:
    """A consumer that holds every delivery it gets (QoS = count)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.messages: list[DeliveredMessage] = []
        self.full = asyncio.Event()

    async def on_message(self, message: DeliveredMessage) -> None:
        self.messages.append(message)
        if len(self.messages) >= self.count:
            self.full.set()

    async def take(self) -> list[DeliveredMessage]:
        await asyncio.wait_for(self.full.wait(), 60)
        taken, self.messages = self.messages[: self.count], self.messages[self.count :]
        self.full.clear()
        if len(self.messages) >= self.count:
            self.full.set()
        return taken


def _count(message: DeliveredMessage) -> int:
    headers = message.header.properties.headers or {}
    value = headers.get("x-delivery-count", 0)
    return value if isinstance(value, int) else 0


async def one_run(count: int, mode: str) -> tuple[float, int]:
    """Release ``count`` held deliveries by ``mode``; returns (seconds, max delivery count)."""
    suffix = uuid.uuid4().hex[:8]
    topology = Topology(f"bench.release.{suffix}", f"bench.release.{suffix}.q", 1000)
    await _fill(topology, count)
    stop = asyncio.Event()
    publisher = CopyPublisher(URL, topology, confirm_timeout_s=30)
    publishing = asyncio.create_task(publisher.run(stop))
    connection = await aiormq.connect(URL)
    try:
        channel = await connection.channel()
        await channel.basic_qos(prefetch_count=count)
        held = Held(count)
        await channel.basic_consume(topology.queue, held.on_message)
        messages = await held.take()
        await asyncio.wait_for(publisher.wait_connected(), 30)
        dead_letterer = DeadLetterer(
            publisher,
            dead_letter_exchange=topology.dead_letter_exchange,
            queue=topology.queue,
            hold_s=1,
        )
        deliveries = [AmqpDelivery(channel, m, dead_letterer) for m in messages]
        started = time.perf_counter()
        if mode == "nack":
            for m in messages:
                await channel.basic_nack(m.delivery_tag or 0, requeue=True)
        else:
            released = await release_all(deliveries)
            assert released == count, released
        elapsed = time.perf_counter() - started
        back = await held.take()  # the same messages again, nacked or republished
        spent = max(_count(m) for m in back)
        for m in back:
            await channel.basic_ack(m.delivery_tag or 0)
        return elapsed, spent
    finally:
        await connection.close()
        stop.set()
        await publishing
        cleanup = await aio_pika.connect(URL)
        await delete_topology(cleanup, topology)
        await cleanup.close()


def _fmt(values: list[float], scale: float) -> str:
    med, low, high = (f(values) * scale for f in (statistics.median, min, max))
    return f"{med:,.0f} ({low:,.0f}-{high:,.0f})"


async def hold_past_consumer_timeout(timeout_ms: int) -> None:
    import tempfile
    from pathlib import Path

    from tests.rigs.rabbitmq_node import RabbitNode

    folder = Path(tempfile.mkdtemp(prefix="bench-release-"))
    config = f"consumer_timeout = {timeout_ms}\n"
    with RabbitNode(f"benchrelease{uuid.uuid4().hex[:6]}", folder, config=config) as node:
        connection = await aiormq.connect(node.url)
        try:
            channel = await connection.channel()
            await channel.queue_declare(
                "held", durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 5}
            )
            await channel.basic_publish(b"x", routing_key="held")
            holder = await connection.channel()
            got = asyncio.Event()

            async def on_message(_: DeliveredMessage) -> None:
                got.set()

            await holder.basic_consume("held", on_message)
            await got.wait()
            started = time.monotonic()
            try:
                await holder.closing
            except aiormq.exceptions.AMQPError as exc:
                print(f"channel closed by the broker after {time.monotonic() - started:.0f} s")
                print(f"  {exc}")
            back = await channel.basic_get("held", no_ack=True)
            print(f"message back with x-delivery-count {_count(back)}")
        finally:
            await connection.close()


async def main(count: int, runs: int) -> None:
    results: dict[str, list[tuple[float, int]]] = {"nack": [], "republish": []}
    for _ in range(runs):
        for mode in results:
            results[mode].append(await one_run(count, mode))
    print(f"releasing {count:,} held deliveries, {runs} runs, median (min-max)")
    print("| release by | total ms | us per delivery | x-delivery-count when back |")
    print("|---|---|---|---|")
    for mode, rows in results.items():
        seconds = [r[0] for r in rows]
        spent = sorted({r[1] for r in rows})
        print(
            f"| {mode} | {_fmt(seconds, 1000)} | {_fmt([s / count for s in seconds], 1e6)} "
            f"| {', '.join(map(str, spent))} |"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--consumer-timeout-ms", type=int, default=0)
    args = parser.parse_args()
    if args.consumer_timeout_ms:
        asyncio.run(hold_past_consumer_timeout(args.consumer_timeout_ms))
    else:
        asyncio.run(main(args.count, args.runs))
