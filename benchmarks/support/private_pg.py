"""A private PostgreSQL 15 server for benchmarks that need server settings of their own.

WAL is cluster-wide: on a shared server other work moves ``pg_current_wal_lsn()`` and
``pg_stat_wal`` too, and ``wal_compression`` or the checkpoint settings must not be changed on
a server others use. :func:`private_server` runs ``initdb`` into a temporary folder, starts the
server on a free port with the given settings (``tests/rigs/postgres_server.py``'s
:class:`PgServer`), and stops it and deletes the folder on exit, failure included.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from tests.rigs.postgres_server import (
    OS_USER,
    PgServer,
    available,
)

__all__ = ["available", "private_server", "settings_text"]


def settings_text(settings: dict[str, str]) -> str:
    return "".join(f"{k} = {v}\n" for k, v in settings.items())


def _write_keeping_owner(path: Path, text: str) -> None:
    stat = path.stat() if path.exists() else path.parent.stat()
    path.write_text(text)
    if os.geteuid() == 0:
        os.chown(path, stat.st_uid, stat.st_gid)


def _work_dir(base: Path, name: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=f"br-{name}-pg-", dir=base))
    if os.geteuid() == 0:  # initdb runs as the postgres OS user: it must own the folder
        user = pwd.getpwnam(OS_USER)
        os.chown(folder, user.pw_uid, user.pw_gid)
    return folder


def _sigterm_to_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(f"signal {signum}")


@contextlib.contextmanager
def private_server(
    settings: dict[str, str], base: Path = Path("/var/tmp"), name: str = "growth"
) -> Iterator[PgServer]:
    """initdb + start with ``settings`` appended to postgresql.conf; stop and delete on exit.

    SIGTERM is turned into SystemExit while the server lives, so that a benchmark stopped with
    ``kill`` still removes its data folder."""
    folder = _work_dir(base, name)
    server = PgServer(name, folder / "data")
    previous = signal.signal(signal.SIGTERM, _sigterm_to_exit)
    try:
        server.initdb()
        conf = server.data_dir / "postgresql.conf"
        base_settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(server.port),
            "unix_socket_directories": "''",
        }
        _write_keeping_owner(
            conf,
            conf.read_text()
            + "\n# bulk-recorder benchmark\n"
            + settings_text({**base_settings, **settings}),
        )
        _write_keeping_owner(server.data_dir / "pg_hba.conf", "host all all 127.0.0.1/32 trust\n")
        server.start()
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)
