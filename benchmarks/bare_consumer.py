"""A bare aiormq consume+ack consumer in its own process: the CPU and latency floor.

    python -m benchmarks.bare_consumer --url AMQP_URL --queue NAME --prefetch N --out PATH

What any consumer of the queue must pay before it does any work: uvloop + aiormq,
``basic_qos(N)``, ``basic_consume(no_ack=False)`` and one ``await channel.basic_ack(tag)`` per
delivery (the "aiormq basic_ack" mode of ``bench_limits``, the path the recorder's own acks
take). ``bench_latency`` runs it side by side with the recorder at the same steady rate and
reads its CPU time from /proc, so that the recorder's CPU per message can be judged against it
(the issue's target: <= 1.2x at 1,000 msg/s).

It also notes each message's ``message_id`` -> arrival time (``time.time()``), so that
publish -> delivered (what the broker alone costs) stays measurable. Prints ``ready`` once
consuming; on SIGUSR1 prints how many messages have arrived so far (one line, for the bench
to know when all are in); on SIGTERM writes ``{"delivered": {id: t, ...}}`` to ``--out`` and
exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from pathlib import Path

import aiormq
import uvloop
from aiormq.abc import DeliveredMessage


async def consume(url: str, queue: str, prefetch: int) -> dict[str, float]:
    """Consume and ack until SIGTERM; message_id -> arrival time of every delivery."""
    delivered: dict[str, float] = {}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: print(len(delivered), flush=True))
    connection = await aiormq.connect(url)
    try:
        channel = await connection.channel()
        await channel.basic_qos(prefetch_count=prefetch)

        async def on_message(message: DeliveredMessage) -> None:
            delivered[message.header.properties.message_id or ""] = time.time()
            await channel.basic_ack(message.delivery_tag or 0)

        await channel.basic_consume(queue, on_message, no_ack=False)
        print("ready", flush=True)
        await stop.wait()
    finally:
        await connection.close()
    return delivered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", required=True, help="AMQP URL of the broker")
    parser.add_argument("--queue", required=True, help="queue to consume (it must exist)")
    parser.add_argument("--prefetch", type=int, required=True, help="channel QoS (basic_qos)")
    parser.add_argument("--out", type=Path, required=True, help="JSON file written on SIGTERM")
    args = parser.parse_args()
    delivered = uvloop.run(consume(args.url, args.queue, args.prefetch))
    args.out.write_text(json.dumps({"delivered": delivered}), encoding="utf-8")


if __name__ == "__main__":
    main()
