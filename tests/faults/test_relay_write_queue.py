"""A relay lane never waits for ever on a broker connection that died with its writes queued
(issue 18, item 7).

aiormq's connection has a bounded write queue (10 frames) that its writer task empties into
the socket. When the socket stops taking bytes (the network holds them) and a frame whose
publisher waits for the socket to drain reaches the writer (a row published alone), the writer
waits and the queue fills; a lane that then publishes a batch waits for room, holding the
channel's lock and its rows' ``FOR UPDATE`` locks. If the connection dies then, nothing ever
makes room: the lane waited for ever, its rows locked (every other relay skips them), and the
relay still looked ready (before the bound: one lane in the queue's put, four waiting for the
channel's lock it held, ``ready()`` true). Here the proxy holds what the relay sends from the
first chunk of a 24 MB row published alone, then cuts the connection; the relay must publish
every row.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import pytest
from pamqp.header import ContentHeader

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer.outbox import notify
from bulk_recorder.producer.relay import RelayConfig
from consumer.tools.generator import Generator
from tests.conftest import Broker, Services, wait_for
from tests.faults.amqp_tap import FrameReader
from tests.faults.conftest import claims_open, via_proxy
from tests.faults.proxy import Inspect, TcpProxy
from tests.integration.producer_support import running_relay

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

LARGE = 24_000_000  # far more than the kernel's socket buffers take: the writer must wait
SMALL_ROWS = 200  # within the claim window, which starts at the large row
LANES = 16  # the other 15 queue a batch each: 10 fill the write queue, 5 wait for room


class HoldFromLargePublish(TcpProxy):
    """Forwards until the relay sends the header of a message of ``LARGE`` bytes or more; from
    that chunk on nothing the relay sends is forwarded (the sockets are no longer read) until
    :meth:`release`. Once only."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.holding = asyncio.Event()
        self._released = asyncio.Event()

    def release(self) -> None:
        self._released.set()

    def inspector(self, connection: int, to_upstream: bool) -> Inspect | None:
        if not to_upstream:
            return None
        reader = FrameReader(client_side=True)

        async def inspect(data: bytes) -> None:
            armed = not self.holding.is_set() and not self._released.is_set()
            if armed and any(
                isinstance(value, ContentHeader) and value.body_size >= LARGE
                for _, value in reader.feed(data)
            ):
                self.holding.set()
            if self.holding.is_set():
                await self._released.wait()

        return inspect


async def _enqueue(conn, rows: list[tuple[str, bytes, int]]) -> set[str]:
    async with conn.transaction():
        await conn.executemany(
            "INSERT INTO outbox (record_type, record_id, body, attempts)"
            " VALUES ('credit_annotation', $1, $2, $3)",
            rows,
        )
        await notify(conn)
    return {record_id for record_id, _, _ in rows}


async def _outbox_empty(conn) -> bool:
    return int(await conn.fetchval("SELECT count(*) FROM outbox")) == 0


async def test_a_lane_whose_connection_died_with_its_writes_queued_comes_back(
    make_settings, database_url: str, services: Services, broker: Broker, db
) -> None:
    await migrate(database_url)
    conn = await db()
    gen = Generator.create(187)
    target = urlsplit(services.rabbitmq_url)
    async with HoldFromLargePublish(target.hostname or "127.0.0.1", target.port or 5672) as proxy:
        settings = make_settings(rabbitmq_url=via_proxy(services.rabbitmq_url, proxy))
        config = RelayConfig(batch_size=4, lanes=LANES, poll_interval_s=0.2, publish_timeout_s=3)
        async with running_relay(settings, config) as relay:
            await wait_for(lambda: relay.relay.ready()[0], timeout=30)
            # A large row refused once before: one lane publishes it alone, and waits until
            # the socket has taken it; the connection's writer waits with it.
            large = gen.credit_annotation()
            body = json.dumps({**large, "pad": "p" * LARGE}).encode()
            ids = await _enqueue(conn, [(large["id"], body, 1)])
            await wait_for(proxy.holding.is_set, timeout=60)
            # Every other lane claims a batch and queues it: ten fill the write queue, the
            # others wait for room in it (or for the channel's lock, held by one that waits),
            # holding their rows. Then the connection dies.
            small = [gen.credit_annotation() for _ in range(SMALL_ROWS)]
            ids |= await _enqueue(conn, [(r["id"], json.dumps(r).encode(), 0) for r in small])
            await wait_for(lambda: _claims(conn, LANES), timeout=30)
            proxy.cut()  # the connection dies with its write queue full
            proxy.restore()
            proxy.release()
            await wait_for(lambda: _outbox_empty(conn), timeout=90)
            await wait_for(lambda: relay.relay.ready()[0], timeout=30)
            assert relay.relay.ready() == (True, "broker up, database up")
    delivered = {json.loads(m.body)["id"] for m in await broker.drain(broker.topology.queue)}
    assert delivered == ids


async def _claims(conn, n: int) -> bool:
    return await claims_open(conn) == n
