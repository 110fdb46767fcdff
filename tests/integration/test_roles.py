"""Least privilege, proven: the services run as roles that hold only what each needs.

The schema's owner (a LOGIN role with CREATEDB and CREATEROLE, no superuser) runs
``bulk-recorder migrate --grant-roles PREFIX``, which creates the NOLOGIN roles
``PREFIX_recorder``, ``PREFIX_relay`` and ``PREFIX_api`` from ``sql/roles/grants.sql``. Each
service then runs as a LOGIN role of its own that is a member of one of them, as an operator
would set it up.

- The recorder, the relay and the API, as real processes under those roles, record
  transactions (with operations and balances) and a job of annotations end to end, exactly.
- As any of them, DDL is refused (CREATE, ALTER, DROP, TRUNCATE, CREATE SCHEMA), another
  schema is out of reach, and each may not do another service's writes.
- ``migrate`` as such a role finds an up-to-date schema without needing DDL rights (the
  services migrate at start-up), and refuses in one line when a migration is pending.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from bulk_recorder.infra.migrate import migration_files
from consumer.topology import Topology
from settings import load_settings
from tests.conftest import Services, run_cli, settings_env, unique_name, wait_for, with_database
from tests.integration.producer_support import bearer, provision_key
from tests.rigs.pipeline import ROLES, Pipeline, Workload, assert_recorded_exactly, recorded

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.slow]


def as_user(dsn: str, user: str) -> str:
    """``dsn`` with its user replaced by ``user`` (the test server trusts loopback logins)."""
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{user}@{host}", parts.path, parts.query, parts.fragment))


@dataclass
class LeastPrivilege:
    prefix: str
    owner_dsn: str
    logins: dict[str, str]  # service -> DSN of its LOGIN role
    env: dict[str, dict[str, str]]  # service -> environment


@pytest.fixture
async def least_privilege(services: Services, topology: Topology) -> AsyncIterator[LeastPrivilege]:
    prefix = unique_name("brrole")
    owner = f"{prefix}_owner"
    logins = {"consume": f"{prefix}_rec_login", "relay": f"{prefix}_rel_login"}
    logins["api"] = f"{prefix}_api_login"
    member_of = {"consume": "recorder", "relay": "relay", "api": "api"}
    database = unique_name("brtest")
    admin = await asyncpg.connect(with_database(services.database_url, "postgres"))
    try:
        await admin.execute(f"CREATE ROLE {owner} LOGIN CREATEDB CREATEROLE")
        for login in logins.values():
            await admin.execute(f"CREATE ROLE {login} LOGIN")
        owner_dsn = as_user(with_database(services.database_url, database), owner)
        migrated = run_cli(
            ["migrate", "--grant-roles", prefix],
            settings_env(load_settings(database_url=owner_dsn)),
        )
        assert migrated.returncode == 0, migrated.stdout + migrated.stderr
        assert f"roles granted: {prefix}_recorder, {prefix}_relay, {prefix}_api" in migrated.stdout
        for service, login in logins.items():
            await admin.execute(f"GRANT {prefix}_{member_of[service]} TO {login}")
        dsns = {s: as_user(owner_dsn, login) for s, login in logins.items()}
        env = {
            s: settings_env(
                load_settings(
                    database_url=dsn,
                    rabbitmq_url=services.rabbitmq_url,
                    rabbitmq_exchange=topology.exchange,
                    rabbitmq_queue=topology.queue,
                    rabbitmq_delivery_limit=topology.delivery_limit,
                    metrics_port=0,
                )
            )
            for s, dsn in dsns.items()
        }
        yield LeastPrivilege(prefix, owner_dsn, dsns, env)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        roles = [*logins.values(), *(f"{prefix}_{m}" for m in member_of.values()), owner]
        for role in roles:
            await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


async def test_services_under_least_privilege_roles_record_everything_once(
    least_privilege: LeastPrivilege, tmp_path: Path
) -> None:
    lp = least_privilege
    pipeline = Pipeline(tmp_path, {role: lp.env[role] for role in ROLES})
    work = Workload.make(transactions=30, annotations=300)
    owner = await asyncpg.connect(lp.owner_dsn)
    try:
        await pipeline.start()
        key = await provision_key(lp.owner_dsn)  # keys are the owner's: the api role reads them
        await work.post(pipeline.api, bearer(key))
        await wait_for(lambda: recorded(owner, work), timeout=120)
        codes = await pipeline.stop()
        assert codes == {"api": 0, "relay": 0, "consume": 0}, pipeline.logs()
        await assert_recorded_exactly(owner, work)
        users = {r[0] for r in await owner.fetch("SELECT usename FROM pg_stat_activity")}
        assert not users & set(lp.logins.values()), "the services' sessions outlived them"
    except BaseException:
        print(pipeline.logs())
        raise
    finally:
        await pipeline.stop()
        await owner.close()


# Statements each service's role must be refused (42501), whatever else it may do.
DDL = [
    "CREATE TABLE intruder (i int)",
    "CREATE SCHEMA intruder",
    "ALTER TABLE transactions ADD COLUMN intruder int",
    "DROP TABLE outbox",
    "TRUNCATE credit_annotations",
    "CREATE INDEX intruder_idx ON balances (updated_at)",
    "SELECT * FROM other_app.secrets",
]
NOT_THEIRS = {
    "consume": ["DELETE FROM outbox", "SELECT * FROM transaction_requests", "DELETE FROM balances"],
    "relay": ["INSERT INTO transactions (id) VALUES (gen_random_uuid())", "DELETE FROM balances"],
    "api": [
        "INSERT INTO credit_annotations (id) VALUES (gen_random_uuid())",
        "DELETE FROM outbox",
        "UPDATE credit_annotation_jobs SET published = 0",
    ],
}


async def test_roles_are_refused_ddl_and_other_writes_and_migrate_needs_none(
    least_privilege: LeastPrivilege,
) -> None:
    lp = least_privilege
    owner = await asyncpg.connect(lp.owner_dsn)
    try:
        await owner.execute("CREATE SCHEMA other_app; CREATE TABLE other_app.secrets (s text)")
    finally:
        await owner.close()
    for service, dsn in lp.logins.items():
        conn = await asyncpg.connect(dsn)
        try:
            # what the service needs works: every role reads schema_migrations
            assert await conn.fetchval("SELECT count(*) FROM schema_migrations") == len(
                migration_files()
            )
            for statement in [*DDL, *NOT_THEIRS[service]]:
                with pytest.raises(asyncpg.InsufficientPrivilegeError):
                    await conn.execute(statement)
        finally:
            await conn.close()

    # migrate as a service's role: an up-to-date schema needs no DDL, a pending one is refused
    as_recorder = lp.env["consume"]
    done = run_cli(["migrate"], as_recorder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing (schema up to date)" in done.stdout

    owner = await asyncpg.connect(lp.owner_dsn)
    try:  # as if a new release brought 003: pending until the owner migrates
        await owner.execute("DELETE FROM schema_migrations WHERE name = '003_job_repeats.sql'")
    finally:
        await owner.close()
    refused = run_cli(["migrate"], as_recorder)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "Traceback" not in refused.stdout + refused.stderr
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith(f"bulk-recorder migrate: role {lp.prefix}_rec_login "), lines[0]
    assert "003_job_repeats.sql" in lines[0], lines[0]
    assert "as the schema's owner" in lines[0], lines[0]

    fixed = run_cli(["migrate"], settings_env(load_settings(database_url=lp.owner_dsn)))
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "003_job_repeats.sql" in fixed.stdout
