"""Idempotent schema migrations: numbered SQL files applied once each, under an advisory lock."""

from __future__ import annotations

import logging
from importlib import resources
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from bulk_recorder.infra import pg_hosts

log = logging.getLogger("bulk_recorder.migrate")  # the name logs have always carried

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
        except asyncpg.DuplicateDatabaseError:
            return False  # another process created it first
        log.info("created database %s", name)
        return True
    finally:
        await conn.close()


async def apply_migrations(conn: asyncpg.Connection) -> list[str]:
    """Apply the migrations not yet recorded in ``schema_migrations``; returns their names."""
    applied: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations")}
        for name, sql in migration_files():
            if name in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute("INSERT INTO schema_migrations (name) VALUES ($1)", name)
            log.info("applied migration %s", name)
            applied.append(name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
    return applied


async def migrate(dsn: str) -> list[str]:
    """Create the database if needed and bring its schema up to date."""
    await create_database_if_missing(dsn)
    conn = await pg_hosts.connect(dsn)
    try:
        return await apply_migrations(conn)
    finally:
        await conn.close()
