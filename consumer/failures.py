"""One line for a one-shot command that a service refused or dropped after it started.

``bulk_recorder.infra.reach`` checks that each service answers before a one-shot command starts. The
server can still refuse us afterwards (no right to create the database) or drop the connection
half-way: the driver's exception becomes one line naming the service and the host (never the
password) instead of a traceback, as for every other bad input; ``consumer.cli.main`` raises it
as an ``Unreachable`` (exit 1). Our own refusals (``MigrationRefused``, ``RolesRefused``) carry
their line and exit code themselves.
"""

from __future__ import annotations

import aiormq

from bulk_recorder.infra.broker import split_urls
from bulk_recorder.infra.errors import CONNECTION_ERRORS, PG_ERRORS
from bulk_recorder.infra.reach import reason
from bulk_recorder.infra.tls import tls_failure_line
from bulk_recorder.masking import endpoint
from settings import Settings


def failure_line(exc: BaseException, *, needs: tuple[str, ...], settings: Settings) -> str | None:
    """The line for ``exc``, or None when it is none of a service's doing (a real bug)."""
    if isinstance(exc, PG_ERRORS):
        service = "database"
    elif isinstance(exc, aiormq.exceptions.AMQPError):
        service = "broker"
    elif isinstance(exc, CONNECTION_ERRORS) and len(needs) == 1:
        service = needs[0]  # only one service to blame
    else:
        return None
    if service == "database":
        url, where = settings.database_url, endpoint(settings.database_url)
        tls = tls_failure_line("DATABASE_URL", "PostgreSQL", where, url, exc)
        return tls or f"PostgreSQL at {where}: {reason(exc)}"
    url = settings.rabbitmq_url
    where = ", ".join(endpoint(node) for node in split_urls(url))
    tls = tls_failure_line("RABBITMQ_URL", "RabbitMQ", where, url, exc)
    return tls or f"RabbitMQ at {where}: {reason(exc)}"
