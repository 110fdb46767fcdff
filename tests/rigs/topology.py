"""The recorder's topology declared on (and deleted from) a rig's broker through one node of the
caller's choice.

A quorum queue's first leader is the node its declaring client is connected to (client-local),
so the node whose URL is given leads the queue (shard 1) and the DLQ; shards 2..N are placed by
their own ``x-queue-leader-locator``. The cluster tests and ``benchmarks/bench_shards.py`` both
declare this way.
"""

from __future__ import annotations

import aio_pika

from consumer.topology import Topology, declare_topology, delete_topology


async def declare_through(url: str, topology: Topology) -> None:
    """Declare ``topology`` (:func:`~consumer.topology.declare_topology`) on a connection of
    its own to ``url``, closed afterwards."""
    connection = await aio_pika.connect(url, timeout=30)
    try:
        await declare_topology(await connection.channel(), topology)
    finally:
        await connection.close()


async def delete_through(url: str, topology: Topology) -> list[str]:
    """Delete ``topology`` (:func:`~consumer.topology.delete_topology`) on a connection of its
    own to ``url``, closed afterwards; what could not be deleted, as it says."""
    connection = await aio_pika.connect(url, timeout=30)
    try:
        return await delete_topology(connection, topology)
    finally:
        await connection.close()
