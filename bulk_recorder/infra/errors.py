"""How a database failure is classified: the data's fault, or an outage.

The distinction decides everything downstream. Data errors isolate the offending row (split the
batch, reject only that row's delivery). Everything else is treated as an outage: no delivery is
rejected and nothing is dead-lettered; the flush is retried until the database is back. Unknown
errors count as outages on purpose: dead-lettering good data for a bug or an outage is the one
thing the service must never do.

The tuples of what a service that is away looks like to its driver live here too, one module for
every loop and check that must tell "retry later" from a bug: :data:`BROKER_ERRORS`,
:data:`CHANNEL_GONE`, :data:`DB_ERRORS` (with its two halves, :data:`PG_ERRORS` and
:data:`CONNECTION_ERRORS`).
"""

from __future__ import annotations

import logging

import aiormq
import asyncpg

from bulk_recorder.exceptions import BulkRecorderError

log = logging.getLogger(__name__)

# What a database that is away looks like to asyncpg. InternalClientError is what it raises on
# a pooled connection the server has just terminated.
PG_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)
DB_ERRORS = (*PG_ERRORS, OSError, TimeoutError)
# A connection that failed or was dropped, whichever the service (a one-shot command with one
# service to blame names that one).
CONNECTION_ERRORS = (OSError, TimeoutError, EOFError)

# What a broker that is away looks like to aio-pika and aiormq: every loop that connects to
# RabbitMQ treats these as "reconnect later" rather than as a crash. StopAsyncIteration and
# EOFError: when the peer closes the socket (FIN) right after accepting it, as a proxy or a load
# balancer with no healthy backend does, aiormq's frame reader finds the stream at EOF before
# the first frame and raises StopAsyncIteration out of connect(); a close in the middle of a
# frame surfaces as IncompleteReadError (an EOFError). RuntimeError: aiormq's "connection
# closed" paths on a channel whose connection has gone.
BROKER_ERRORS: tuple[type[BaseException], ...] = (
    aiormq.exceptions.AMQPError,
    ConnectionError,
    OSError,
    TimeoutError,
    EOFError,
    StopAsyncIteration,
    RuntimeError,
)
# What a write on a channel whose connection or channel went away raises.
CHANNEL_GONE = (aiormq.exceptions.AMQPError, ConnectionError, RuntimeError)

# SQLSTATE classes that mean "this row is wrong": data exception, integrity constraint violation,
# program limit exceeded (e.g. a value too large for an index row).
_DATA_CLASSES = ("22", "23", "54")
# The server behind a connection can no longer take our writes, whatever we send: it became a
# standby (25006, e.g. an old primary after a failover) or it is shutting down (57P01 admin,
# 57P02 crash, 57P03 cannot connect now). Retrying on that connection can never succeed.
_SERVER_GONE = frozenset({"25006", "57P01", "57P02", "57P03"})


class DataRejected(BulkRecorderError):
    """PostgreSQL refused the rows themselves; retrying the same rows cannot succeed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TransientDbError(BulkRecorderError):
    """The database is unreachable or the transaction failed for a cause that can pass."""


def server_refuses_writes(exc: BaseException | None) -> bool:
    """True when ``exc`` (or what caused it) says the connection's server cannot take writes."""
    seen = 0
    while exc is not None and seen < 5:
        if getattr(exc, "sqlstate", None) in _SERVER_GONE:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


async def renew_if_server_gone(pool: object, exc: BaseException) -> None:
    """After such an error, make the pool replace every connection on its next acquire.

    With a multi-host DATABASE_URL and ``target_session_attrs=read-write`` the new connections
    find the new primary; a connection left on the old one would fail for ever.
    """
    expire = getattr(pool, "expire_connections", None)
    if expire is not None and server_refuses_writes(exc):
        log.warning("the database server refuses writes (%s): renewing the connections", exc)
        await expire()


def classify(exc: BaseException) -> DataRejected | TransientDbError:
    """Map a driver exception to :class:`DataRejected` or :class:`TransientDbError`."""
    if isinstance(exc, asyncpg.PostgresError):
        sqlstate = getattr(exc, "sqlstate", None) or ""
        if sqlstate[:2] in _DATA_CLASSES:
            detail = getattr(exc, "detail", None)
            text = f"{sqlstate} {exc}" + (f" ({detail})" if detail else "")
            return DataRejected(text[:300])
    return TransientDbError(f"{type(exc).__name__}: {exc}"[:300])
