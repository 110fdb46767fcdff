"""A throwaway PostgreSQL 15 server of a benchmark's own, for server settings the machine's
server must keep (autovacuum, a long transaction held on purpose): its own port, trust from
127.0.0.1 only, removed at the end."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.rigs.postgres_server import DB_USER, OS_USER, PG_BIN, PgServer, as_server_user, run


def _write(path: Path, text: str, owner: Path) -> None:
    stat = owner.stat()
    path.write_text(text)
    if os.geteuid() == 0:
        os.chown(path, stat.st_uid, stat.st_gid)


@contextlib.contextmanager
def private_server(name: str, settings: str = "") -> Iterator[PgServer]:
    """initdb, start with ``settings`` appended to postgresql.conf; stop and remove at the end.
    Everything else is PostgreSQL's defaults (autovacuum included)."""
    work = Path(tempfile.mkdtemp(prefix=f"br-{name}-"))
    if os.geteuid() == 0:  # PostgreSQL refuses root: its files belong to the postgres user
        user = pwd.getpwnam(OS_USER)
        os.chown(work, user.pw_uid, user.pw_gid)
    server = PgServer(name, work / "data")
    try:
        run(
            as_server_user(
                [
                    str(PG_BIN / "initdb"), "-D", str(server.data_dir), "-U", DB_USER,
                    "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions",
                ]
            ),
            "initdb",
        )  # fmt: skip
        conf = server.data_dir / "postgresql.conf"
        _write(
            conf,
            conf.read_text()
            + f"\n# bulk-recorder benchmark\nlisten_addresses = '127.0.0.1'\nport = {server.port}\n"
            + f"unix_socket_directories = ''\n{settings}\n",
            conf,
        )
        _write(server.data_dir / "pg_hba.conf", "host all all 127.0.0.1/32 trust\n", conf)
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
