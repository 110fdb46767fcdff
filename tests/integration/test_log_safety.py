"""Nothing a client, a publisher or a setting holds leaks into what the real processes print: a
password in any form the clients accept is masked, a hostile trace header is bounded before it
is parsed, and a control character from outside cannot start a line of its own in the log."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from consumer.tools.generator import Generator
from tests.conftest import REPO, Broker, free_port, run_cli, settings_env, wait_for
from tests.integration.producer_support import provision_key, running_api
from tests.otlp_receiver import OtlpReceiver

SECRET = "s3cr3t"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app@db/x?password=s3cr3t&connect_timeout=0",  # a settings error (exit 2)
        "postgresql://app@127.0.0.1:1/x?password=s3cr3t",  # nothing listens: one line (exit 1)
        "postgresql://app:p@s3cr3t@127.0.0.1:1/x",
        "postgresql://app@db/x?password=it's s3cr3t&connect_timeout=0",
    ],
)
def test_migrate_never_prints_a_password_from_database_url_file(tmp_path: Path, url: str) -> None:
    (tmp_path / "db").write_text(url + "\n")
    done = run_cli(
        ["migrate"], env={"PATH": "/usr/bin:/bin", "DATABASE_URL_FILE": str(tmp_path / "db")}
    )
    assert done.returncode in (1, 2), done
    assert done.stderr.strip(), done
    assert "Traceback" not in done.stderr
    assert SECRET not in done.stdout + done.stderr, done.stderr


# The installed command, the tree under test first on its path (a mutant's scratch copy).
BULK_RECORDER = Path(sys.executable).with_name("bulk-recorder")


@pytest.mark.parametrize(
    ("name", "command", "value"),
    [
        ("DATABASE_URL_FILE", "migrate", "postgresql://app:it's-s3cr3t@db/x?connect_timeout=0"),
        ("DATABASE_URL_FILE", "migrate", """postgresql://app:'"s3cr3t @db/x?connect_timeout=0"""),
        ("DATABASE_URL", "migrate", "postgresql://app:two s3cr3t@db/x?connect_timeout=0"),
        ("DATABASE_URL", "migrate", "postgresql://app:tab\ts3cr3t@db/x?connect_timeout=0"),
        ("DATABASE_URL", "migrate", "postgresql://app:a@s3cr3t@db/x?connect_timeout=0"),
        ("DATABASE_URL", "migrate", "postgresql://app:a%40s3cr3t@db/x?connect_timeout=0"),
        ("DATABASE_URL", "migrate", "postgresql://app:a/s3cr3t@db/x?connect_timeout=0"),
        ("RABBITMQ_URL", "dlq inspect", "amqp://app:a#s3cr3t@h1:0/"),
        ("RABBITMQ_URL", "dlq inspect", "amqp://app:a?s3cr3t@h1/,amqp://app:a?#s3cr3t@h2/"),
        ("DATABASE_URL", "migrate", "postgresql://app@db/x?connect_timeout=0&Password=s 3cr3t"),
        (
            "RABBITMQ_URL_FILE",
            "dlq inspect",
            """amqp://app:pw"s3cr3t@h1/,amqp://app:pw"s3cr3t@h2:0/""",
        ),
        ("RABBITMQ_URL", "dlq inspect", "amqp://app:a s3cr3t@h1/,amqp://app:it's s3cr3t@h2:0/"),
        ("RABBITMQ_URL", "dlq inspect", """amqp://app:'"\ts3cr3t@h1/,amqp://app:x@s3cr3t@h2:0/"""),
    ],
)
def test_a_password_holding_quotes_spaces_or_at_never_leaves_the_cli(
    tmp_path: Path, name: str, command: str, value: str
) -> None:
    """The real ``bulk-recorder``, given a URL whose password holds a quote, a space, a tab, an
    ``@``, a ``/``, a ``#`` or a ``?`` (in a variable, in a ``*_FILE``, in a node list): one
    line naming the variable, the settings' exit code, and no part of the password."""
    assert BULK_RECORDER.exists(), f"{BULK_RECORDER}: run `make install`"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}
    if name.endswith("_FILE"):
        (tmp_path / "secret").write_text(value + "\n")
        env[name] = str(tmp_path / "secret")
    else:
        env[name] = value
    done = subprocess.run(
        [str(BULK_RECORDER), *command.split()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done
    assert f"invalid settings: {name}:" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for part in ("s3cr3t", "3cr3t", "s 3cr"):
        assert part not in done.stdout + done.stderr, done.stderr


def _installed(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    assert BULK_RECORDER.exists(), f"{BULK_RECORDER}: run `make install`"
    return subprocess.run(
        [str(BULK_RECORDER), *args],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _assert_no_piece(text: str, password: str) -> None:
    """Not the password, nor any piece of four of its characters."""
    shown = sorted(
        {password[i : i + 4] for i in range(len(password) - 3)}
        & {text[i : i + 4] for i in range(len(text) - 3)}
    )
    assert not shown, f"{shown} of {password!r} in: {text}"


@pytest.mark.parametrize(
    ("name", "command", "value", "password", "code"),
    [
        # no scheme: masking cannot tell a password from a host, so nothing of it is echoed
        ("RABBITMQ_URL", "dlq inspect", "app:Xq7pZk9wLm2v@h1/", "Xq7pZk9wLm2v", 2),
        ("RABBITMQ_URL", "api", "amqp//app:Xq7pZk9wLm2v@h1/", "Xq7pZk9wLm2v", 2),
        ("RABBITMQ_URL_FILE", "consume", "amqp://h0/,app:Xq7pZk9wLm2v", "Xq7pZk9wLm2v", 2),
        ("DATABASE_URL", "migrate", "app:Xq7pZk9wLm2v", "Xq7pZk9wLm2v", 2),
        ("DATABASE_URL_FILE", "relay", "postgresql//app:Xq7pZk9wLm2v@db/x", "Xq7pZk9wLm2v", 2),
        # a / ? # ends the host part: the parsers quoted the piece before it as a port
        ("RABBITMQ_URL", "dlq inspect", "amqp://app:Xq7p?Zk9w@h1/", "Xq7p?Zk9w", 2),
        ("RABBITMQ_URL", "consume", "amqp://h0/,amqp://app:Xq7p/Zk9w@h1/", "Xq7p/Zk9w", 2),
        ("RABBITMQ_URL_FILE", "relay", "amqp://app:Xq7p#Zk9w@h1/", "Xq7p#Zk9w", 2),
        ("RABBITMQ_URL", "api", "amqp://app:7319?Zk9wLm@h1/", "7319?Zk9wLm", 2),
        ("DATABASE_URL", "migrate", "postgresql://app:Xq7p/Zk9w@db/x", "Xq7p/Zk9w", 2),
        ("DATABASE_URL", "migrate", "postgresql://app:Xq7p#Zk9w@db/x", "Xq7p#Zk9w", 2),
        ("DATABASE_URL_FILE", "migrate", "postgresql://app:7319?Zk9wLm@db/x", "7319?Zk9wLm", 2),
        ("DATABASE_URL", "api", "postgresql://app:7319/Zk9wLm@db/x", "7319/Zk9wLm", 2),
        ("DATABASE_URL", "migrate", "postgresql://app:Zk@9w:Xq7p@127.0.0.1:1/x", "Zk@9w:Xq7p", 2),
        # a : is the drivers' too: the URL is read, and the service is not there (exit 1)
        ("DATABASE_URL", "migrate", "postgresql://app:Xq7p:Zk9w@127.0.0.1:1/x", "Xq7p:Zk9w", 1),
        ("RABBITMQ_URL", "dlq inspect", "amqp://app:Xq7p:Zk9w@127.0.0.1:1/", "Xq7p:Zk9w", 1),
    ],
)
def test_no_piece_of_a_password_leaves_through_a_parsers_error(
    tmp_path: Path, name: str, command: str, value: str, password: str, code: int
) -> None:
    """The installed ``bulk-recorder``, given a URL setting with no scheme or whose password
    holds ``/``, ``?``, ``#`` or ``:``: the documented exit code, one line (naming the variable
    for a bad setting), and no piece of four characters of the password on stdout or stderr."""
    if name.endswith("_FILE"):
        (tmp_path / "secret").write_text(value + "\n")
        done = _installed(command.split(), {name: str(tmp_path / "secret")}, tmp_path)
    else:
        done = _installed(command.split(), {name: value}, tmp_path)
    assert done.returncode == code, done
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    if code == 2:
        assert f"invalid settings: {name}:" in done.stderr, done.stderr
    _assert_no_piece(done.stdout + done.stderr, password)


@pytest.mark.parametrize(
    ("url", "password"),
    [
        ("http://app:Xq7p/Zk9w@127.0.0.1:1/metrics", "Xq7p/Zk9w"),
        ("http://app:Xq7p?Zk9w@127.0.0.1:1/metrics", "Xq7p?Zk9w"),
        ("http://app:Xq7p#Zk9w@127.0.0.1:1/metrics", "Xq7p#Zk9w"),
        ("http://app:7319/Zk9wLm@127.0.0.1:1/metrics", "7319/Zk9wLm"),  # host `app`, else
        ("app/x:Xq7pZk9wLm2v@127.0.0.1:1/metrics", "Xq7pZk9wLm2v"),  # no scheme: not shown
    ],
)
@pytest.mark.parametrize("source", ["metrics", "prometheus"])
def test_tune_never_quotes_a_url_it_cannot_read(
    tmp_path: Path, source: str, url: str, password: str
) -> None:
    """``tune``'s URLs are no settings: one line in our words, exit 1, no piece of the
    password."""
    done = _installed(
        ["tune", url] if source == "metrics" else ["tune", "--prometheus", url], {}, tmp_path
    )
    assert done.returncode == 1, done
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "must be percent-encoded" in done.stderr, done.stderr
    _assert_no_piece(done.stdout + done.stderr, password)


# -- hostile trace headers and forged lines, against real processes ----------------------------

FORGED = "FORGED LINE: the ledger is corrupt"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
HOSTILE_STATE = "k=" + "v" * 60_000  # one 60 KB member, refused whole


async def test_hostile_trace_headers_and_paths_neither_forge_nor_grow_the_api_log(
    make_settings, db, tmp_path: Path, receiver: OtlpReceiver
) -> None:
    """Ten unauthenticated requests (401) with a 60 KB ``tracestate``, ten with a line break
    in it (NEL, which HTTP lets through as a Latin-1 byte), five to paths holding a line break
    (percent-encoded) and five to a 60 KB path: the API's log grows by a short line a request,
    and no line starts with the forged text. OpenTelemetry logs each member it refuses, whole,
    at WARNING; the header is read before authentication."""
    port = free_port()
    settings = make_settings(api_port=port, otel_exporter_otlp_endpoint=receiver.endpoint)
    await provision_key(settings.database_url)
    log_path = tmp_path / "api.log"
    async with (
        running_api(settings, log_path),
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client,
    ):
        before = log_path.stat().st_size
        states = [HOSTILE_STATE] * 10 + [f"a=b,\x85{FORGED}"] * 10
        for state in states:
            response = await client.post(
                "/v1/transactions",
                json={},
                headers={
                    b"traceparent": TRACEPARENT.encode(),
                    b"tracestate": state.encode("latin-1"),
                },
            )
            assert response.status_code == 401, response.text
        # the path is logged with each refusal: percent-decoded, a line break; and 60 KB long
        jobs = "/v1/credit-annotation-jobs/"
        # (urlsplit drops CR and LF from a URL, not the other breaks: U+2028, NEL, VT, FS)
        breaks = ["%E2%80%A8", "%C2%85", "%0B", "%1C", "%0D%0A"]
        paths = [jobs + "x" + brk + FORGED.replace(" ", "%20") for brk in breaks]
        paths += [jobs + "x" * 60_000] * 5
        for path in paths:  # as sent, byte for byte
            assert await _raw_get(port, path) == 401
        grown = log_path.stat().st_size - before
    text = log_path.read_text()
    # each refusal is one short line of the API's own (auth's "API request refused"), whatever
    # the header or the path: 1 KB a request at most, where a 60 KB member once wrote 60 KB
    assert grown <= 1_000 * len(states + paths), text[-3_000:]
    assert max(len(line) for line in text.splitlines()) < 1_000
    assert not [line for line in text.splitlines() if line.startswith("FORGED")], text[-3_000:]


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_a_publishers_line_breaks_never_start_a_line_of_the_recorders_log(
    make_settings, broker: Broker, db, tmp_path: Path, receiver: OtlpReceiver, log_format: str
) -> None:
    """A ``type`` property holding a line break (logged with the dead-letter reason) and a
    ``tracestate`` header holding one (refused by OpenTelemetry member by member), consumed by
    a real recorder that traces: no line of its log starts with the forged text, whichever the
    line breaks (CR, LF, U+2028, NEL); in JSON every line is one object."""
    port = free_port()
    settings = make_settings(
        metrics_port=port, log_format=log_format, otel_exporter_otlp_endpoint=receiver.endpoint
    )
    log_path = tmp_path / "recorder.log"
    transaction = Generator.create(27).transaction()
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(  # noqa: ASYNC220 - a long-lived child, stopped below
            [sys.executable, "-m", "consumer.cli", "consume"],
            env=settings_env(settings),
            stdout=log_file,
            stderr=log_file,
        )
        try:
            await wait_for(lambda: _ready(port), timeout=30)
            for brk in ("\n", "\r", "\u2028", "\x85"):
                await broker.publish(b"{}", f"transaction{brk}{FORGED}", routing_key="transaction")
            await broker.publish(
                json.dumps(transaction).encode(),
                "transaction",
                headers={"traceparent": TRACEPARENT, "tracestate": f"a=b,\n{FORGED}=x\r\n{FORGED}"},
            )
            dlq = broker.topology.dead_letter_queue

            async def done() -> bool:
                conn = await db()
                try:
                    rows = await conn.fetchval(
                        "SELECT count(*) FROM transactions WHERE id = $1", transaction["id"]
                    )
                finally:
                    await conn.close()
                return rows == 1 and await broker.ready_count(dlq) == 4

            await wait_for(done, timeout=60)
        finally:
            proc.send_signal(signal.SIGTERM)
            await asyncio.to_thread(proc.wait, 30)
    text = log_path.read_text()
    assert FORGED in text  # the values were logged, escaped
    forged = [line for line in text.splitlines() if line.lstrip().startswith("FORGED")]
    assert forged == [], text
    if log_format == "json":
        for line in text.splitlines():
            json.loads(line)


async def _raw_get(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: api\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        status_line = await reader.readline()
        await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    return int(status_line.split()[1])


async def _ready(port: int) -> bool:
    try:
        async with httpx.AsyncClient(timeout=2) as client:
            return (await client.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
    except httpx.TransportError:
        return False
