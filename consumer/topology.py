"""Broker topology, declared idempotently by every process that consumes or publishes.

One shard (``RABBITMQ_QUEUE_SHARDS=1``, the default)::

    exchange <RABBITMQ_EXCHANGE> (topic) --#--> quorum queue <RABBITMQ_QUEUE>
        x-delivery-limit, x-dead-letter-exchange=<exchange>.dlx
    exchange <exchange>.dlx (topic) --#--> quorum queue <queue>.dlq

N shards: shard 1 is ``<RABBITMQ_QUEUE>`` itself, shard k >= 2 is ``<queue>.shard-<k>`` (a
quorum queue with the same arguments plus ``x-queue-leader-locator: balanced``, and with
``RABBITMQ_QUEUE_SHARD_REPLICAS`` set, ``x-quorum-initial-group-size``), and the route goes
through a random exchange::

    <exchange> --#--> <exchange>.shards (x-random) --> every shard queue

Changing N moves the route with a bind before each unbind, under a lock (an exclusive queue,
``<exchange>.topology-lock``, that only one connection can hold), so that some route exists at
every instant, also when processes with different N declare at once (:func:`move_route`).
Nothing is deleted here: ``bulk-recorder shards prune`` removes drained leftover shards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.abc import AbstractChannel as RawChannel
from aiormq.abc import AbstractConnection as RawConnection

from bulk_recorder.infra.broker import TopologyMismatch
from bulk_recorder.shard_settings import MAX_SHARDS
from settings import Settings

log = logging.getLogger(__name__)

# The exchange type that spreads the records over the shards (plugin rabbitmq_random_exchange).
RANDOM_EXCHANGE = "x-random"
RANDOM_PLUGIN = "rabbitmq_random_exchange"
# The quorum queue argument RABBITMQ_QUEUE_SHARD_REPLICAS sets on shards 2..N.
GROUP_SIZE = "x-quorum-initial-group-size"
# How long a route change waits for another process's (each holds it for a few round trips).
LOCK_WAIT_S = 60.0
_LOCK_RETRY_S = (0.05, 0.5)  # first and longest pause between two tries


class ShardExchangeUnavailable(TopologyMismatch):
    """The broker does not know the random exchange type: its plugin is not enabled."""


@dataclass(frozen=True, slots=True)
class Topology:
    exchange: str
    queue: str
    delivery_limit: int
    shards: int = 1
    # x-quorum-initial-group-size of shards 2..N; 0: none (a member on every node)
    shard_replicas: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> Topology:
        return cls(
            exchange=settings.rabbitmq_exchange,
            queue=settings.rabbitmq_queue,
            delivery_limit=settings.rabbitmq_delivery_limit,
            shards=settings.rabbitmq_queue_shards,
            shard_replicas=settings.rabbitmq_queue_shard_replicas,
        )

    @property
    def dead_letter_exchange(self) -> str:
        return f"{self.exchange}.dlx"

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.queue}.dlq"

    @property
    def shard_exchange(self) -> str:
        """The random exchange in front of the shards (declared only with more than one)."""
        return f"{self.exchange}.shards"

    @property
    def lock_queue(self) -> str:
        """The exclusive queue that serialises route changes between processes."""
        return f"{self.exchange}.topology-lock"

    def shard_queue(self, number: int) -> str:
        """Shard 1 is RABBITMQ_QUEUE itself; shard k >= 2 is ``<queue>.shard-<k>``."""
        if number < 1:
            raise ValueError(f"shards are numbered from 1, not {number}")
        return self.queue if number == 1 else f"{self.queue}.shard-{number}"

    def shard_queues(self) -> list[str]:
        """The routed shards, 1 to N."""
        return [self.shard_queue(k) for k in range(1, self.shards + 1)]

    def shard_number(self, queue: str) -> int | None:
        """The number of shard ``queue``, or None if it is not one of this topology's."""
        if queue == self.queue:
            return 1
        prefix = f"{self.queue}.shard-"
        tail = queue.removeprefix(prefix)
        if tail == queue or not tail.isdigit() or tail.startswith("0") or int(tail) < 2:
            return None
        return int(tail)

    def leftover_numbers(self) -> range:
        """The shard numbers past N, probed in order up to the first that does not exist."""
        return range(self.shards + 1, MAX_SHARDS + 1)

    def queue_arguments(self, number: int = 1) -> dict[str, Any]:
        arguments: dict[str, Any] = {
            "x-queue-type": "quorum",
            "x-delivery-limit": self.delivery_limit,
            "x-dead-letter-exchange": self.dead_letter_exchange,
        }
        if number >= 2:  # shard 1 keeps today's arguments exactly
            arguments["x-queue-leader-locator"] = "balanced"
            if self.shard_replicas:
                arguments[GROUP_SIZE] = self.shard_replicas
        return arguments


async def declare_topology(channel: AbstractChannel, topology: Topology) -> None:
    """Declare the exchanges, the queues and their bindings (safe to repeat); with more than
    one shard, the shard exchange and queues, then the route moved onto them (and with one, the
    route moved back if a shard exchange exists): :func:`move_route`."""
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
    raw = await channel.get_underlay_channel()
    if topology.shards == 1 and not await exchange_exists(raw.connection, topology.shard_exchange):
        await queue.bind(exchange, "#")  # never sharded (or pruned since): the one queue
        return
    await move_route(channel, topology)


async def move_route(channel: AbstractChannel, topology: Topology) -> None:
    """Put the route where ``topology.shards`` wants it, on ``channel``'s connection.

    More than one shard: the shard exchange, the shard queues and their bindings, then, under
    the route lock, ``<exchange> -> <exchange>.shards`` bound and only then the direct binding
    to the queue, and the bindings of leftover shards (past N) to the shard exchange, removed.
    One shard (:func:`declare_topology` calls this only when a shard exchange exists): under
    the lock, the direct binding bound and then ``<exchange> -> <exchange>.shards`` removed.
    A route is added before one is removed, and two processes never interleave their changes,
    so a message always has somewhere to go. One published in the round trip while both routes
    exist may reach two queues: the insert records it once; an invalid one is dead-lettered
    twice (the DLQ is at-least-once).
    """
    raw = await channel.get_underlay_channel()
    connection = raw.connection
    if topology.shards == 1:
        # bound under the lock, just before the unbind: both routes exist for one round trip
        # (a message published then may reach two queues: recorded once, dead-lettered twice)
        async with route_lock(connection, topology.lock_queue):
            await raw.queue_bind(topology.queue, topology.exchange, routing_key="#")
            await raw.exchange_unbind(
                destination=topology.shard_exchange, source=topology.exchange, routing_key="#"
            )
        return
    await _declare_shards(raw, topology)
    leftovers = await existing_leftovers(connection, topology)
    async with route_lock(connection, topology.lock_queue):
        await raw.exchange_bind(
            destination=topology.shard_exchange, source=topology.exchange, routing_key="#"
        )
        await raw.queue_unbind(topology.queue, topology.exchange, routing_key="#")
        for number in leftovers:
            await raw.queue_unbind(topology.shard_queue(number), topology.shard_exchange, "")


async def _declare_shards(raw: RawChannel, topology: Topology) -> None:
    """The random exchange and shards 2..N (shard 1 is declared already), each bound to it."""
    await raw.exchange_declare(topology.shard_exchange, exchange_type=RANDOM_EXCHANGE, durable=True)
    for number in range(1, topology.shards + 1):
        name = topology.shard_queue(number)
        if number >= 2:
            await raw.queue_declare(name, durable=True, arguments=topology.queue_arguments(number))
        await raw.queue_bind(name, topology.shard_exchange, routing_key="")


@contextlib.asynccontextmanager
async def route_lock(
    connection: RawConnection, name: str, wait_s: float = LOCK_WAIT_S
) -> AsyncIterator[None]:
    """Hold the exclusive queue ``name`` on a channel of its own: another connection that
    declares it meanwhile is refused (RESOURCE_LOCKED) and tries again, with a growing pause,
    for ``wait_s``, then raises TimeoutError (a broker failure to its caller's retry loop). The
    broker drops the queue with our connection if we die holding it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    pause = _LOCK_RETRY_S[0]
    while True:
        lock = await connection.channel(publisher_confirms=False)
        try:
            await lock.queue_declare(name, exclusive=True, auto_delete=True)
            break
        except aiormq.exceptions.ChannelLockedResource:
            if loop.time() + pause > deadline:
                raise TimeoutError(f"the route lock {name} stayed held for {wait_s:g} s") from None
            log.debug("route lock %s held by another process: waiting", name)
            await asyncio.sleep(pause)
            pause = min(pause * 2, _LOCK_RETRY_S[1])
    try:
        yield
    finally:
        with contextlib.suppress(aiormq.exceptions.AMQPError, RuntimeError):
            await lock.queue_delete(name)
            await lock.close()


async def exchange_exists(connection: RawConnection, name: str) -> bool:
    """A passive declare on a throwaway channel (a missing exchange closes it)."""
    probe = await connection.channel(publisher_confirms=False)
    try:
        await probe.exchange_declare(name, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    await probe.close()
    return True


async def existing_leftovers(connection: RawConnection, topology: Topology) -> list[int]:
    """The shards past N that exist: N+1, N+2, ... up to the first that does not (passive
    declares on one throwaway channel, which the first missing one closes)."""
    found: list[int] = []
    probe = await connection.channel(publisher_confirms=False)
    for number in topology.leftover_numbers():
        try:
            await probe.queue_declare(topology.shard_queue(number), passive=True)
        except aiormq.exceptions.ChannelNotFoundEntity:
            return found
        found.append(number)
    await probe.close()
    return found


async def declare_or_mismatch(channel: AbstractChannel, topology: Topology) -> None:
    """:func:`declare_topology`; a PRECONDITION_FAILED (the queue or an exchange exists with
    other arguments) raises :class:`TopologyMismatch`, naming the queue and what must match;
    a broker without the random exchange type raises :class:`ShardExchangeUnavailable`."""
    try:
        await declare_topology(channel, topology)
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        if GROUP_SIZE in str(exc):
            raise TopologyMismatch(
                f"the broker refused our topology ({exc}): a shard of queue {topology.queue} "
                f"exists with another group size than RABBITMQ_QUEUE_SHARD_REPLICAS "
                f"({topology.shard_replicas}; 0: none). Give every process the value the "
                "shards were declared with, or drain and delete shards 2 and up to change it."
            ) from None
        raise TopologyMismatch(
            f"the broker refused our topology ({exc}): queue {topology.queue} "
            "or its exchanges already exist with other arguments. The queue must be "
            "a quorum queue with x-delivery-limit=RABBITMQ_DELIVERY_LIMIT "
            f"({topology.delivery_limit}) and x-dead-letter-exchange="
            f"{topology.dead_letter_exchange}; set RABBITMQ_DELIVERY_LIMIT to "
            "the existing value, use another RABBITMQ_QUEUE, or delete the queue."
        ) from None
    except aiormq.exceptions.ConnectionCommandInvalid as exc:
        if RANDOM_EXCHANGE not in str(exc):
            raise
        raise ShardExchangeUnavailable(
            f"RABBITMQ_QUEUE_SHARDS={topology.shards} needs the broker plugin {RANDOM_PLUGIN} "
            f"(exchange type {RANDOM_EXCHANGE}) enabled on every node: `rabbitmq-plugins enable "
            f"{RANDOM_PLUGIN}`, or set RABBITMQ_QUEUE_SHARDS=1 (the broker said: {exc})"
        ) from None


async def delete_topology(
    connection: AbstractConnection, topology: Topology, wait_s: float = 60
) -> list[str]:
    """Remove everything :func:`declare_topology` made (tests and benchmarks clean up with it):
    with more than one shard, the shard queues up to ``topology.shards`` and the shard exchange
    too.

    Each queue and exchange is deleted on a channel of its own, so one failure (a timeout while
    a quorum queue with a long backlog is dropped, a channel closed by an error) does not leave
    the others behind. Returns what could not be deleted, with the reason.
    """
    left: list[str] = []
    targets = [("queue", topology.queue), ("queue", topology.dead_letter_queue)]
    targets += [("queue", topology.shard_queue(k)) for k in range(2, topology.shards + 1)]
    targets += [("exchange", topology.exchange), ("exchange", topology.dead_letter_exchange)]
    if topology.shards > 1:
        targets.append(("exchange", topology.shard_exchange))
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
