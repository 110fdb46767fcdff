"""A process that floods the dead-letter exchange, for the DLQ tests: once it reads a line on
stdin it publishes dead letters ``flood-<tag>-<n>`` as fast as it can, without waiting for
confirms (many are then on their way when a count is read), until stdin closes (or a minute
passes); then it prints how many it published, in order.

    python -m tests.integration.dead_letter_flood AMQP_URL DEAD_LETTER_EXCHANGE TAG
"""

from __future__ import annotations

import asyncio
import sys

import aio_pika

from consumer.delivery import ERROR_HEADER

REASON = "invalid JSON"
LONGEST_S = 60.0


def flood_id(tag: str, n: int) -> str:
    return f"flood-{tag}-{n:07d}"


async def flood(url: str, exchange_name: str, tag: str) -> int:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel(publisher_confirms=False)
        exchange = await channel.get_exchange(exchange_name)
        print("ready", flush=True)
        await stdin.readline()
        stopped = asyncio.ensure_future(stdin.read())  # EOF: stop
        sent, deadline = 0, loop.time() + LONGEST_S
        while not stopped.done() and loop.time() < deadline:
            for _ in range(50):
                message_id = flood_id(tag, sent)
                message = aio_pika.Message(
                    message_id.encode(),
                    message_id=message_id,
                    headers={ERROR_HEADER: REASON},
                    type="transaction",
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                )
                await exchange.publish(message, "transaction")
                sent += 1
            await asyncio.sleep(0)
        stopped.cancel()
    return sent


if __name__ == "__main__":
    print(asyncio.run(flood(*sys.argv[1:4])), flush=True)
