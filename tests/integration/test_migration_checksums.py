"""An applied migration that was edited is refused, naming the file; checksums are recorded.

``schema_migrations`` keeps the SHA-256 of each file it applied. A database migrated before it
did gets them recorded on its next ``migrate``. A file whose text no longer matches what was
applied means the schema is not the one the code was written for: ``migrate`` (and a service's
start-up migration) stops with exit 2, naming the file, rather than building on it.
"""

from __future__ import annotations

import pytest

from bulk_recorder.infra.migrate import MigrationEdited, checksum, migrate, migration_files
from tests.conftest import run_cli, settings_env

pytestmark = [pytest.mark.postgres]


async def _recorded(conn) -> dict[str, str | None]:
    rows = await conn.fetch("SELECT name, checksum FROM schema_migrations")
    return {r["name"]: r["checksum"] for r in rows}


def _expected() -> dict[str, str]:
    return {name: checksum(sql) for name, sql in migration_files()}


async def test_a_fresh_database_records_each_files_checksum(database_url, db) -> None:
    await migrate(database_url)
    assert await _recorded(await db()) == _expected()
    assert await migrate(database_url) == []  # unchanged files: nothing to do, no refusal


async def test_a_database_from_before_checksums_gets_them_on_its_next_migrate(
    database_url, db
) -> None:
    await migrate(database_url)
    conn = await db()
    await conn.execute("ALTER TABLE schema_migrations DROP COLUMN checksum")  # as it was
    assert await migrate(database_url) == []
    assert await _recorded(conn) == _expected()
    await conn.execute(
        "UPDATE schema_migrations SET checksum = NULL WHERE name = '003_job_repeats.sql'"
    )
    assert await migrate(database_url) == []
    assert await _recorded(conn) == _expected()


async def test_an_edited_applied_migration_is_refused_naming_the_file(
    database_url, db, make_settings
) -> None:
    await migrate(database_url)
    conn = await db()
    # what was applied is not what the package's 002_outbox.sql says any more
    await conn.execute(
        "UPDATE schema_migrations SET checksum = $1 WHERE name = '002_outbox.sql'",
        checksum("-- the file as it was applied\n"),
    )
    with pytest.raises(MigrationEdited, match=r"002_outbox\.sql"):
        await migrate(database_url)
    done = run_cli(["migrate"], settings_env(make_settings()))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "002_outbox.sql" in done.stderr, done.stderr
    assert "was edited after it was applied" in done.stderr, done.stderr
    assert done.stderr.count("\n") <= 2, done.stderr  # one line, not a traceback


async def test_an_edit_is_refused_before_a_pending_migration_is_applied(database_url, db) -> None:
    """The refusal holds on both paths: with nothing pending (no lock taken) and with a
    migration still to apply, where nothing is applied on top of the edited file."""
    await migrate(database_url)
    conn = await db()
    last = migration_files()[-1][0]
    await conn.execute(
        "UPDATE schema_migrations SET checksum = $1 WHERE name = '002_outbox.sql'",
        checksum("-- the file as it was applied\n"),
    )
    await conn.execute("DELETE FROM schema_migrations WHERE name = $1", last)  # pending again
    with pytest.raises(MigrationEdited, match=r"002_outbox\.sql"):
        await migrate(database_url)
    assert last not in await _recorded(conn)
