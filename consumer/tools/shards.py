"""``bulk-recorder shards status|prune``: the queue shards of a deployment, by hand.

status [--management URL]
    Each shard queue that exists, 1 to ``RABBITMQ_QUEUE_SHARDS`` and the leftovers past it
    (``<queue>.shard-<k>``, probed up to the first missing one): whether it is routed (k <= N)
    or a leftover, its messages ready and its consumers (every recorder's), by passive
    declares; and whether the shard exchange exists. Changes nothing. AMQP does not tell a
    queue's leader nor its unacked count: with ``--management URL`` (the management plugin's
    API) each shard's leader node and unacked messages are read from there
    (:mod:`consumer.tools.shards_management`); without it they show as ``-``.

prune [--wait SECONDS]
    Declares the topology for ``RABBITMQ_QUEUE_SHARDS`` (which moves the route onto N shards
    and unbinds the leftovers), then deletes the leftover shards past N once each is drained,
    from the highest down (a shard still holding messages keeps the ones below it, so that the
    recorders' probe, which stops at the first missing shard, still finds them). Each one is
    checked and deleted under the route lock, after its binding to the shard exchange is
    removed: nothing can reach it in between. Drained means no message ready and no consumer,
    answered within STAT_TIMEOUT_S (RabbitMQ 3.10 answers 0 and 0 for a leader too slow to count):
    the recorders let go of an empty leftover shard at their next look (every 5 s), and a
    quorum queue keeps a consumer, even a cancelled one, while it holds unacked messages, so
    no consumer also means nothing unacked. With one shard, the shard exchange goes too once
    no leftover is left (under the lock, after the direct route is bound). ``--wait SECONDS``
    waits that long for the drain; what is still not drained then is named on stderr, exit 1.

Run ``prune`` after every process runs the new ``RABBITMQ_QUEUE_SHARDS`` (a process still on a
larger N binds its shards again when it reconnects).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from consumer.arguments import positive_seconds
from consumer.queue_count import STAT_TIMEOUT_S, QueueCount

# The drivers when the command runs: `bulk-recorder --help` builds this parser.
if TYPE_CHECKING:
    from aiormq.abc import AbstractConnection as RawConnection

    from consumer.topology import Topology
    from settings import Settings

PRUNE_POLL_S = 1.0


@dataclass(frozen=True, slots=True)
class Shard:
    number: int
    queue: str
    routed: bool
    ready: int
    consumers: int
    unacked: int | None = None  # from the management API, when asked
    leader: str | None = None
    counted: bool = True  # False: 0 and 0 answered too late to be a count (STAT_TIMEOUT_S)

    @property
    def drained(self) -> bool:
        return self.counted and self.ready == 0 and self.consumers == 0

    def holding(self) -> str:
        """What it holds, for the line that says it is not drained."""
        if not self.counted:
            return f"{self.queue} (no count from its leader within {STAT_TIMEOUT_S:g} s)"
        return f"{self.queue} ({self.ready} ready, {self.consumers} consumers)"

    @classmethod
    def of(cls, number: int, queue: str, routed: bool, count: QueueCount) -> Shard:
        return cls(number, queue, routed, count.ready, count.consumers, counted=count.counted)

    def line(self) -> str:
        route = "routed" if self.routed else "leftover"
        unacked = "-" if self.unacked is None else str(self.unacked)
        ready, consumers = (self.ready, self.consumers) if self.counted else ("?", "?")
        counts = f"{ready:>9}  {unacked:>9}  {consumers:>9}"
        return f"{self.number:>5}  {self.queue:<40}  {route:<8}  {counts}  {self.leader or '-'}"


HEADER = (
    f"{'shard':>5}  {'queue':<40}  {'route':<8}  {'ready':>9}  {'unacked':>9}  "
    f"{'consumers':>9}  leader"
)


def add_parser(sub: Any) -> None:
    """The ``shards`` sub-command and its own sub-commands."""
    shards = sub.add_parser("shards", help="the queue shards: status, or prune drained leftovers")
    shards_sub = shards.add_subparsers(dest="shards_command", required=True)
    status = shards_sub.add_parser(
        "status", help="each shard queue: routed or leftover, messages ready, consumers"
    )
    status.add_argument(
        "--management",
        metavar="URL",
        default=None,
        help="the management API (http://HOST:15672): each shard's leader node and unacked "
        "messages too, with RABBITMQ_URL's credentials unless the URL has its own",
    )
    prune = shards_sub.add_parser(
        "prune", help="delete the leftover shards past RABBITMQ_QUEUE_SHARDS once drained"
    )
    prune.add_argument(
        "--wait",
        type=positive_seconds,
        default=None,
        metavar="SECONDS",
        help="wait up to this long for the leftovers to drain (unset: look once)",
    )


def cmd_shards(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.runner import run_async

    if args.shards_command == "status":
        return run_async(shards_status(settings, management=args.management))
    return run_async(shards_prune(settings, wait_s=args.wait or 0.0))


async def _look(connection: RawConnection, queue: str) -> QueueCount | None:
    """Ready messages and consumers of ``queue``; None if it does not exist."""
    import aiormq

    from consumer.queue_count import timed_count

    channel = await connection.channel(publisher_confirms=False)
    try:
        count = await timed_count(lambda: channel.queue_declare(queue, passive=True))
    except aiormq.exceptions.ChannelNotFoundEntity:
        return None
    await channel.close()
    return count


async def look_at_shards(connection: RawConnection, topology: Topology) -> list[Shard]:
    """Shards 1 to N that exist, then the leftovers past N up to the first missing one."""
    shards: list[Shard] = []
    for number in [*range(1, topology.shards + 1), *topology.leftover_numbers()]:
        found = await _look(connection, topology.shard_queue(number))
        if found is None:
            if number > topology.shards:
                break
            continue
        routed = number <= topology.shards
        shards.append(Shard.of(number, topology.shard_queue(number), routed, found))
    return shards


async def _connect(settings: Settings) -> tuple[Any, RawConnection] | None:
    from bulk_recorder.infra.broker import BrokerNodes, split_urls
    from bulk_recorder.infra.errors import BROKER_ERRORS
    from bulk_recorder.masking import endpoint, masked

    try:
        connection = await BrokerNodes.from_setting(settings.rabbitmq_url).connect()
    except BROKER_ERRORS as exc:
        where = ", ".join(endpoint(url) for url in split_urls(settings.rabbitmq_url))
        print(
            f"bulk-recorder shards: cannot reach RabbitMQ at {where}: {masked(str(exc))}",
            file=sys.stderr,
        )
        return None
    channel = await connection.channel(publisher_confirms=False)
    raw = await channel.get_underlay_channel()
    return connection, raw.connection


async def shards_status(
    settings: Settings, out: TextIO | None = None, *, management: str | None = None
) -> int:
    """Print every shard queue that exists and the shard exchange; change nothing. With
    ``management`` (the management API's URL), each shard's leader and unacked count too."""
    import asyncio
    import dataclasses

    from consumer.tools.shards_management import Management
    from consumer.topology import Topology, exchange_exists

    out = out or sys.stdout
    topology = Topology.from_settings(settings)
    api = None if management is None else Management.of(management, settings.rabbitmq_url)
    connected = await _connect(settings)
    if connected is None:
        return 1
    connection, raw = connected
    async with connection:
        shards = await look_at_shards(raw, topology)
        exchange = await exchange_exists(raw, topology.shard_exchange)
    if api is not None:
        for index, shard in enumerate(shards):
            facts = await asyncio.to_thread(api.queue, shard.queue)
            if facts is not None:
                shards[index] = dataclasses.replace(
                    shard, unacked=facts.unacked, leader=facts.leader
                )
    print(
        f"RABBITMQ_QUEUE_SHARDS={topology.shards}; shard exchange {topology.shard_exchange}: "
        f"{'present' if exchange else 'absent'}",
        file=out,
    )
    print(HEADER, file=out)
    for shard in shards:
        print(shard.line(), file=out)
    late = [s.queue for s in shards if not s.counted]
    if late:
        print(
            f"? no count: the leader of {', '.join(late)} answered 0 and 0 after "
            f"{STAT_TIMEOUT_S:g} s, RabbitMQ's answer for a leader that did not count in time "
            "(ask again)",
            file=out,
        )
    leftovers = [s for s in shards if not s.routed]
    if leftovers:
        print(
            f"{len(leftovers)} leftover shard(s): `bulk-recorder shards prune` deletes each "
            "once drained",
            file=out,
        )
    return 0


async def shards_prune(
    settings: Settings, *, wait_s: float = 0.0, out: TextIO | None = None
) -> int:
    """Delete the drained leftover shards (and, with one shard, the shard exchange); exit 1
    naming what is still not drained after ``wait_s``."""
    import asyncio

    from consumer.topology import Topology, declare_or_mismatch

    out = out or sys.stdout
    topology = Topology.from_settings(settings)
    connected = await _connect(settings)
    if connected is None:
        return 1
    connection, raw = connected
    async with connection:
        await declare_or_mismatch(await connection.channel(), topology)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            left = await _prune_once(raw, topology, out)
            if not left or loop.time() >= deadline:
                break
            await asyncio.sleep(min(PRUNE_POLL_S, max(0.0, deadline - loop.time())))
        if left:
            named = ", ".join(s.holding() for s in left)
            print(f"bulk-recorder shards prune: not drained: {named}", file=sys.stderr)
            return 1
        if topology.shards == 1:
            await _drop_shard_exchange(raw, topology, out)
    return 0


async def _prune_once(raw: RawConnection, topology: Topology, out: TextIO) -> list[Shard]:
    """Delete drained leftovers from the highest down; the ones left, highest first."""
    from consumer.topology import exchange_exists, existing_leftovers

    leftovers = await existing_leftovers(raw, topology)
    has_exchange = await exchange_exists(raw, topology.shard_exchange)
    for index, number in enumerate(reversed(leftovers)):
        shard = await _prune_one(raw, topology, number, unbind=has_exchange)
        if shard is None:
            print(f"deleted {topology.shard_queue(number)} (drained)", file=out)
            continue
        rest = list(reversed(leftovers))[index + 1 :]
        below = [Shard(k, topology.shard_queue(k), False, 0, 0) for k in rest]
        return [shard, *below]
    return []


async def _prune_one(
    raw: RawConnection, topology: Topology, number: int, *, unbind: bool
) -> Shard | None:
    """Under the route lock: unbind shard ``number``, and delete it if it is drained (None);
    else what it holds."""
    from consumer.queue_count import timed_count
    from consumer.topology import route_lock

    queue = topology.shard_queue(number)
    async with route_lock(raw, topology.lock_queue):
        channel = await raw.channel(publisher_confirms=False)
        if unbind:
            await channel.queue_unbind(queue, topology.shard_exchange, routing_key="")
        count = await timed_count(lambda: channel.queue_declare(queue, passive=True))
        shard = Shard.of(number, queue, False, count)
        if shard.drained:
            await channel.queue_delete(queue)
        await channel.close()
    return None if shard.drained else shard


async def _drop_shard_exchange(raw: RawConnection, topology: Topology, out: TextIO) -> None:
    """One shard, no leftover: the direct route bound, then the shard exchange deleted."""
    from consumer.topology import exchange_exists, route_lock

    if not await exchange_exists(raw, topology.shard_exchange):
        return
    async with route_lock(raw, topology.lock_queue):
        channel = await raw.channel(publisher_confirms=False)
        await channel.queue_bind(topology.queue, topology.exchange, routing_key="#")
        await channel.exchange_delete(topology.shard_exchange)
        await channel.close()
    print(f"deleted exchange {topology.shard_exchange} (one shard)", file=out)
