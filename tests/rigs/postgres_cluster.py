"""A throwaway PostgreSQL 15 primary with a streaming standby, for failover tests.

:class:`PgCluster` builds both servers from the installed binaries (``/usr/lib/postgresql/15``):
``initdb`` for the primary, ``pg_basebackup -R`` for the standby, each on a free port of its own,
listening on 127.0.0.1 only with trust authentication for 127.0.0.1 only and no Unix socket. The
machine's own cluster (``/etc/postgresql``, port 5432) is never read or touched.

- ``synchronous=True`` (the default): the primary names the standby in
  ``synchronous_standby_names`` with ``synchronous_commit = on``, so a COMMIT returns only once
  the standby has flushed its WAL: a commit that returned survives the primary's death.
- ``synchronous=False``: the standby streams asynchronously; a COMMIT returns once the primary
  alone has flushed it, so a commit that returned can be missing on a promoted standby.

Failover helpers: :meth:`PgServer.kill` SIGKILLs a server's postmaster together with every
process it started (as when the machine dies), or the postmaster alone;
:meth:`PgServer.promote` runs ``pg_ctl promote``; :meth:`PgCluster.multi_host_dsn` gives the
libpq multi-host DSN with ``target_session_attrs=read-write`` that follows the primary;
:meth:`PgCluster.detach_standby` stops the standby's WAL receiver (``primary_conninfo = ''``)
so that a commit deterministically does not reach it. (``pg_wal_replay_pause()`` is no such
tool: it pauses only replay; the receiver goes on receiving and flushing, and what it received
is replayed at promotion.)

The standby runs with ``synchronous_standby_names = ''``: once promoted it has no standby of its
own, and a promoted server that waited for one would hang every write.

PostgreSQL refuses to run as root. Under root every server command runs as the ``postgres`` OS
user (``runuser``), and since pytest's folders (``/tmp/pytest-of-root``, mode 0700) are closed to
that user, the data directories live in a private folder of the system's temporary directory
owned by ``postgres``. :meth:`PgCluster.stop` copies the server logs into ``base_dir`` (the
test's folder) and removes that private folder, also after a failed test.

``hosts=(primary_host, standby_host)`` (:class:`~tests.rigs.netns.Host` s) runs each server in
its network namespace on port 5432 of its host's address, trusting the rig's subnet: the standby
streams from the primary's address across the rig's bridge, so a partition between the two
hosts cuts the replication for real.

Every method blocks; from async tests call the slow ones through ``asyncio.to_thread``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.rigs.postgres_server import (
    DB_USER,
    OS_USER,
    PG_BIN,
    PgServer,
    as_server_user,
    available,
    run,
)
from tests.rigs.wait import poll

if TYPE_CHECKING:
    from tests.rigs.netns import Host

__all__ = ["PG_BIN", "PgCluster", "PgServer", "available"]


@dataclass
class PgCluster:
    """A primary and one streaming standby; ``base_dir`` receives the logs at the end."""

    base_dir: Path
    synchronous: bool = True
    standby_name: str = "standby"
    hosts: tuple[Host, Host] | None = None  # (primary's, standby's) network namespaces
    work_dir: Path = field(init=False)
    primary: PgServer = field(init=False)
    standby: PgServer = field(init=False)
    timings: dict[str, float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            user = pwd.getpwnam(OS_USER)
            self.work_dir = Path(tempfile.mkdtemp(prefix="br-pgrig-"))
            os.chown(self.work_dir, user.pw_uid, user.pw_gid)
        else:
            self.work_dir = Path(tempfile.mkdtemp(prefix="pg-", dir=self.base_dir))
        if self.hosts is None:
            self.primary = PgServer("primary", self.work_dir / "primary")
            self.standby = PgServer("standby", self.work_dir / "standby")
        else:
            self.primary = PgServer("primary", self.work_dir / "primary", 5432, host=self.hosts[0])
            self.standby = PgServer("standby", self.work_dir / "standby", 5432, host=self.hosts[1])

    def _trusted(self) -> str:
        """Who may connect: 127.0.0.1, or in namespaces the rig's whole /24."""
        if self.hosts is None:
            return "127.0.0.1/32"
        return self.primary.address.rsplit(".", 1)[0] + ".0/24"

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> PgCluster:
        began = time.monotonic()
        try:
            self._init_primary()
            self.primary.start()
            self._clone_standby()
            self.standby.start()
            self.wait_streaming()
        except BaseException:
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - began
        return self

    def _init_primary(self) -> None:
        data = self.primary.data_dir
        self.primary.initdb()
        sync_names = f"'{self.standby_name}'" if self.synchronous else "''"
        self._append_conf(
            data,
            f"""
listen_addresses = '{self.primary.address}'
port = {self.primary.port}
unix_socket_directories = ''
shared_buffers = 32MB
wal_level = replica
max_wal_senders = 4
synchronous_commit = on
synchronous_standby_names = {sync_names}
""",
        )
        # trust, from 127.0.0.1 only (or the rig's subnet): no local (socket) line, no ::1
        trusted = self._trusted()
        self._write_as_server_user(
            data / "pg_hba.conf",
            f"host all all {trusted} trust\nhost replication all {trusted} trust\n",
        )

    def _clone_standby(self) -> None:
        run(
            self.standby.argv(
                as_server_user(
                    [
                        str(PG_BIN / "pg_basebackup"),
                        "-D",
                        str(self.standby.data_dir),
                        "-d",
                        f"host={self.primary.address} port={self.primary.port} user={DB_USER} "
                        f"application_name={self.standby_name}",
                        "-R",  # standby.signal and primary_conninfo
                        "-X",
                        "stream",
                        "--checkpoint=fast",
                        "--no-sync",
                    ]
                )
            ),
            "pg_basebackup",
        )
        self._append_conf(
            self.standby.data_dir,
            f"""
listen_addresses = '{self.standby.address}'
port = {self.standby.port}
# promoted, this server has no standby of its own: it must not wait for one
synchronous_standby_names = ''
""",
        )

    def _append_conf(self, data: Path, text: str) -> None:
        conf = data / "postgresql.conf"
        self._write_as_server_user(conf, conf.read_text() + "\n# bulk-recorder rig\n" + text)

    @staticmethod
    def _write_as_server_user(path: Path, text: str) -> None:
        # we may be root writing into a folder of the postgres user: keep the owner
        stat = path.stat() if path.exists() else path.parent.stat()
        path.write_text(text)
        if os.geteuid() == 0:
            os.chown(path, stat.st_uid, stat.st_gid)

    def stop(self) -> None:
        """Stop both servers, keep their logs in ``base_dir``, remove the data directories."""
        began = time.monotonic()
        for server in (self.standby, self.primary):
            server.stop()
        for server in (self.primary, self.standby):
            if server.log_file.exists():
                shutil.copyfile(server.log_file, self.base_dir / server.log_file.name)
        shutil.rmtree(self.work_dir, ignore_errors=True)
        self.timings["stop"] = time.monotonic() - began

    def __enter__(self) -> PgCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- replication ------------------------------------------------------------------------
    def replication_state(self) -> str | None:
        """``sync_state`` of the standby as the primary reports it (None: not streaming)."""
        out = self.primary.sql(
            "SELECT sync_state FROM pg_stat_replication "
            f"WHERE application_name = '{self.standby_name}' AND state = 'streaming'"
        )
        return out or None

    def wait_streaming(self, timeout: float = 60) -> None:
        """Wait until the standby streams, as ``sync`` or ``async`` as this cluster is built."""
        wanted = "sync" if self.synchronous else "async"
        poll(
            lambda: self.replication_state() == wanted,
            timeout,
            f"standby streaming ({wanted})",
        )

    def detach_standby(self, timeout: float = 60) -> None:
        """Stop the standby's WAL receiver: it stays up (read-only) but receives nothing more."""
        self.standby.sql("ALTER SYSTEM SET primary_conninfo = ''")
        self.standby.sql("SELECT pg_reload_conf()")
        poll(
            lambda: self.standby.sql("SELECT count(*) FROM pg_stat_wal_receiver") == "0",
            timeout,
            "standby's WAL receiver stopped",
        )
        poll(
            lambda: self.primary.sql("SELECT count(*) FROM pg_stat_replication") == "0",
            timeout,
            "primary without WAL sender",
        )

    # -- failover ---------------------------------------------------------------------------
    def failover(self) -> float:
        """SIGKILL the primary, promote the standby; seconds from the kill to writable."""
        began = time.monotonic()
        self.primary.kill()
        self.standby.promote()
        poll(lambda: not self.standby.in_recovery(), 60, "standby out of recovery")
        self.timings["failover"] = took = time.monotonic() - began
        return took

    def multi_host_dsn(
        self, database: str = "postgres", *, standby_first: bool = False, **params: str
    ) -> str:
        """``postgresql://postgres@127.0.0.1:P1,127.0.0.1:P2/db?target_session_attrs=read-write``."""
        servers = [self.primary, self.standby]
        if standby_first:
            servers.reverse()
        hosts = ",".join(f"{s.address}:{s.port}" for s in servers)
        query = "&".join(
            f"{k}={v}" for k, v in {"target_session_attrs": "read-write", **params}.items()
        )
        return f"postgresql://{DB_USER}@{hosts}/{database}?{query}"

    def log_tails(self, lines: int = 20) -> str:
        return "\n".join(f"--- {s.name}\n{s.log_tail(lines)}" for s in (self.primary, self.standby))
