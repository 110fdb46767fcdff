"""TLS, proven: every command over ``amqps://`` and ``sslmode=verify-full``, and a wrong CA refused.

One RabbitMQ node and one PostgreSQL server per module, from the installed binaries, each on a
port of its own, that accept TLS only (no plain listener; ``hostssl`` lines only), with a server
certificate from a throwaway CA (``tests/rigs/tls.py``). The TLS parameters travel in the two
URL settings alone: ``RABBITMQ_URL=amqps://...?cafile=ca.crt`` and
``DATABASE_URL=postgresql://...?sslmode=verify-full&sslrootcert=ca.crt``.

- API, relay and recorder as real processes record transactions (with operations and balances)
  and a job of credit annotations end to end; the exact records land, once each, and every
  session the services hold on both servers is encrypted.
- The one-shot commands ``migrate`` and ``publish`` work over TLS (``dlq`` and ``demo`` connect
  the same way).
- Given a CA that did not sign the server's certificate, every command, one-shot or
  long-running, stops at start-up with one line naming the setting (``RABBITMQ_URL`` or
  ``DATABASE_URL``) and the CA file, exit code 1 as for an unreachable service, no traceback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from settings import load_settings
from tests.conftest import run_cli, settings_env, unique_name, wait_for
from tests.integration.producer_support import bearer, provision_key
from tests.rigs import postgres_server, rabbitmq_node
from tests.rigs.pipeline import ROLES, Pipeline, Workload, assert_recorded_exactly, recorded
from tests.rigs.tls import Pki, TlsPgServer, TlsRabbit, make_pki, tls_rabbit_node

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@dataclass
class TlsServices:
    pki: Pki
    pg: TlsPgServer
    mq: TlsRabbit

    def env(self, *, pg_ca: Path | None = None, mq_ca: Path | None = None) -> dict[str, str]:
        """Environment for a command on a fresh database and fresh queue names."""
        name = unique_name("brtls")
        settings = load_settings(
            database_url=self.pg.dsn(name, pg_ca or self.pki.ca_cert),
            rabbitmq_url=self.mq.url(mq_ca or self.pki.ca_cert),
            rabbitmq_exchange=f"{name}.x",
            rabbitmq_queue=f"{name}.records",
            metrics_port=0,
        )
        return settings_env(settings)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServices]:
    if not (rabbitmq_node.available() and postgres_server.available()):
        pytest.fail("the TLS tests need the installed rabbitmq-server and PostgreSQL 15 binaries")
    folder = tmp_path_factory.mktemp("tls")
    pki = make_pki(folder / "pki")
    pg = TlsPgServer(folder / "pg", pki).start()
    mq = tls_rabbit_node(folder / "mq", pki)
    try:
        mq.node.start()
        yield TlsServices(pki, pg, mq)
    finally:
        mq.node.stop()
        pg.stop()


async def test_api_relay_and_recorder_over_tls_record_everything_once(
    tls: TlsServices, tmp_path: Path
) -> None:
    env = tls.env()
    dsn = env["DATABASE_URL"]
    pipeline = Pipeline(tmp_path, {role: env for role in ROLES})
    work = Workload.make(transactions=30, annotations=300)
    conn: asyncpg.Connection | None = None
    try:
        await pipeline.start()
        key = await provision_key(dsn)
        await work.post(pipeline.api, bearer(key))
        conn = await asyncpg.connect(dsn)
        await wait_for(lambda: recorded(conn, work), timeout=120)

        # every session of the services, on both servers, is encrypted
        sessions = await conn.fetch(
            "SELECT s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)"
            " WHERE a.datname = $1 AND a.pid <> pg_backend_pid()",
            urlsplit(dsn).path.lstrip("/"),
        )
        assert len(sessions) >= 3, sessions  # the pools of recorder, relay and API at least
        assert all(row["ssl"] for row in sessions), sessions
        listed = await asyncio.to_thread(
            tls.mq.node.ctl, "list_connections", "ssl", "--no-table-headers", "--quiet"
        )
        flags = listed.stdout.split()
        assert len(flags) >= 2, listed.stdout  # the relay's and the recorder's at least
        assert set(flags) == {"true"}, listed.stdout

        codes = await pipeline.stop()
        assert codes == {"api": 0, "relay": 0, "consume": 0}, pipeline.logs()
        await assert_recorded_exactly(conn, work)
    except BaseException:
        print(pipeline.logs())
        raise
    finally:
        await pipeline.stop()
        if conn is not None:
            await conn.close()


def test_one_shot_commands_work_over_tls(tls: TlsServices) -> None:
    env = tls.env()
    migrated = run_cli(["migrate"], env)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert "003_job_repeats.sql" in migrated.stdout
    published = run_cli(["publish", "--count", "50", "--quiet"], env)
    assert published.returncode == 0, published.stdout + published.stderr
    assert "50" in published.stdout, published.stdout


@pytest.mark.parametrize(
    ("args", "setting"),
    [
        (["migrate"], "DATABASE_URL"),
        (["publish", "--count", "10"], "RABBITMQ_URL"),
        (["consume"], "DATABASE_URL"),
        (["consume"], "RABBITMQ_URL"),
        (["relay"], "RABBITMQ_URL"),
        (["api"], "DATABASE_URL"),
    ],
)
def test_a_certificate_from_another_ca_is_one_line_naming_the_setting(
    tls: TlsServices, args: list[str], setting: str
) -> None:
    wrong = tls.pki.other_ca_cert
    env = tls.env(pg_ca=wrong) if setting == "DATABASE_URL" else tls.env(mq_ca=wrong)
    done = run_cli(args, env, timeout=60)
    out, err = done.stdout, done.stderr
    assert done.returncode == 1, out + err  # as for an unreachable service
    assert "Traceback" not in out + err, out + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith(f"bulk-recorder {args[0]}: {setting}: "), line
    assert "certificate verify failed" in line, line
    assert str(wrong) in line, line  # the CA file it trusted instead
    port = tls.pg.port if setting == "DATABASE_URL" else tls.mq.tls_port
    assert f"127.0.0.1:{port}" in line, line
