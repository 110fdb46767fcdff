"""``bulk-recorder demo --via api``: the 300,000-annotation run through the producer side.

API (accepts the job at once: job + outbox rows in one DB transaction) -> relay (publishes with
confirms) -> queue -> recorder -> PostgreSQL. The demo starts the three processes, uploads the
run as NDJSON (with a few invalid lines, which the API rejects with their line numbers),
retries the upload with the same Idempotency-Key as a client would after a gateway timeout
(it must get the same job back), follows the job's progress, stops everything with SIGTERM and
checks the result against the database. With ``API_AUTH=on`` (the default) the demo makes an
API key for itself (client ``demo-...``), checks that an upload without it is refused (401), and
revokes the key at the end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from bulk_recorder.infra import pg_hosts
from bulk_recorder.infra.ids import uuid7
from bulk_recorder.infra.migrate import migrate
from bulk_recorder.producer.key_store import create_key, revoke_keys
from consumer.tools.demo_support import ProgressLine, free_port, http_get
from consumer.tools.generator import Generator
from settings import Settings

log = logging.getLogger(__name__)

INVALID_EVERY = 500  # one invalid line in 500 (0.2%)


async def http_request(
    port: int,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    body: Sequence[bytes] = (),
    read_timeout_s: float = 600,
) -> tuple[int, dict[str, str], bytes]:
    """A minimal HTTP/1.1 client: one request on its own connection, body sent in chunks.

    A server that answers before reading the whole body (the API's 401) closes with bytes
    unread, and the kernel then resets the connection after the answer instead of ending it:
    an answer complete by its framing is returned, a reset before that is raised.
    """
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    raw = bytearray()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        length = sum(len(chunk) for chunk in body)
        head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body:
            head.append(f"Content-Length: {length}")
        try:
            await loop.sock_sendall(sock, ("\r\n".join(head) + "\r\n\r\n").encode())
            for chunk in body:
                await loop.sock_sendall(sock, chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused early: the answer, if whole, is already on its way
        async with asyncio.timeout(read_timeout_s):
            while True:
                try:
                    block = await loop.sock_recv(sock, 65536)
                except ConnectionResetError:
                    if _whole_answer(bytes(raw)):
                        break
                    raise
                if not block:
                    break
                raw += block
    finally:
        sock.close()
    head_raw, _, payload = bytes(raw).partition(b"\r\n\r\n")
    status, response_headers = _parse_head(head_raw)
    if response_headers.get("transfer-encoding") == "chunked":
        payload = _dechunk(payload)
    return status, response_headers, payload


def _parse_head(head_raw: bytes) -> tuple[int, dict[str, str]]:
    lines = head_raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    response_headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        response_headers[name.strip().lower()] = value.strip()
    return status, response_headers


def _whole_answer(raw: bytes) -> bool:
    """Whether ``raw`` holds a whole answer by its own framing (Content-Length or chunked)."""
    head_raw, sep, payload = raw.partition(b"\r\n\r\n")
    if not sep:
        return False
    _, response_headers = _parse_head(head_raw)
    if response_headers.get("transfer-encoding") == "chunked":
        return payload.endswith(b"0\r\n\r\n")
    length = response_headers.get("content-length")
    return length is not None and len(payload) >= int(length)


def _dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return bytes(out)


def build_job(gen: Generator, count: int) -> tuple[list[bytes], set[str], int]:
    """NDJSON chunks with ``count`` valid lines plus invalid ones; (chunks, valid ids, invalid)."""
    chunks: list[bytes] = []
    lines: list[bytes] = []
    ids: set[str] = set()
    invalid = 0
    for i in range(count):
        record = gen.credit_annotation()
        ids.add(record["id"])
        lines.append(json.dumps(record, separators=(",", ":")).encode())
        if (i + 1) % INVALID_EVERY == 0:
            bad = gen.credit_annotation()
            bad["document"] = "529.982.247-26" if invalid % 2 else "12.345"
            lines.append(json.dumps(bad, separators=(",", ":")).encode())
            invalid += 1
        if len(lines) >= 5000:
            chunks.append(b"\n".join(lines) + b"\n")
            lines = []
    if lines:
        chunks.append(b"\n".join(lines) + b"\n")
    return chunks, ids, invalid


async def _start(
    stack: AsyncExitStack, name: str, argv: list[str], env: dict[str, str], log_dir: Path
) -> asyncio.subprocess.Process:
    log_file = stack.enter_context((log_dir / f"{name}.log").open("wb"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "consumer.cli", *argv, env=env, stdout=log_file, stderr=log_file
    )

    async def stop() -> None:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

    stack.push_async_callback(stop)
    return proc


async def _wait_ready(port: int, proc: asyncio.subprocess.Process, what: str) -> None:
    deadline = time.monotonic() + 60
    while (await http_get(port, "/readyz"))[0] != 200:
        if proc.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the {what} did not become ready")
        await asyncio.sleep(0.2)


async def run_demo_via_api(settings: Settings, *, count: int) -> int:
    print(f"bulk-recorder demo --via api: a job of {count:,} credit annotations")
    applied = await migrate(settings.database_url)
    print(f"schema ready ({', '.join(applied) or 'up to date'})")
    log_dir = Path(tempfile.mkdtemp(prefix="bulk-recorder-demo-"))
    print(f"process logs: {log_dir}")
    recorder_port, relay_port, api_port = free_port(), free_port(), free_port()
    base = {**os.environ, "METRICS_HOST": "127.0.0.1", "API_HOST": "127.0.0.1"}
    async with AsyncExitStack() as stack:
        procs = {
            "recorder": await _start(
                stack,
                "recorder",
                ["consume"],
                {**base, "METRICS_PORT": str(recorder_port)},
                log_dir,
            ),
            "relay": await _start(
                stack, "relay", ["relay"], {**base, "METRICS_PORT": str(relay_port)}, log_dir
            ),
            "api": await _start(
                stack,
                "api",
                ["api"],
                {**base, "METRICS_PORT": "0", "API_PORT": str(api_port)},
                log_dir,
            ),
        }
        try:
            await _wait_ready(recorder_port, procs["recorder"], "recorder")
            await _wait_ready(relay_port, procs["relay"], "relay")
            await _wait_ready(api_port, procs["api"], "API")
        except RuntimeError as exc:
            print(f"{exc}; see {log_dir}", file=sys.stderr)
            return 1
        print(f"API on http://127.0.0.1:{api_port}, relay and recorder ready")
        auth = await _demo_key(settings)
        try:
            return await _run_job(settings, procs, api_port, count, auth)
        finally:
            if auth:
                await _revoke_demo_key(settings, auth["client"])


async def _demo_key(settings: Settings) -> dict[str, str]:
    """A key of its own for the demo (jobs:write, jobs:read), or none with API_AUTH=off."""
    if settings.api_auth == "off":
        print("API_AUTH=off: the API takes requests without a key")
        return {}
    client = f"demo-{uuid.uuid4().hex[:12]}"
    conn = await pg_hosts.connect(settings.database_url)
    try:
        stored, key = await create_key(conn, client, ("jobs:write", "jobs:read"))
    finally:
        await conn.close()
    print(f"API key for client {client!r} ({stored.prefix}..., {' '.join(stored.scopes)})")
    return {"client": client, "Authorization": f"Bearer {key}"}


async def _revoke_demo_key(settings: Settings, client: str) -> None:
    conn = await pg_hosts.connect(settings.database_url)
    try:
        await revoke_keys(conn, client)
    finally:
        await conn.close()
    print(f"API key of {client!r} revoked")


async def _retry_same_key(
    api_port: int, headers: dict[str, str], chunks: Sequence[bytes], job: dict[str, Any]
) -> bool:
    """Upload the job again with the same Idempotency-Key: True if the answer is the same job."""
    status2, headers2, payload2 = await http_request(
        api_port, "POST", "/v1/credit-annotation-jobs", headers=headers, body=chunks
    )
    replay = json.loads(payload2) if status2 == 202 else {}
    same_job = bool(replay.get("id") == job["id"])
    print(
        f"retry with the same Idempotency-Key: {status2}, "
        f"{'the same job' if same_job else 'A DIFFERENT JOB'} "
        f"(Idempotent-Replayed: {headers2.get('idempotent-replayed', 'absent')})"
    )
    return same_job


async def _watch_job(
    api_port: int, headers: dict[str, str], job: dict[str, Any], started: float
) -> dict[str, Any] | None:
    """Poll the job's status with a progress line until it completes; None if it stalls."""
    line = ProgressLine()
    progress: dict[str, Any] = {}
    stall_since, last = time.monotonic(), -1
    while True:
        code, _, body = await http_request(
            api_port, "GET", f"/v1/credit-annotation-jobs/{job['id']}", headers=headers
        )
        if code == 200:
            progress = json.loads(body)
        elapsed = time.perf_counter() - started
        oldest = progress.get("oldest_unsent_age_s")
        line.draw(
            f"job {progress.get('status', '?'):>10}  published {progress.get('published', 0):>9,}"
            f"  unsent {progress.get('unsent', 0):>9,}"
            f" (oldest {'-' if oldest is None else f'{oldest:.0f} s'})"
            f"  recorded {progress.get('recorded', 0):>9,}/{job['accepted']:,}  {elapsed:6.1f} s"
        )
        if progress.get("status") == "completed":
            break
        recorded = int(progress.get("recorded", 0))
        if recorded != last:
            last, stall_since = recorded, time.monotonic()
        elif time.monotonic() - stall_since > 120:
            line.done()
            print("no progress for 120 s: giving up", file=sys.stderr)
            return None
        await asyncio.sleep(0.5)
    elapsed = time.perf_counter() - started
    line.draw(f"job completed: {progress['recorded']:,} recorded in {elapsed:.1f} s", force=True)
    line.done()
    return progress


async def _refused_without_key(
    api_port: int, headers: dict[str, str], chunks: Sequence[bytes], auth: dict[str, str]
) -> bool:
    """With a demo key: an upload without it must be refused (401); then ``headers`` carry it."""
    if not auth:
        return True
    no_key, _, _ = await http_request(
        api_port, "POST", "/v1/credit-annotation-jobs", headers=headers, body=[chunks[0][:1]]
    )
    print(f"upload without an API key: {no_key}")
    headers["Authorization"] = auth["Authorization"]
    return no_key == 401


async def _job_rows(settings: Settings, job_id: str) -> set[str]:
    """The ids of the job's recorded credit_annotations rows."""
    conn = await pg_hosts.connect(settings.database_url)
    try:
        return {
            str(r[0])
            for r in await conn.fetch("SELECT id FROM credit_annotations WHERE job_id = $1", job_id)
        }
    finally:
        await conn.close()


async def _run_job(
    settings: Settings,
    procs: dict[str, asyncio.subprocess.Process],
    api_port: int,
    count: int,
    auth: dict[str, str],
) -> int:
    gen = Generator.create()
    chunks, ids, invalid = build_job(gen, count)
    size_mb = sum(len(c) for c in chunks) / 1_048_576
    key = f"demo-{uuid7()}"
    headers = {"Content-Type": "application/x-ndjson", "Idempotency-Key": key}
    refused_without_key = await _refused_without_key(api_port, headers, chunks, auth)
    started = time.perf_counter()
    status, _, payload = await http_request(
        api_port, "POST", "/v1/credit-annotation-jobs", headers=headers, body=chunks
    )
    accept_s = time.perf_counter() - started
    if status != 202:
        print(f"the API refused the job: {status} {payload[:500]!r}", file=sys.stderr)
        return 1
    job: dict[str, Any] = json.loads(payload)
    print(
        f"job {job['id']} accepted in {accept_s:.1f} s ({size_mb:.0f} MiB NDJSON): "
        f"{job['accepted']:,} lines accepted, {job['rejected']:,} rejected"
    )
    for rejection in job["rejections"][:3]:
        print(f"  rejected: {rejection}")
    same_job = await _retry_same_key(api_port, headers, chunks, job)
    progress = await _watch_job(api_port, headers, job, started)
    if progress is None:
        return 1
    elapsed = time.perf_counter() - started
    exit_codes = {}
    for name in ("api", "relay", "recorder"):
        procs[name].send_signal(signal.SIGTERM)
        exit_codes[name] = await asyncio.wait_for(procs[name].wait(), 60)
    recorded_ids = await _job_rows(settings, job["id"])
    checks = {
        "every valid line recorded once, none extra": recorded_ids == ids,
        "every invalid line rejected with its line number": job["rejected"] == invalid,
        "a retried upload returns the same job": same_job,
        "an upload without an API key is refused (401)": refused_without_key,
        "API, relay and recorder stopped cleanly on SIGTERM": all(
            c == 0 for c in exit_codes.values()
        ),
    }
    print()
    print("== bulk-recorder demo (via api) summary ==")
    print(f"accepted         {job['accepted']:,} lines in {accept_s:.1f} s (202, job {job['id']})")
    print(f"rejected         {job['rejected']:,} lines, with line numbers and reasons")
    print(f"recorded         {len(recorded_ids):,} credit_annotations rows for the job")
    print(
        f"elapsed          {elapsed:.1f} s from upload to last row, "
        f"{len(recorded_ids) / elapsed:,.0f} records/s"
    )
    for name, ok in checks.items():
        print(f"check            {'OK  ' if ok else 'FAIL'} {name}")
    return 0 if all(checks.values()) else 1
