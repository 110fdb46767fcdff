"""Opening the database for a long-running process: migrate, then a pool, retried until ready.

Shared by the recorder and the relay, which both start whether or not PostgreSQL is up yet.
"""

from __future__ import annotations

import asyncio
import logging

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from bulk_recorder.infra import pg_hosts, tracing
from bulk_recorder.infra.backoff import RETRY
from bulk_recorder.infra.errors import DB_ERRORS
from bulk_recorder.infra.migrate import MigrationEdited, MigrationRefused, migrate
from bulk_recorder.infra.waits import wait_or_stop
from bulk_recorder.masking import endpoint

log = logging.getLogger(__name__)

# A connection of its own or one taken from a pool: what the statements run on.
Connection = asyncpg.Connection | PoolConnectionProxy

# A held (partitioned) connection is noticed after this long, then retried as an outage. It is
# asyncpg's client-side command_timeout, not a server-side statement_timeout: it also covers a
# connection whose packets are lost, where the server never sees the statement at all. The
# recorder takes it from BULK_RECORDER_DB_COMMAND_TIMEOUT_S.
COMMAND_TIMEOUT_S = 15.0


async def keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset on release: nothing beyond what asyncpg always does first.

    asyncpg rolls back a transaction left open before it calls this, whatever it does. Our pool
    connections only run statements inside transactions: no SET, no LISTEN, no advisory lock,
    no cursor outside a transaction (the relay LISTENs, and migrate locks, on connections of
    their own). So the default reset (advisory unlock all, CLOSE ALL, UNLISTEN *, RESET ALL),
    one more round trip and statement for the server on every flush, has nothing to undo.
    """


class DatabaseWait:
    """One line per change of state while a process waits for its database, as for the broker
    (:class:`bulk_recorder.infra.reconnect.OutageLog`): the first failure a WARNING, each retry
    after it a DEBUG line, the first success after it one INFO line."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.failures = 0

    def unreachable(self, exc: BaseException) -> None:
        if self.failures == 0:
            log.warning("database at %s not reachable yet (%r); retrying", self.where, exc)
        else:
            log.debug("database at %s still not reachable (%r)", self.where, exc)
        self.failures += 1

    def refused(self, exc: MigrationRefused) -> None:
        """Reachable, but this login may not migrate: the owner's migrate may be on its way."""
        if self.failures == 0:
            log.warning("%s; retrying", exc)
        else:
            log.debug("%s; still waiting", exc)
        self.failures += 1

    def up(self) -> None:
        if self.failures:
            log.info(
                "database at %s reachable again after %d failed attempts",
                self.where,
                self.failures,
            )


CUSTOM_PLANS = {"plan_cache_mode": "force_custom_plan"}


async def open_pool_when_ready(
    dsn: str,
    *,
    max_size: int,
    stop: asyncio.Event,
    command_timeout: float = COMMAND_TIMEOUT_S,
    session_reset: bool = False,
    custom_plans: bool = False,
    tried: asyncio.Event | None = None,
) -> asyncpg.Pool | None:
    """Migrate and open a pool, retrying with backoff; None if ``stop`` is set first.

    Every command on the pool fails with ``TimeoutError`` after ``command_timeout`` seconds
    without an answer (an outage to the callers, never bad data). ``session_reset`` keeps
    asyncpg's own reset on release (the API's connections carry session state: staging tables);
    ``custom_plans`` plans every statement for its own parameters and the table as it is now
    (``plan_cache_mode = force_custom_plan``), for tables that swing from empty to hundreds of
    thousands of rows in one commit (the outbox): a plan cached while the table was empty
    stays a full scan until the next ANALYZE, and autovacuum may not run one in time, or at
    all (measured: a 300,000-row job relayed at 1,500 rows/s until ANALYZE, 5,000 after);
    ``tried`` is set once the first attempt is over, whatever its outcome.
    """
    attempt = 0
    waiting = DatabaseWait(endpoint(dsn))
    while not stop.is_set():
        try:
            await migrate(dsn)
            pool = await asyncpg.create_pool(
                dsn,
                min_size=1,
                max_size=max_size,
                command_timeout=command_timeout,
                reset=None if session_reset else keep_session,
                connect=pg_hosts.connect,
                server_settings=CUSTOM_PLANS if custom_plans else None,
                # traced: each statement run inside a recorded span becomes a child span
                init=tracing.watch_queries if tracing.active() else None,
            )
            waiting.up()
            return pool
        except MigrationEdited:  # retrying cannot help: the schema is not the code's
            raise
        except MigrationRefused as exc:  # the owner's migrate may be on its way: wait for it
            waiting.refused(exc)
        except DB_ERRORS as exc:
            waiting.unreachable(exc)
        except Exception:  # a surprise from the driver must not end the service
            log.exception("unexpected error while connecting to the database; retrying")
            waiting.failures += 1
        finally:
            if tried is not None:
                tried.set()
        await wait_or_stop(stop, RETRY.delay(attempt))
        attempt += 1
    return None
