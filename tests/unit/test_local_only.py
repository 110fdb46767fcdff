"""``publish`` and ``demo`` refuse a remote target: every host they would write to is checked,
each node of a RABBITMQ_URL list and (for ``demo``) each host of a multi-host DATABASE_URL,
not only the first."""

from __future__ import annotations

import pytest

from consumer.tools.local_only import RemoteTarget, refuse_remote_targets
from settings import load_settings

LOCAL_BROKER = "amqp://guest:guest@LOCALHOST:5672/"
LOCAL_DB = "postgresql://postgres@127.0.0.1:5432/bulk"


@pytest.mark.parametrize(
    ("command", "rabbitmq_url", "database_url", "refused"),
    [
        ("publish", f"{LOCAL_BROKER},amqp://guest:guest@10.0.0.7:5672/", LOCAL_DB, "RABBITMQ_URL"),
        ("demo", f"{LOCAL_BROKER}, amqp://guest:guest@10.0.0.7/", LOCAL_DB, "RABBITMQ_URL"),
        (
            "demo",
            LOCAL_BROKER,
            "postgresql://postgres@[::1]:5432,10.0.0.7:5433/bulk",
            "DATABASE_URL",
        ),
        ("publish", LOCAL_BROKER, "postgresql://postgres@[::1]:5432,10.0.0.7:5433/bulk", None),
        (
            "demo",
            f"{LOCAL_BROKER},amqp://guest:guest@127.0.0.2/",
            "postgresql://postgres@localhost,[::1]:5433/bulk",
            None,
        ),
    ],
    ids=[
        "publish-second-broker-node",
        "demo-second-broker-node",
        "demo-second-database-host",
        "publish-reaches-no-database",
        "demo-all-loopback",
    ],
)
def test_every_host_a_load_command_writes_to_is_checked_not_only_the_first(
    command: str, rabbitmq_url: str, database_url: str, refused: str | None
) -> None:
    settings = load_settings(rabbitmq_url=rabbitmq_url, database_url=database_url)
    if refused is None:
        refuse_remote_targets(command, settings)
        return
    with pytest.raises(RemoteTarget, match=f"^{refused} points at 10.0.0.7, not this machine"):
        refuse_remote_targets(command, settings)
