"""The per-message peer: a FastStream subscriber that records each message on its own.

    python -m benchmarks.faststream_subscriber --url AMQP --dsn DSN --queue NAME --count N

What a team would write with FastStream instead of this service (issue 22's comparison):
one ``@broker.subscriber`` on the recorder's queue with a channel QoS of ``--prefetch``
(50), an asyncpg pool of ``--pool`` (5) connections, and a handler that decodes the body and
writes that one record, acked by FastStream after the handler returns (its default ack
policy: ack after the work, reject on an error). aiormq runs each delivery's handler in a task
of its own, so up to ``--prefetch`` handlers wait on the pool at once.

The work per message is the recorder's own: ``bulk_recorder.records.decode`` (the same
compiled decoder, so the comparison is bulk against per-message and not one decoder against
another) and ``PgWriter.write`` with a one-record batch, the same statements with
``ON CONFLICT (id) DO NOTHING``. What differs is what the service is for: one transaction and
one ack per record instead of one per flush.

Prints ``ready`` once consuming. When ``--count`` handlers have finished it prints one JSON
line: the handled count, the wall time and the process CPU time (``time.process_time``, all
threads) at the first 1% and at the last handler, then exits 0 (the same window
``bench_e2e`` reads the recorder's rate over).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import asyncpg
from faststream import AckPolicy
from faststream.rabbit import Channel, RabbitBroker, RabbitMessage, RabbitQueue

from benchmarks.support.env import use_uvloop
from bulk_recorder.recorder.writer import PgWriter
from bulk_recorder.records.validation import decode


class Marks:
    """Wall and CPU time at the first 1% of ``count`` handled and at the last one."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.handled = 0
        self.first_at = max(1, count // 100)
        self.first: tuple[float, float] = (0.0, 0.0)
        self.done = asyncio.Event()

    def tick(self) -> None:
        self.handled += 1
        if self.handled == self.first_at:
            self.first = (time.monotonic(), time.process_time())
        if self.handled == self.count:
            wall, cpu = time.monotonic(), time.process_time()
            print(
                json.dumps(
                    {
                        "handled": self.handled - self.first_at,
                        "seconds": wall - self.first[0],
                        "cpu_s": cpu - self.first[1],
                    }
                ),
                flush=True,
            )
            self.done.set()


async def raw_body(message: Any) -> bytes:
    """FastStream's decoder hook: the body as it came, for the recorder's own decoder."""
    return bytes(message.body)


async def run(args: argparse.Namespace) -> None:
    pool = await asyncpg.create_pool(args.dsn, min_size=args.pool, max_size=args.pool)
    writer = PgWriter(pool)
    marks = Marks(args.count)
    broker = RabbitBroker(args.url, logger=None)

    async def record(body: bytes, message: RabbitMessage) -> None:
        await writer.write([decode(body, message.raw_message.type)])
        marks.tick()

    # Registered by a call rather than as a decorator: the same thing, and it stays typed
    # where faststream (a benchmark extra) is not installed.
    broker.subscriber(
        RabbitQueue(args.queue, declare=False),
        channel=Channel(prefetch_count=args.prefetch),
        ack_policy=AckPolicy.REJECT_ON_ERROR,
        decoder=raw_body,
    )(record)

    try:
        await broker.start()
        print("ready", flush=True)
        await marks.done.wait()
    finally:
        await broker.stop()
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--url", required=True, help="AMQP URL of the broker")
    parser.add_argument("--dsn", required=True, help="PostgreSQL DSN of a migrated database")
    parser.add_argument("--queue", required=True, help="queue to consume (it must exist)")
    parser.add_argument("--count", type=int, required=True, help="records to handle, then exit")
    parser.add_argument("--prefetch", type=int, default=50, help="channel QoS")
    parser.add_argument("--pool", type=int, default=5, help="asyncpg pool size")
    args = parser.parse_args()
    use_uvloop()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
