"""The demo's HTTP client against a server that refuses an upload before reading its body.

A server that answers early (the API's 401 before the body is read) and closes with the body
unread makes the kernel send a reset after the answer instead of a clean end of stream. The
answer is complete by then (its Content-Length says so): the client must return it, not lose it
to the reset (seen under load in ``test_demo_passes_its_checks[api]``: ConnectionResetError).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading

from consumer.tools.demo_api import http_request

ANSWER = (
    b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 12\r\nConnection: close\r\n\r\nno API key\r\n"
)


def _refuse_before_the_body(server: socket.socket, served: threading.Event) -> None:
    """Read the head only, wait until the body has arrived too, answer, close with it unread."""
    conn, _ = server.accept()
    with conn:
        head = b""
        while b"\r\n\r\n" not in head:
            head = conn.recv(65536, socket.MSG_PEEK)
        head_len = head.index(b"\r\n\r\n") + 4
        conn.recv(head_len)  # the head only; the body stays in the receive queue
        while len(conn.recv(65536, socket.MSG_PEEK)) < 1:  # the body is here, unread
            pass
        conn.sendall(ANSWER)
    served.set()  # closed with unread bytes: the kernel resets the connection


async def test_an_answer_followed_by_a_reset_is_still_returned() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    served = threading.Event()
    thread = threading.Thread(target=_refuse_before_the_body, args=(server, served), daemon=True)
    thread.start()
    try:
        port = server.getsockname()[1]
        # the demo's own shape: a head, then a one-byte body in a later write
        status, headers, payload = await asyncio.wait_for(
            http_request(port, "POST", "/v1/credit-annotation-jobs", body=[b"{"]), 30
        )
    finally:
        await asyncio.to_thread(thread.join, 30)
        server.close()
    assert served.is_set()
    assert status == 401
    assert headers["content-length"] == "12"
    assert payload == b"no API key\r\n"


async def test_a_reset_before_the_whole_answer_is_still_an_error() -> None:
    """A truncated answer must not pass for a whole one."""
    server = socket.create_server(("127.0.0.1", 0))

    def half_answer() -> None:
        conn, _ = server.accept()
        with conn:
            while b"\r\n\r\n" not in conn.recv(65536, socket.MSG_PEEK):
                pass
            conn.recv(65536)
            conn.sendall(ANSWER[:-5])
            conn.setsockopt(
                socket.SOL_SOCKET,
                socket.SO_LINGER,
                struct.pack("ii", 1, 0),  # closing resets at once
            )

    thread = threading.Thread(target=half_answer, daemon=True)
    thread.start()
    try:
        port = server.getsockname()[1]
        raised: BaseException | None = None
        try:
            await asyncio.wait_for(http_request(port, "GET", "/v1/jobs/x"), 30)
        except (ConnectionResetError, ValueError) as exc:
            raised = exc
    finally:
        await asyncio.to_thread(thread.join, 30)
        server.close()
    assert raised is not None, "a truncated answer was returned as if whole"
