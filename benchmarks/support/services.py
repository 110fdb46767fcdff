"""Throw-away PostgreSQL databases and RabbitMQ topologies, and filling queues."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import asyncpg

from benchmarks.support.env import database_url, rabbitmq_url, unique
from bulk_recorder.infra.broker import BrokerNodes
from bulk_recorder.infra.migrate import migrate
from consumer.tools.loadgen import LoadReport, LoadSpec, publish_load
from consumer.topology import Topology, declare_topology, delete_topology


def with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def with_port(dsn: str, port: int) -> str:
    parts = urlsplit(dsn)
    netloc = parts.netloc.rsplit("@", 1)
    host = (netloc[-1].rsplit(":", 1)[0]) if ":" in netloc[-1] else netloc[-1]
    hostport = f"{host}:{port}"
    netloc_out = f"{netloc[0]}@{hostport}" if len(netloc) == 2 else hostport
    return urlunsplit((parts.scheme, netloc_out, parts.path, parts.query, parts.fragment))


async def drop_database(name: str) -> None:
    conn = await asyncpg.connect(database_url())
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def temp_database(prefix: str = "bench") -> AsyncIterator[tuple[str, str]]:
    """A fresh migrated database: yields (dsn, name); dropped on exit."""
    name = unique(prefix)
    dsn = with_database(database_url(), name)
    try:
        await migrate(dsn)
        yield dsn, name
    finally:
        with contextlib.suppress(Exception):
            await drop_database(name)


async def count_rows(dsn: str, table_name: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {table_name}"))
    finally:
        await conn.close()


# -- RabbitMQ --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def temp_topology(prefix: str = "bench", shards: int = 1) -> AsyncIterator[Topology]:
    """The recorder's exchange and quorum queue (and dead-letter pair) under unique names;
    with ``shards`` > 1, its queue shards too (the broker needs rabbitmq_random_exchange).
    ``RABBITMQ_URL`` may list a cluster's nodes, comma-separated."""
    name = unique(prefix)
    topology = Topology(exchange=name, queue=name + ".records", delivery_limit=5, shards=shards)
    connection = await BrokerNodes.from_setting(rabbitmq_url()).connect()
    try:
        channel = await connection.channel()
        await declare_topology(channel, topology)
        yield topology
    finally:
        with contextlib.suppress(Exception):
            await connection.close()
        # a fresh connection: the benchmark's may have died with whatever ended the benchmark
        cleanup = await BrokerNodes.from_setting(rabbitmq_url()).connect()
        try:
            left = await delete_topology(cleanup, topology, wait_s=300)
        finally:
            await cleanup.close()
        for what in left:
            print(f"warning: could not delete {what}", file=sys.stderr)


async def ready_count(queue: str) -> int:
    connection = await aio_pika.connect(rabbitmq_url())
    try:
        channel = await connection.channel()
        q = await channel.declare_queue(queue, passive=True)
        return int(q.declaration_result.message_count or 0)
    finally:
        await connection.close()


async def fill(
    topology: Topology,
    count: int,
    record_type: str = "transaction",
    *,
    ready: int = 0,
    traced: bool = False,
) -> LoadReport:
    """Pre-fill the queue with ``count`` valid records (loadgen, publisher confirms); wait
    until ``ready`` (default ``count``) messages are in the queue. ``traced``: each message
    carries a ``traceparent`` header of its own."""
    report = await publish_load(
        rabbitmq_url(),
        topology.exchange,
        LoadSpec(record_type=record_type, count=count, traced=traced),
    )
    await wait_visible(topology.queue, ready or count)
    return report


async def wait_visible(queue: str, count: int, timeout: float = 30) -> None:
    """Wait until ``count`` messages are ready (a quorum queue confirms before it counts)."""
    for _ in range(int(timeout / 0.1)):
        if await ready_count(queue) >= count:
            return
        await asyncio.sleep(0.1)
