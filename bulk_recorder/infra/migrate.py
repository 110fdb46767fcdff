"""Idempotent schema migrations: numbered SQL files applied once each, under an advisory lock."""

from __future__ import annotations

import hashlib
import logging
from importlib import resources
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from bulk_recorder.exceptions import EXIT_SETTINGS, BulkRecorderError
from bulk_recorder.infra import pg_hosts

log = logging.getLogger(__name__)


class MigrationRefused(BulkRecorderError):
    """The schema needs a change that the connected role may not make; the message says what."""


class MigrationEdited(BulkRecorderError):
    """A migration applied to this database differs from the package's file of that name:
    the schema is not what the code expects, and applying more would build on an unknown."""

    exit_code = EXIT_SETTINGS


# Any constant works; it only has to be the same for every process that migrates this schema.
_LOCK_KEY = 0x62756C6B  # "bulk"


def migration_files() -> list[tuple[str, str]]:
    """(name, sql) of every migration, in order."""
    folder = resources.files("bulk_recorder") / "sql"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".sql"))
    return [(name, (folder / name).read_text(encoding="utf-8")) for name in names]


def _database_name(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/") or "postgres"


def _with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def maintenance_dsn(dsn: str) -> str:
    """The DSN of the server's ``postgres`` database, which exists before ours does."""
    return _with_database(dsn, "postgres")


async def create_database_if_missing(dsn: str) -> bool:
    """Create the DSN's database when it does not exist. Returns True when it was created."""
    name = _database_name(dsn)
    conn = await pg_hosts.connect(maintenance_dsn(dsn))
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if exists:
            return False
        try:
            await conn.execute(f'CREATE DATABASE "{name.replace(chr(34), chr(34) * 2)}"')
        except (asyncpg.DuplicateDatabaseError, asyncpg.UniqueViolationError):
            # another process created it first: PostgreSQL reports the clash as 42P04 if the
            # other commit came before our check, as 23505 on pg_database if it came during
            return False
        log.info("created database %s", name)
        return True
    finally:
        await conn.close()


def checksum(sql: str) -> str:
    """The SHA-256 (hex) of a migration file's text, as recorded in ``schema_migrations``."""
    return hashlib.sha256(sql.encode("utf-8")).hexdigest()


async def _recorded_checksums(conn: asyncpg.Connection) -> dict[str, str | None] | None:
    """name -> recorded checksum (None: applied before checksums were kept); None when
    ``schema_migrations`` has no checksum column yet."""
    has_column = await conn.fetchval(
        "SELECT 1 FROM pg_attribute WHERE attrelid = 'schema_migrations'::regclass"
        " AND attname = 'checksum' AND NOT attisdropped"
    )
    if not has_column:
        return None
    rows = await conn.fetch("SELECT name, checksum FROM schema_migrations")
    return {r["name"]: r["checksum"] for r in rows}


def check_unedited(recorded: dict[str, str | None]) -> None:
    """Raise :class:`MigrationEdited` naming the first applied file whose text changed."""
    for name, sql in migration_files():
        kept = recorded.get(name)
        if kept is not None and kept != checksum(sql):
            raise MigrationEdited(
                f"migration {name} was edited after it was applied to this database (recorded "
                f"sha256 {kept[:12]}, file {checksum(sql)[:12]}); restore it and put the change "
                "in a new migration"
            )


async def pending_migrations(conn: asyncpg.Connection) -> list[str] | None:
    """Names of the migrations not applied yet; None when ``schema_migrations`` is missing."""
    if await conn.fetchval("SELECT to_regclass('schema_migrations')") is None:
        return None
    done = {r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations")}
    return [name for name, _ in migration_files() if name not in done]


async def apply_migrations(conn: asyncpg.Connection) -> list[str]:
    """Apply the migrations not yet recorded in ``schema_migrations``; returns their names.

    It reads first: a schema already up to date is left alone without a lock or any DDL, so
    the services, which migrate at start-up, may run as roles that hold no DDL rights. A change
    the role may not make raises :class:`MigrationRefused`.
    """
    try:
        if await pending_migrations(conn) == []:
            recorded = await _recorded_checksums(conn)
            if recorded is not None and None not in recorded.values():
                check_unedited(recorded)
                return []
        return await _apply_locked(conn)
    except asyncpg.InsufficientPrivilegeError as exc:
        user = await conn.fetchval("SELECT current_user")
        pending = await _pending_or_unknown(conn)
        raise MigrationRefused(
            f"role {user} may not bring the schema up to date ({pending}: {exc}); "
            "run `bulk-recorder migrate` as the schema's owner"
        ) from None


async def _pending_or_unknown(conn: asyncpg.Connection) -> str:
    try:
        pending = await pending_migrations(conn)
    except asyncpg.PostgresError:
        return "schema_migrations not readable"
    if pending is None:
        return "no schema_migrations table"
    return "pending: " + ", ".join(pending)


async def _apply_locked(conn: asyncpg.Connection) -> list[str]:
    applied: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        # kept since issue 29; a database migrated before has its checksums recorded now
        await conn.execute("ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS checksum text")
        done = await _recorded_checksums(conn) or {}
        check_unedited(done)
        for name, sql in migration_files():
            if name in done and done[name] is None:
                await conn.execute(
                    "UPDATE schema_migrations SET checksum = $2 WHERE name = $1",
                    name,
                    checksum(sql),
                )
            if name in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (name, checksum) VALUES ($1, $2)",
                    name,
                    checksum(sql),
                )
            log.info("applied migration %s", name)
            applied.append(name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
    return applied


async def connect_creating(dsn: str) -> asyncpg.Connection:
    """Connect to ``dsn``'s database, creating it first only when it does not exist.

    The database's own connection comes first: a role allowed into its database only never
    needs the server's maintenance database.
    """
    try:
        return await pg_hosts.connect(dsn)
    except asyncpg.InvalidCatalogNameError:
        await create_database_if_missing(dsn)
        return await pg_hosts.connect(dsn)


async def migrate(dsn: str) -> list[str]:
    """Create the database if needed and bring its schema up to date."""
    conn = await connect_creating(dsn)
    try:
        return await apply_migrations(conn)
    finally:
        await conn.close()
