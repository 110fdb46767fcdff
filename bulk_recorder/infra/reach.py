"""Can a one-shot command reach its services? One clear line when it cannot.

``migrate``, ``publish``, ``dlq`` and ``demo`` run once and exit, so a broker or database that
is not there is the operator's problem to fix, not ours to wait out: each command checks the
services it needs before it starts and stops with one line naming the service and the host
(never the password). Long-running commands (``consume``, ``relay``, ``api``) retry instead.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from bulk_recorder.infra import pg_hosts
from bulk_recorder.infra.broker import BROKER_ERRORS, BrokerNodes, split_urls
from bulk_recorder.infra.db import DB_ERRORS
from bulk_recorder.infra.migrate import maintenance_dsn

log = logging.getLogger("consumer.reach")  # the name logs have always carried

CONNECT_TIMEOUT_S = 10.0
_BROKER_DOWN: tuple[type[BaseException], ...] = (*BROKER_ERRORS, ValueError)
_DB_DOWN: tuple[type[BaseException], ...] = (*DB_ERRORS, ValueError)


class Unreachable(Exception):
    """A service a one-shot command needs cannot be reached; the message is the one line."""


def endpoint(url: str) -> str:
    """``host:port[,host:port...]/path`` of a URL, without user or password."""
    parts = urlsplit(url)
    hosts = parts.netloc.rpartition("@")[2]
    return f"{hosts}{parts.path or '/'}"


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


async def check_database(dsn: str) -> None:
    """Connect to the server of ``dsn`` (its maintenance database: ``migrate`` may create ours)."""
    try:
        conn = await pg_hosts.connect(maintenance_dsn(dsn))
    except _DB_DOWN as exc:
        raise Unreachable(f"cannot reach PostgreSQL at {endpoint(dsn)}: {_reason(exc)}") from None
    await conn.close()


async def check_services(*, database_url: str | None, rabbitmq_url: str | None) -> None:
    """Raise :class:`Unreachable` for the first of the given services that cannot be reached."""
    if database_url is not None:
        await check_database(database_url)
    if rabbitmq_url is not None:
        await check_broker(rabbitmq_url)


async def check_broker(url: str) -> None:
    quiet = logging.getLogger("aiormq.connection")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # it logs the refusal itself; our one line says it all
    try:
        connection = await BrokerNodes.from_setting(url).connect(wait_s=CONNECT_TIMEOUT_S)
    except _BROKER_DOWN as exc:
        where = ", ".join(endpoint(node) for node in split_urls(url))
        raise Unreachable(f"cannot reach RabbitMQ at {where}: {_reason(exc)}") from None
    finally:
        quiet.setLevel(level)
    await connection.close()
