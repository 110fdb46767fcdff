"""Broker topology, declared idempotently by every process that consumes or publishes.

exchange <RABBITMQ_EXCHANGE> (topic) --#--> quorum queue <RABBITMQ_QUEUE>
    x-delivery-limit, x-dead-letter-exchange=<exchange>.dlx
exchange <exchange>.dlx (topic) --#--> quorum queue <queue>.dlq
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel

from settings import Settings


@dataclass(frozen=True, slots=True)
class Topology:
    exchange: str
    queue: str
    delivery_limit: int

    @classmethod
    def from_settings(cls, settings: Settings) -> Topology:
        return cls(
            exchange=settings.rabbitmq_exchange,
            queue=settings.rabbitmq_queue,
            delivery_limit=settings.rabbitmq_delivery_limit,
        )

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.exchange}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.queue}.dlq"

    def queue_arguments(self) -> dict[str, Any]:
        return {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.delivery_limit,
            "x-dead-letter-exchange": self.dead_letter_exchange,
        }


async def declare_topology(channel: AbstractChannel, topology: Topology) -> None:
    """Declare both exchanges and both queues with their bindings (safe to repeat)."""
    exchange = await channel.declare_exchange(
        topology.exchange, aio_pika.ExchangeType.TOPIC, durable=True
    )
    dlx = await channel.declare_exchange(
        topology.dead_letter_exchange, aio_pika.ExchangeType.TOPIC, durable=True
    )
    dlq = await channel.declare_queue(
        topology.dead_letter_queue, durable=True, arguments={"x-queue-type": "quorum"}
    )
    await dlq.bind(dlx, "#")
    queue = await channel.declare_queue(
        topology.queue, durable=True, arguments=topology.queue_arguments()
    )
    await queue.bind(exchange, "#")


async def delete_topology(channel: AbstractChannel, topology: Topology) -> None:
    """Remove everything :func:`declare_topology` made (tests and demo clean-up)."""
    for queue in (topology.queue, topology.dead_letter_queue):
        await channel.queue_delete(queue)
    for exchange in (topology.exchange, topology.dead_letter_exchange):
        await channel.exchange_delete(exchange)
