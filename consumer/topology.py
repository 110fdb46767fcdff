"""Broker topology, declared idempotently by every process that consumes or publishes.

exchange <RABBITMQ_EXCHANGE> (topic) --#--> quorum queue <RABBITMQ_QUEUE>
    x-delivery-limit, x-dead-letter-exchange=<exchange>.dlx
exchange <exchange>.dlx (topic) --#--> quorum queue <queue>.dlq
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection

from bulk_recorder.infra.broker import TopologyMismatch
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


async def declare_or_mismatch(channel: AbstractChannel, topology: Topology) -> None:
    """:func:`declare_topology`; a PRECONDITION_FAILED (the queue or an exchange exists with
    other arguments) raises :class:`TopologyMismatch`, naming the queue and what must match."""
    try:
        await declare_topology(channel, topology)
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        raise TopologyMismatch(
            f"the broker refused our topology ({exc}): queue {topology.queue} "
            "or its exchanges already exist with other arguments. The queue must be "
            "a quorum queue with x-delivery-limit=RABBITMQ_DELIVERY_LIMIT "
            f"({topology.delivery_limit}) and x-dead-letter-exchange="
            f"{topology.dead_letter_exchange}; set RABBITMQ_DELIVERY_LIMIT to "
            "the existing value, use another RABBITMQ_QUEUE, or delete the queue."
        ) from None


async def delete_topology(
    connection: AbstractConnection, topology: Topology, wait_s: float = 60
) -> list[str]:
    """Remove everything :func:`declare_topology` made (tests and benchmarks clean up with it).

    Each queue and exchange is deleted on a channel of its own, so one failure (a timeout while
    a quorum queue with a long backlog is dropped, a channel closed by an error) does not leave
    the others behind. Returns what could not be deleted, with the reason.
    """
    left: list[str] = []
    targets = [("queue", topology.queue), ("queue", topology.dead_letter_queue)]
    targets += [("exchange", topology.exchange), ("exchange", topology.dead_letter_exchange)]
    for kind, name in targets:
        try:
            channel = await connection.channel()
            if kind == "queue":
                await channel.queue_delete(name, timeout=wait_s)
            else:
                await channel.exchange_delete(name, timeout=wait_s)
            await channel.close()
        except Exception as exc:  # reported to the caller; the rest are still deleted
            left.append(f"{kind} {name}: {exc!r}")
    return left
