"""The command line by a person's habits, against the real services: no question without a
terminal (``--yes`` is said instead, nothing read, nothing done), a warning naming the closest
real setting for a misspelt variable, and the API's lifecycle lines under a logger of ours."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aio_pika
import pytest

from tests.conftest import (
    REPO,
    Broker,
    free_port,
    run_cli,
    run_cli_on_terminal,
    settings_env,
)
from tests.integration.dlq_support import dlq_contents
from tests.integration.producer_support import running_api

pytestmark = [pytest.mark.postgres]

# A pipe with a yes in it, and no standard input at all: neither is a terminal.
NOT_TERMINALS = {"pipe": "y\n", "devnull": None}


def _without_terminal(
    args: list[str], env: dict[str, str], how: str
) -> subprocess.CompletedProcess[str]:
    answer = NOT_TERMINALS[how]
    return subprocess.run(
        [sys.executable, "-m", "consumer.cli", *args],
        cwd=REPO,
        env=env,
        input=answer,
        stdin=subprocess.DEVNULL if answer is None else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("how", sorted(NOT_TERMINALS))
def test_a_revoke_that_would_ask_fails_without_a_terminal_saying_pass_yes(
    make_settings, how: str
) -> None:
    env = settings_env(make_settings())
    for _ in range(2):
        assert run_cli(["api-key", "create", "shop"], env).returncode == 0
    refused = _without_terminal(["api-key", "revoke", "shop"], env, how)
    assert refused.returncode == 2, refused
    assert "pass --yes" in refused.stderr
    assert "revoked" not in refused.stdout
    live = json.loads(run_cli(["api-key", "list", "--json"], env).stdout)
    assert [k["revoked_at"] for k in live] == [None, None]
    asked = run_cli_on_terminal(["api-key", "revoke", "shop"], env, typed="y\n")
    assert asked.returncode == 0, asked
    assert "revoke all 2 live keys of client 'shop'?" in asked.stdout
    assert asked.stdout.count("revoked ") == 2


@pytest.mark.rabbitmq
@pytest.mark.parametrize("how", sorted(NOT_TERMINALS))
async def test_a_discard_fails_without_a_terminal_saying_pass_yes(
    make_settings, broker: Broker, how: str
) -> None:
    settings = make_settings()
    exchange = await broker.channel.get_exchange(broker.topology.dead_letter_exchange)
    for n in range(2):
        await exchange.publish(
            aio_pika.Message(b"%d" % n, headers={"x-bulk-recorder-error": "invalid JSON"}), "x"
        )
    env = settings_env(settings)
    args = ["dlq", "discard", "--reason", "invalid JSON"]
    refused = _without_terminal(args, env, how)
    assert refused.returncode == 2, refused
    assert "pass --yes" in refused.stderr
    assert "discarded" not in refused.stdout
    assert [c[0] for c in await dlq_contents(broker, settings.dead_letter_queue)] == [b"0", b"1"]
    asked = run_cli_on_terminal(args, env, typed="y\n")
    assert asked.returncode == 0, asked
    assert "discard these 2 messages for good?" in asked.stdout
    assert await dlq_contents(broker, settings.dead_letter_queue) == []


@pytest.mark.parametrize(
    ("variable", "value", "meant"),
    [
        ("BULK_RECORDER_SIZ", "5", "BULK_RECORDER_SIZE"),
        ("RABBITMQ_NUMBER_OF_WORKERS", "0", "RABBITMQ_NUMBERS_OF_WORKERS"),
        ("bulk_recorder_siz", "5", "BULK_RECORDER_SIZE"),  # names are read in any case
        ("DATABASE_URL_FIEL", "/run/secrets/db", "DATABASE_URL_FILE"),
        ("OTEL_SERVICE_NAM", "x", "OTEL_SERVICE_NAME"),
        ("API_PORTT", "1", "API_PORT"),
    ],
)
def test_a_misspelt_setting_is_named_at_start_up_with_the_closest_real_name(
    make_settings, variable: str, value: str, meant: str
) -> None:
    env = settings_env(make_settings(), **{variable: value})
    done = run_cli(["migrate"], env)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "unknown setting" in line]
    assert len(lines) == 1, done.stderr
    assert f"WARNING settings: unknown setting {variable} (did you mean {meant}?)" in " ".join(
        lines[0].split()
    )


def test_a_correct_environment_gives_no_unknown_setting_line(make_settings) -> None:
    env = settings_env(
        make_settings(),
        bulk_recorder_size="5",  # a real name, in lower case
        BULK_RECORDER_COMPILE="0",  # the install's, not a setting
        BULK_RECORDER_REVISION="abc",  # the build's
        OTEL_BSP_SCHEDULE_DELAY="1000",  # read by the OpenTelemetry SDK
        OTEL_EXPORTER_OTLP_HEADERS="a=b",
    )
    done = run_cli(["migrate"], env)
    assert done.returncode == 0, done.stderr
    assert "unknown setting" not in done.stderr


LIFECYCLE = (
    "Started server process",
    "Waiting for application startup",
    "Application startup complete",
    "Shutting down",
    "Waiting for application shutdown",
    "Application shutdown complete",
    "Finished server process",
)


async def test_the_apis_lifecycle_lines_are_not_under_uvicorn_error(
    make_settings, tmp_path: Path
) -> None:
    settings = make_settings(api_port=free_port(), log_format="json")
    log_path = tmp_path / "api.log"
    async with running_api(settings, log_path):
        pass  # up (ready), then SIGTERM, exit 0
    lines = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    seen = {}
    for line in lines:
        for words in LIFECYCLE:
            if line["message"].startswith(words):
                seen[words] = line
    assert sorted(seen) == sorted(LIFECYCLE), [line["message"] for line in lines]
    assert {line["logger"] for line in seen.values()} == {"uvicorn"}
    assert {line["level"] for line in seen.values()} == {"INFO"}
    assert not [line for line in lines if line["logger"].startswith("uvicorn.error")]
