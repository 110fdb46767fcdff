"""A process that floods the dead-letter exchange, for the DLQ tests: once it reads a line on
stdin it publishes dead letters ``flood-<tag>-<n>`` as fast as it can, in order, until stdin
closes (or a minute passes); then it prints how many it published.

It does not wait for each confirm: up to WINDOW publishes are on their way at once, so many are
logged but not yet applied when a count is read. It does wait for every confirm before it
prints, and counts only what the broker confirmed: a broker starved of CPU drops the
unconfirmed publishes still pending in a channel when the channel closes, so a flooder that
counted what it had written (it did, without confirms) counted messages that never arrived.

    python -m tests.integration.dead_letter_flood AMQP_URL DEAD_LETTER_EXCHANGE TAG
"""

from __future__ import annotations

import asyncio
import sys

import aio_pika

from consumer.delivery import ERROR_HEADER

REASON = "invalid JSON"
LONGEST_S = 60.0
WINDOW = 500  # publishes on their way at once


def flood_id(tag: str, n: int) -> str:
    return f"flood-{tag}-{n:07d}"


async def flood(url: str, exchange_name: str, tag: str) -> int:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(exchange_name)
        print("ready", flush=True)
        await stdin.readline()
        stopped = asyncio.ensure_future(stdin.read())  # EOF: stop
        window = asyncio.Semaphore(WINDOW)
        on_their_way: set[asyncio.Task[object]] = set()

        async def publish(message: aio_pika.Message) -> None:
            try:
                await exchange.publish(message, "transaction")  # raises if the broker nacks
            finally:
                window.release()

        sent, deadline = 0, loop.time() + LONGEST_S
        while not stopped.done() and loop.time() < deadline:
            await window.acquire()
            message_id = flood_id(tag, sent)
            message = aio_pika.Message(
                message_id.encode(),
                message_id=message_id,
                headers={ERROR_HEADER: REASON},
                type="transaction",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            # tasks take the channel's lock in the order they were made: the frames go in order
            task: asyncio.Task[object] = asyncio.ensure_future(publish(message))
            on_their_way.add(task)
            task.add_done_callback(on_their_way.discard)
            sent += 1
        stopped.cancel()
        await asyncio.gather(*on_their_way)
    return sent


if __name__ == "__main__":
    print(asyncio.run(flood(*sys.argv[1:4])), flush=True)
