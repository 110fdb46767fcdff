"""Can a one-shot command reach its services? One clear line when it cannot.

``migrate``, ``publish``, ``dlq`` and ``demo`` run once and exit, so a broker or database that
is not there is the operator's problem to fix, not ours to wait out: each command checks the
services it needs before it starts and stops with one line naming the service and the host
(never the password). Long-running commands (``consume``, ``relay``, ``api``) retry instead.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import asyncpg
from aiormq.exceptions import AMQPError

from bulk_recorder.exceptions import BulkRecorderError
from bulk_recorder.infra import pg_hosts
from bulk_recorder.infra.broker import BrokerNodes, split_urls
from bulk_recorder.infra.errors import BROKER_ERRORS, DB_ERRORS
from bulk_recorder.infra.migrate import maintenance_dsn
from bulk_recorder.infra.tls import amqp_uses_tls, pg_uses_tls, tls_failure_line
from bulk_recorder.masking import endpoint
from bulk_recorder.url_checks import UNREADABLE

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
_BROKER_DOWN: tuple[type[BaseException], ...] = (*BROKER_ERRORS, ValueError)
_DB_DOWN: tuple[type[BaseException], ...] = (*DB_ERRORS, ValueError)


class Unreachable(BulkRecorderError):
    """A service a one-shot command needs cannot be reached; the message is the one line.

    ``tls`` is True when the server answered but TLS failed (its certificate refused): a setting
    to fix, which retrying cannot mend.
    """

    def __init__(self, line: str, *, tls: bool = False) -> None:
        super().__init__(line)
        self.tls = tls


def reason(exc: BaseException) -> str:
    """What ``exc`` says, on one short line; a parser's ValueError (not a driver's own error)
    in our words: its text may quote a piece of a password."""
    if isinstance(exc, ValueError) and not isinstance(exc, (asyncpg.InterfaceError, AMQPError)):
        return UNREADABLE
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]


async def check_database(dsn: str) -> None:
    """Connect to ``dsn``'s database, or to the server's maintenance database when ours does
    not exist yet (``migrate`` creates it): a role may be allowed into its own database only."""
    try:
        try:
            conn = await pg_hosts.connect(dsn)
        except asyncpg.InvalidCatalogNameError:
            conn = await pg_hosts.connect(maintenance_dsn(dsn))
    except _DB_DOWN as exc:
        tls = tls_failure_line("DATABASE_URL", "PostgreSQL", endpoint(dsn), dsn, exc)
        if tls:
            raise Unreachable(tls, tls=True) from None
        raise Unreachable(f"cannot reach PostgreSQL at {endpoint(dsn)}: {reason(exc)}") from None
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
        tls = tls_failure_line("RABBITMQ_URL", "RabbitMQ", where, url, exc)
        if tls:
            raise Unreachable(tls, tls=True) from None
        raise Unreachable(f"cannot reach RabbitMQ at {where}: {reason(exc)}") from None
    finally:
        quiet.setLevel(level)
    await connection.close()


async def check_tls(*, database_url: str | None, rabbitmq_url: str | None) -> None:
    """For the long-running commands: raise :class:`Unreachable` only for a TLS failure.

    They wait for a service that is down, but a certificate their settings refuse will not
    mend itself: it stops them at start-up with one line. Services without TLS are not tried.
    """
    tried: list[tuple[Callable[[str], Awaitable[None]], str]] = []
    if database_url is not None and pg_uses_tls(database_url):
        tried.append((check_database, database_url))
    if rabbitmq_url is not None and any(amqp_uses_tls(u) for u in split_urls(rabbitmq_url)):
        tried.append((check_broker, rabbitmq_url))
    for check, url in tried:
        try:
            await check(url)
        except Unreachable as exc:
            if exc.tls:
                raise
            log.debug("%s (the command waits for it)", exc)
