"""One-shot commands that cannot reach their broker or database: one line, no traceback.

``migrate``, ``publish``, ``dlq`` and ``demo`` run once and exit. When a service they need is
not there, the operator gets one line naming the service and the host (never the password) and
a non-zero exit code, as for every other bad input.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg
import pytest

from tests.conftest import (
    REPO,
    Services,
    SettingsFactory,
    free_port,
    run_cli,
    settings_env,
    unique_name,
    with_database,
)

SECRET = "s3cret-pw"


@pytest.mark.parametrize(
    ("args", "service"),
    [
        (["migrate"], "PostgreSQL"),
        (["demo", "--count", "10"], "PostgreSQL"),
        (["publish", "--count", "10"], "RabbitMQ"),
        (["dlq", "inspect"], "RabbitMQ"),
        (["dlq", "replay"], "RabbitMQ"),
        (["dlq", "replay", "--reason", "invalid JSON", "--dry-run"], "RabbitMQ"),
        (["dlq", "discard", "--reason", "invalid JSON", "--yes"], "RabbitMQ"),
        (["demo", "--count", "10"], "RabbitMQ"),
    ],
)
def test_an_unreachable_service_is_one_line_naming_it(
    make_settings: SettingsFactory, args: list[str], service: str
) -> None:
    closed = free_port()  # nothing listens there
    settings = make_settings()
    env = settings_env(settings)
    if service == "PostgreSQL":
        env["DATABASE_URL"] = f"postgresql://postgres:{SECRET}@127.0.0.1:{closed}/bulk_recorder"
    else:
        env["RABBITMQ_URL"] = f"amqp://guest:{SECRET}@127.0.0.1:{closed}/"
    done = run_cli(args, env)
    code, out, err = done.returncode, done.stdout, done.stderr
    assert code != 0, out + err
    assert "Traceback" not in out + err, out + err
    assert SECRET not in out + err, out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert service in lines[0], lines[0]
    assert f"127.0.0.1:{closed}" in lines[0], lines[0]


@pytest.fixture
async def login_without_createdb(services: Services) -> AsyncIterator[str]:
    """A LOGIN role that may not create databases (dropped afterwards)."""
    role = unique_name("brnocreate")
    admin = await asyncpg.connect(with_database(services.database_url, "postgres"))
    try:
        await admin.execute(f"CREATE ROLE {role} LOGIN NOCREATEDB")
        yield role
    finally:
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


@pytest.mark.parametrize("args", [["migrate"], ["demo", "--count", "10"]])
def test_a_server_that_refuses_after_the_reachability_check_is_one_line_too(
    make_settings: SettingsFactory, login_without_createdb: str, args: list[str]
) -> None:
    # the server answers (the check passes), then refuses to create the missing database
    settings = make_settings()
    parts = urlsplit(settings.database_url)
    host = parts.netloc.rpartition("@")[2]
    dsn = f"postgresql://{login_without_createdb}:{SECRET}@{host}{parts.path}"
    done = run_cli(args, settings_env(settings, DATABASE_URL=dsn))
    code, out, err = done.returncode, done.stdout, done.stderr
    assert code == 1, out + err
    assert "Traceback" not in out + err, out + err
    assert SECRET not in out + err, out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"bulk-recorder {args[0]}: PostgreSQL at {host}"), lines[0]
    assert "permission denied to create database" in lines[0], lines[0]


@pytest.mark.parametrize(
    ("command", "service"),
    [
        ("consume", "PostgreSQL"),
        ("relay", "RabbitMQ"),
    ],
)
async def test_a_long_running_command_keeps_retrying_and_names_the_host(
    make_settings: SettingsFactory, command: str, service: str
) -> None:
    closed = free_port()
    env = settings_env(make_settings(), PYTHONUNBUFFERED="1")
    if service == "PostgreSQL":
        env["DATABASE_URL"] = f"postgresql://postgres:{SECRET}@127.0.0.1:{closed}/bulk_recorder"
    else:
        env["RABBITMQ_URL"] = f"amqp://guest:{SECRET}@127.0.0.1:{closed}/"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "consumer.cli", command,
        cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(60):
            while True:  # the first retry line that names the host; it keeps running
                line = (await proc.stdout.readline()).decode()
                assert line, "".join(seen)
                seen.append(line)
                if "WARNING" in line and f"127.0.0.1:{closed}" in line:
                    break
        assert proc.returncode is None, "".join(seen)
        assert SECRET not in "".join(seen)
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()
