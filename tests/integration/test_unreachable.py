"""One-shot commands that cannot reach their broker or database: one line, no traceback.

``migrate``, ``publish``, ``dlq`` and ``demo`` run once and exit. When a service they need is
not there, the operator gets one line naming the service and the host (never the password) and
a non-zero exit code, as for every other bad input.
"""

from __future__ import annotations

import pytest

from tests.conftest import SettingsFactory, free_port, run_cli, settings_env

SECRET = "s3cret-pw"


@pytest.mark.parametrize(
    ("args", "service"),
    [
        (["migrate"], "PostgreSQL"),
        (["demo", "--count", "10"], "PostgreSQL"),
        (["publish", "--count", "10"], "RabbitMQ"),
        (["dlq", "inspect"], "RabbitMQ"),
        (["dlq", "replay"], "RabbitMQ"),
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
