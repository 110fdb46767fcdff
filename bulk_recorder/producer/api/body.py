"""Reading a request: headers (Idempotency-Key, Content-Type) and the body, bounded in size and
time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import AsyncGenerator
from typing import Final

from fastapi import Request

from bulk_recorder.producer.api.problems import CLOSE_CONNECTION, ApiError
from bulk_recorder.records.explain import sorted_json
from settings import Settings

log = logging.getLogger(__name__)

MAX_IDEMPOTENCY_KEY_LEN: Final = 255


def checked_idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not (0 < len(value) <= MAX_IDEMPOTENCY_KEY_LEN and value.isascii() and value.isprintable()):
        raise ApiError(
            400,
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} printable ASCII characters",
        )
    return value


def media_type_of(request: Request) -> str | None:
    raw = request.headers.get("content-type")
    if raw is None:
        return None
    return raw.split(";", 1)[0].strip().lower()


def canonical_hash(body: bytes) -> bytes:
    """sha256 of the body's JSON with sorted keys: the same request however it is spaced.

    Parsed by the decoder's own parser, every number exact: 0.1 and 0.10000000000000000001 are
    stored as different jsonb, so they are different requests (as floats they hashed alike).
    A body without fractions hashes as it did before.
    """
    return hashlib.sha256(sorted_json(body)).digest()


def check_declared_length(request: Request, limit: int) -> None:
    """413 from Content-Length alone, before any of the body is read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(
            413, f"body too large ({declared} bytes > {limit})", headers=CLOSE_CONNECTION
        )


async def body_chunks(
    request: Request, limit: int, settings: Settings
) -> AsyncGenerator[bytes, None]:
    """The request body chunk by chunk, bounded: more than ``limit`` bytes is 413; nothing
    received for ``API_BODY_TIMEOUT_S``, or a body not complete ``API_UPLOAD_TIMEOUT_S`` after
    the first read, is 408. Use it under ``contextlib.aclosing``."""
    check_declared_length(request, limit)
    idle, whole = settings.api_body_timeout_s, settings.api_upload_timeout_s
    loop = asyncio.get_running_loop()
    deadline = loop.time() + whole
    stream = request.stream()
    size = 0
    try:
        while True:
            left = deadline - loop.time()
            try:
                async with asyncio.timeout(min(idle, left)):
                    chunk = await anext(stream)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if idle < left:
                    reason = f"nothing received for {idle:g} s; send the body without pauses"
                else:
                    reason = f"the body was not complete within {whole:g} s"
                log.info("request body timeout after %d bytes: %s", size, reason)
                raise ApiError(
                    408, f"request body timeout: {reason}", headers=CLOSE_CONNECTION
                ) from None
            size += len(chunk)
            if size > limit:
                raise ApiError(
                    413, f"body too large (more than {limit} bytes)", headers=CLOSE_CONNECTION
                )
            yield chunk
    finally:
        await stream.aclose()


async def read_limited(request: Request, limit: int, settings: Settings) -> bytes:
    body = bytearray()
    async with contextlib.aclosing(body_chunks(request, limit, settings)) as chunks:
        async for chunk in chunks:
            body += chunk
    return bytes(body)
