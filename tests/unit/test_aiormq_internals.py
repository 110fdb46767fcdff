"""The lean ack path's hold on aiormq's internals, checked without a broker.

``bulk_recorder/infra/aiormq_internals.py`` (the one adapter) writes a batch's Basic.Ack frames
straight into aiormq's connection write queue (marshalled by aiormq's ``ChannelFrame`` with
pamqp's codec), decides whether a channel is closing from aiormq's private state, and empties
that queue after a broker cut. None of that is public API, so aiormq and pamqp are pinned exactly in
pyproject.toml. When an upgrade is tried, these tests say in plain words which internal changed,
instead of a recorder that acks nothing or hangs at the first broker cut.

The last test runs aiormq's own connection writer on a fake socket: the bytes our ack frames
become are read back with pamqp, and frames of a channel that began closing after they were
queued are dropped at write time.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import tomllib
from importlib.metadata import version
from pathlib import Path

import aiormq
import pytest
from aiormq.abc import ChannelFrame
from packaging.requirements import Requirement
from pamqp import commands as spec
from pamqp import frame as pamqp_frame

from bulk_recorder.infra.aiormq_internals import _content_frames, channel_closing, write_acks
from tests.conftest import wait_for

PINNED = f"aiormq {version('aiormq')}, pamqp {version('pamqp')}"


def _broken(internal: str, use: str) -> str:
    return (
        f"{PINNED}: aiormq internal changed: {internal}. The lean ack path relies on it ({use}); "
        "keep aiormq and pamqp pinned in pyproject.toml, or adapt "
        "bulk_recorder/infra/aiormq_internals.py to the new internals."
    )


class FakeSocket:
    """What aiormq's writer needs of an asyncio.StreamWriter."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None

    def is_closing(self) -> bool:
        return self.closing


def _connection() -> aiormq.Connection:
    connection = aiormq.Connection("amqp://guest:guest@127.0.0.1:1/")
    # What the handshake would have set: the frame size a channel splits bodies by.
    connection.connection_tune = spec.Connection.Tune(frame_max=131_072)
    return connection


def _channel(connection: aiormq.Connection, number: int = 1) -> aiormq.Channel:
    channel = aiormq.Channel(connection, number, publisher_confirms=False)
    connection.channels[number] = channel
    return channel


def _acks(data: bytes) -> list[tuple[int, int]]:
    """(channel number, delivery tag) of every frame in ``data``; only Basic.Ack allowed."""
    out: list[tuple[int, int]] = []
    offset = 0
    while offset < len(data):
        consumed, channel, frame = pamqp_frame.unmarshal(data[offset:])
        assert isinstance(frame, spec.Basic.Ack), f"unexpected frame {frame!r}"
        assert not frame.multiple, "an ack with multiple=True: the contract is one ack a delivery"
        out.append((channel, frame.delivery_tag))
        offset += consumed
    return out


async def test_the_connection_has_a_bounded_write_queue_and_a_channel_map() -> None:
    connection = _connection()
    queue = getattr(connection, "write_queue", None)
    assert isinstance(queue, asyncio.Queue), _broken(
        "Connection.write_queue is no longer an asyncio.Queue",
        "write_acks puts its frames there; unblock_writers empties it after a broker cut",
    )
    assert queue.maxsize > 0, _broken(
        "Connection.write_queue is no longer bounded",
        "unblock_writers exists because a full bounded queue never wakes its waiters",
    )
    channels = getattr(connection, "channels", None)
    assert isinstance(channels, dict), _broken(
        "Connection.channels is no longer a dict of channel number -> channel",
        "channel_closing: a number no longer mapped to its channel means the broker closed it",
    )


async def test_a_channel_keeps_its_private_close_event() -> None:
    channel = _channel(_connection())
    event = getattr(channel, "_Channel__close_event", None)
    assert isinstance(event, asyncio.Event), _broken(
        "Channel.__close_event (name-mangled _Channel__close_event) is gone or not an Event",
        "channel_closing: the flag aiormq's own basic_ack checks before writing",
    )
    assert not channel_closing(channel)
    event.set()
    assert channel_closing(channel), _broken(
        "setting Channel.__close_event no longer marks the channel as closing",
        "channel_closing",
    )


def test_channel_frame_marshalls_a_batch_of_acks_as_pamqp_frames() -> None:
    marshall = getattr(ChannelFrame, "marshall", None)
    assert callable(marshall), _broken(
        "aiormq.abc.ChannelFrame.marshall is gone", "AckFrames marshals a batch of acks with it"
    )
    frames = [spec.Basic.Ack(delivery_tag=tag) for tag in (1, 2, 70_000)]
    payload = marshall(3, frames).payload
    expected = b"".join(pamqp_frame.marshal(frame, 3) for frame in frames)
    assert payload == expected, _broken(
        "ChannelFrame.marshall(channel, frames).payload is no longer pamqp's frames end to end",
        "AckFrames.payload",
    )
    assert _acks(payload) == [(3, 1), (3, 2), (3, 70_000)]


def test_the_connection_writer_reads_what_ack_frames_provide() -> None:
    """aiormq 7's writer takes payload, should_close, should_drain and drain() from each item
    of the write queue: exactly what ``AckFrames`` implements."""
    writer = getattr(aiormq.Connection, "_Connection__writer", None)
    assert inspect.iscoroutinefunction(writer), _broken(
        "Connection.__writer (the task that writes the write queue to the socket) is gone",
        "AckFrames is shaped for it",
    )
    source = inspect.getsource(writer)
    for name in ("write_queue", ".payload", ".should_close", ".should_drain", ".drain()"):
        assert name in source, _broken(
            f"Connection.__writer no longer uses {name} of the frames it takes",
            "AckFrames provides payload, should_close, should_drain and drain()",
        )


async def test_acks_written_through_aiormqs_own_writer_reach_the_socket_unless_closing() -> None:
    connection = _connection()
    socket = FakeSocket()
    unblocked = getattr(connection, "_Connection__connection_unblocked", None)
    assert isinstance(unblocked, asyncio.Event), _broken(
        "Connection.__connection_unblocked is gone", "this test starts aiormq's writer with it"
    )
    open_channel, closing_channel = _channel(connection, 1), _channel(connection, 2)
    writer = asyncio.create_task(connection._Connection__writer(socket))  # type: ignore[attr-defined]
    try:
        # Queued while the writer is blocked; channel 2 begins closing before the write.
        assert await write_acks(open_channel, [5, 6, 7])
        assert await write_acks(closing_channel, [8])
        closing_channel._Channel__close_event.set()  # type: ignore[attr-defined]
        assert await write_acks(open_channel, [9])
        unblocked.set()
        with contextlib.suppress(AssertionError):  # the assertion below says what is wrong
            await wait_for(lambda: len(_acks(bytes(socket.data))) >= 4, timeout=5, interval=0.01)
        assert _acks(bytes(socket.data)) == [(1, 5), (1, 6), (1, 7), (1, 9)], _broken(
            "aiormq's writer no longer writes AckFrames.payload as it is when it takes the item",
            "acks reach the broker, and a closing channel's acks are dropped at write time",
        )
    finally:
        socket.closing = True
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer


@pytest.mark.parametrize("name", ["aiormq", "pamqp"])
def test_aiormq_and_pamqp_are_pinned_exactly(name: str) -> None:
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    (requirement,) = [
        Requirement(text)
        for text in project["project"]["dependencies"]
        if Requirement(text).name == name
    ]
    operators = [spec.operator for spec in requirement.specifier]
    assert operators == ["=="], (
        f"{name} must be pinned with == in pyproject.toml (the lean ack path writes into "
        f"aiormq's internals); it is {requirement}"
    )
    (pin,) = requirement.specifier
    assert pin.version == version(name), f"{name} {version(name)} installed, {requirement}"


async def test_a_channel_keeps_its_confirmation_map_and_delivery_tag_sequence() -> None:
    """write_publishes (the load generator's) registers confirms where basic_publish does."""
    channel = _channel(_connection())
    assert isinstance(getattr(channel, "confirmations", None), dict), _broken(
        "Channel.confirmations is no longer a dict of delivery tag -> future",
        "write_publishes registers each publish's confirmation there",
    )
    assert getattr(channel, "delivery_tag", None) == 0, _broken(
        "Channel.delivery_tag is no longer the publish sequence (0 on a new channel)",
        "write_publishes numbers its publishes from it",
    )
    assert isinstance(getattr(channel, "max_content_size", None), int), _broken(
        "Channel.max_content_size is gone", "write_publishes cuts bodies into frames of that size"
    )
    confirm = getattr(channel, "_confirm_delivery", None)
    assert callable(confirm), _broken(
        "Channel._confirm_delivery is gone", "it resolves the futures write_publishes registers"
    )
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    channel.confirmations[1] = future
    confirm(1, spec.Basic.Ack(delivery_tag=1))
    resolved = future.done() and isinstance(future.result(), spec.Basic.Ack)
    assert resolved, _broken(
        "Channel._confirm_delivery no longer resolves the registered future with the Ack",
        "write_publishes",
    )


async def test_write_publishes_cuts_a_body_into_the_frames_basic_publish_sends() -> None:
    """A body of a frame or more goes out in several content frames (issue 18, item 2): the
    same ones aiormq's basic_publish makes, whatever the size."""
    channel = _channel(_connection())
    size = channel.max_content_size
    assert size == 131_072 - 8  # frame_max less a content frame's header and end byte
    split = getattr(channel, "_split_body", None)
    assert callable(split), _broken(
        "Channel._split_body is gone", "write_publishes cuts bodies as it does"
    )
    for length in (0, 1, size - 1, size, size + 1, 2 * size, 3 * size + 5):
        body = bytes(n % 251 for n in range(length))
        ours = [frame.value for frame in _content_frames(body, size)]
        assert ours == [frame.value for frame in split(body)], length
        assert b"".join(ours) == body
        assert all(len(value) <= size for value in ours)
