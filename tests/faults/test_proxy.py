"""The fault proxy itself: it forwards, cuts, holds without losing, and lets traffic through."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.faults.proxy import TcpProxy


@pytest.fixture
async def echo() -> AsyncIterator[int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    yield int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()


async def _roundtrip(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(payload)
        await writer.drain()
        return await asyncio.wait_for(reader.readexactly(len(payload)), 10)
    finally:
        writer.close()


async def test_forwards_both_ways(echo: int) -> None:
    async with TcpProxy("127.0.0.1", echo) as proxy:
        assert await _roundtrip(proxy.port, b"hello") == b"hello"
        assert proxy.faults == 0


async def test_cut_resets_open_connections_and_refuses_new_ones_until_restored(echo: int) -> None:
    async with TcpProxy("127.0.0.1", echo) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"a")
        assert await reader.readexactly(1) == b"a"
        proxy.cut()
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed under our feet
        writer.close()
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            await _roundtrip(proxy.port, b"b")
        proxy.restore()
        assert await _roundtrip(proxy.port, b"c") == b"c"
        assert proxy.faults == 1


async def test_blackhole_holds_bytes_and_delivers_them_after_restore(echo: int) -> None:
    async with TcpProxy("127.0.0.1", echo) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        proxy.blackhole()
        writer.write(b"held")
        await writer.drain()
        late = await asyncio.wait({asyncio.ensure_future(reader.readexactly(4))}, timeout=0.3)
        pending = late[1].pop()
        assert not pending.done()  # nothing came through while held
        held_new = asyncio.ensure_future(_roundtrip(proxy.port, b"new"))  # accepted, held too
        proxy.restore()
        assert await asyncio.wait_for(pending, 10) == b"held"  # late, not lost
        assert await held_new == b"new"
        writer.close()
        assert proxy.faults == 1
