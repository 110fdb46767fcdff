"""An AMQP frame tap: a TcpProxy between the recorder and RabbitMQ that decodes the frames.

The recorder's own counters say what it meant to do; the tap records what reached the wire.
Broker -> recorder: every ``Basic.Deliver`` with its body, per connection and channel.
Recorder -> broker: every ``Basic.Ack`` (its delivery tag and ``multiple`` flag), ``Basic.Nack``
and ``Basic.Reject``, in the order they were sent. ``check_ack`` (optional) is awaited for each
chunk holding acks before the chunk is forwarded, with the bodies of the acked deliveries: the
ack frames wait at the tap while it looks, e.g. whether their rows are committed.

``ConfirmHold`` holds publisher confirms; ``CancelDrop`` loses every ``Basic.Cancel`` the broker
sends (a notice the broker once failed to send).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from pamqp import commands, constants
from pamqp import frame as amqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from tests.faults.proxy import Inspect, Rewrite, TcpProxy

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
_HEADER = struct.Struct(">BHI")  # frame type, channel, payload size

# (connection, channel, delivery tag): a tag means something only on its own channel.
TagKey = tuple[int, int, int]
CheckAck = Callable[[Sequence[bytes]], Awaitable[list[bool | None]]]


@dataclass(frozen=True, slots=True)
class Settle:
    """One settling frame the recorder sent."""

    key: TagKey
    method: str  # "ack", "nack" or "reject"
    multiple: bool
    committed: bool | None = None  # check_ack's verdict for an ack; None when not checked


class FrameReader:
    """Splits one direction of an AMQP connection into decoded frames."""

    def __init__(self, client_side: bool) -> None:
        self._buffer = bytearray()
        self._expect_protocol_header = client_side

    def feed(self, data: bytes) -> list[tuple[int, object]]:
        self._buffer += data
        out: list[tuple[int, object]] = []
        if self._expect_protocol_header:
            if len(self._buffer) < len(PROTOCOL_HEADER):
                return out
            assert bytes(self._buffer[:8]) == PROTOCOL_HEADER, bytes(self._buffer[:8])
            del self._buffer[:8]
            self._expect_protocol_header = False
        while len(self._buffer) >= _HEADER.size:
            frame_type, channel, size = _HEADER.unpack_from(self._buffer)
            end = _HEADER.size + size + 1
            if len(self._buffer) < end:
                break
            raw = bytes(self._buffer[:end])
            del self._buffer[:end]
            assert raw[-1] == constants.FRAME_END, "frame end byte missing: the stream desynced"
            if size == 0 and frame_type != constants.FRAME_HEARTBEAT:
                out.append((channel, ContentBody(b"")))  # an empty body frame
                continue
            _, _, value = amqp_frame.unmarshal(raw)
            out.append((channel, value))
        return out


@dataclass
class _Incoming:
    """A delivery being assembled from its method, header and body frames."""

    tag: int
    size: int | None = None
    delivery_count: int = 0  # its x-delivery-count header (0 when absent)
    body: bytearray = field(default_factory=bytearray)


class AmqpTap(TcpProxy):
    """A TcpProxy that records deliveries and settling frames (see the module docstring)."""

    def __init__(
        self, target_host: str, target_port: int, *, check_ack: CheckAck | None = None
    ) -> None:
        super().__init__(target_host, target_port)
        self.check_ack = check_ack
        self.delivered: dict[TagKey, bytes] = {}
        self.delivery_counts: dict[TagKey, int] = {}  # x-delivery-count of each delivery
        self.settles: list[Settle] = []
        self._incoming: dict[tuple[int, int], _Incoming] = {}

    def inspector(self, connection: int, to_upstream: bool) -> Inspect:
        reader = FrameReader(client_side=to_upstream)

        async def inspect(data: bytes) -> None:
            frames = reader.feed(data)
            if to_upstream:
                await self._sent(connection, frames)
            else:
                self._received(connection, frames)

        return inspect

    # -- what the recorder sent -------------------------------------------------------------

    async def _sent(self, connection: int, frames: list[tuple[int, object]]) -> None:
        settles: list[Settle] = []
        for channel, value in frames:
            tag: int | None
            if isinstance(value, commands.Basic.Ack):
                method, tag, multiple = "ack", value.delivery_tag, value.multiple
            elif isinstance(value, commands.Basic.Nack):
                method, tag, multiple = "nack", value.delivery_tag, value.multiple
            elif isinstance(value, commands.Basic.Reject):
                method, tag, multiple = "reject", value.delivery_tag, False
            else:
                continue
            settles.append(Settle((connection, channel, tag or 0), method, bool(multiple)))
        acks = [s for s in settles if s.method == "ack"]
        verdicts: dict[TagKey, bool | None] = {}
        if acks and self.check_ack is not None:
            bodies = [self.delivered.get(s.key, b"") for s in acks]
            verdicts = dict(zip([s.key for s in acks], await self.check_ack(bodies), strict=True))
        for s in settles:
            committed = verdicts.get(s.key) if s.method == "ack" else None
            self.settles.append(Settle(s.key, s.method, s.multiple, committed))

    # -- what the broker delivered ----------------------------------------------------------

    def _received(self, connection: int, frames: list[tuple[int, object]]) -> None:
        for channel, value in frames:
            key = (connection, channel)
            if isinstance(value, commands.Basic.Deliver):
                self._incoming[key] = _Incoming(value.delivery_tag or 0)
            elif isinstance(value, ContentHeader):
                incoming = self._incoming.get(key)
                if incoming is not None:
                    incoming.size = value.body_size
                    count = (value.properties.headers or {}).get("x-delivery-count", 0)
                    incoming.delivery_count = count if isinstance(count, int) else 0
                    self._complete(connection, channel)
            elif isinstance(value, ContentBody):
                incoming = self._incoming.get(key)
                if incoming is not None:
                    incoming.body += value.value
                    self._complete(connection, channel)

    def _complete(self, connection: int, channel: int) -> None:
        incoming = self._incoming[(connection, channel)]
        if incoming.size is not None and len(incoming.body) >= incoming.size:
            self.delivered[(connection, channel, incoming.tag)] = bytes(incoming.body)
            self.delivery_counts[(connection, channel, incoming.tag)] = incoming.delivery_count
            del self._incoming[(connection, channel)]

    # -- verdicts ---------------------------------------------------------------------------

    def acks(self) -> list[Settle]:
        return [s for s in self.settles if s.method == "ack"]

    def problems(self) -> list[str]:
        """Every way the settling frames broke the contract; empty when they kept it.

        - an ack or nack with ``multiple`` set;
        - a tag settled twice on its channel, or settled where it was never delivered;
        - an ack that left before its row was committed (when ``check_ack`` was given).
        """
        out: list[str] = []
        seen: set[TagKey] = set()
        for s in self.settles:
            if s.multiple:
                out.append(f"{s.method} with multiple=True: connection/channel/tag {s.key}")
            if s.key in seen:
                out.append(f"tag settled twice: connection/channel/tag {s.key} ({s.method})")
            seen.add(s.key)
            if s.key not in self.delivered:
                out.append(f"{s.method} for a tag never delivered there: {s.key}")
            if s.committed is False:
                out.append(f"ack sent before its row was committed: {s.key}")
        return out


class ConfirmHold(TcpProxy):
    """A proxy to RabbitMQ that can hold what the broker sends back on the connections that
    publish (their confirms), while every other connection flows.

    A connection counts as publishing from its first ``Basic.Publish``: for the recorder that is
    its publishing connection (dead letters, released copies), never its consuming one. Between
    ``hold_confirms()`` and ``let_confirms_through()`` the broker's frames on those connections
    wait at the proxy, in order (the broker has routed the copies already): confirms that come
    late, for real.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        super().__init__(target_host, target_port)
        self.publishing: set[int] = set()  # connection numbers
        self.held_chunks = 0
        self._through = asyncio.Event()
        self._through.set()

    def hold_confirms(self) -> None:
        self._through.clear()

    def let_confirms_through(self) -> None:
        self._through.set()

    async def close(self) -> None:
        self._through.set()
        await super().close()

    def inspector(self, connection: int, to_upstream: bool) -> Inspect:
        reader = FrameReader(client_side=to_upstream)

        async def sent(data: bytes) -> None:
            if connection in self.publishing:
                return
            if any(isinstance(v, commands.Basic.Publish) for _, v in reader.feed(data)):
                self.publishing.add(connection)

        async def received(data: bytes) -> None:
            if connection in self.publishing and not self._through.is_set():
                self.held_chunks += 1
                await self._through.wait()

        return sent if to_upstream else received


class CancelDrop(TcpProxy):
    """A TcpProxy that loses every ``Basic.Cancel`` the broker sends: a queue deleted under a
    consumer then looks, to the client, as if the broker never said so (RabbitMQ 3.10 did that
    to a recorder on the cluster rig: its channel still held the consumer of a quorum queue
    that was gone). ``dropped`` counts them; everything else goes through unchanged."""

    def __init__(self, target_host: str, target_port: int) -> None:
        super().__init__(target_host, target_port)
        self.dropped = 0

    def rewriter(self, connection: int, to_upstream: bool) -> Rewrite | None:
        if to_upstream:
            return None
        pending = bytearray()

        def rewrite(data: bytes) -> bytes:
            # protocol header only goes the other way: the broker's side is frames throughout
            pending.extend(data)
            out = bytearray()
            while len(pending) >= _HEADER.size:
                frame_type, _, size = _HEADER.unpack_from(pending)
                end = _HEADER.size + size + 1
                if len(pending) < end:
                    break
                raw = bytes(pending[:end])
                del pending[:end]
                if frame_type == constants.FRAME_METHOD and raw[7:11] == _BASIC_CANCEL:
                    self.dropped += 1
                    continue
                out += raw
            return bytes(out)

        return rewrite


# A method frame's payload starts with its class and method ids: basic (60), cancel (30).
_BASIC_CANCEL = struct.pack(">HH", 60, 30)
