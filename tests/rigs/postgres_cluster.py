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

Every method blocks; from async tests call the slow ones through ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.rigs.rabbitmq_node import free_port
from tests.rigs.wait import poll

PG_BIN = Path("/usr/lib/postgresql/15/bin")
OS_USER = "postgres"
DB_USER = "postgres"


def available() -> bool:
    """True when the PostgreSQL 15 server binaries are installed here (and usable by us)."""
    if not all((PG_BIN / b).exists() for b in ("initdb", "pg_ctl", "pg_basebackup", "psql")):
        return False
    if os.geteuid() != 0:
        return True
    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        return False
    return shutil.which("runuser") is not None


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", OS_USER, "--", *cmd]
    return cmd


def _clean_env() -> dict[str, str]:
    # PGHOST, PGPORT ... of the caller must not redirect the rig's tools
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGCONNECT_TIMEOUT"] = "5"
    return env


def _run(cmd: list[str], what: str, timeout: float = 120) -> str:
    result = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=_clean_env(), check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed ({result.returncode}): {result.stdout}{result.stderr}")
    return result.stdout


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody has reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class PgServer:
    """One PostgreSQL server: its data directory, port and log."""

    name: str
    data_dir: Path
    port: int = field(default_factory=free_port)
    pids_seen: set[int] = field(default_factory=set)

    @property
    def log_file(self) -> Path:
        return self.data_dir.parent / f"{self.name}.log"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{DB_USER}@127.0.0.1:{self.port}/{database}"

    def pg_ctl(self, *args: str, timeout: float = 120) -> str:
        return _run(
            _as_server_user([str(PG_BIN / "pg_ctl"), "-D", str(self.data_dir), *args]),
            f"pg_ctl {args[-1]} on {self.name}",
            timeout,
        )

    def start(self) -> None:
        try:
            self.pg_ctl("-l", str(self.log_file), "-w", "-t", "90", "start")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{self.log_tail()}") from None
        pid = self.pid()
        if pid is None:
            raise RuntimeError(f"{self.name} started but wrote no postmaster.pid")
        self.pids_seen.add(pid)

    def pid(self) -> int | None:
        """The postmaster's pid, from ``postmaster.pid`` (None when it is not running)."""
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        except FileNotFoundError:
            return None
        pid = int(first)
        return pid if _alive(pid) else None

    @property
    def running(self) -> bool:
        return self.pid() is not None

    def kill(self, *, whole_server: bool = True) -> None:
        """SIGKILL the postmaster and, by default, every process it started, at once.

        ``whole_server=True`` is a dead machine: no process of the server says goodbye.
        ``whole_server=False`` kills the postmaster alone; its children notice its death and
        end their sessions themselves (PostgreSQL's postmaster-death check).
        """
        pid = self.pid()
        if pid is None:
            return
        self.pids_seen.add(pid)
        # each child is a process group leader of its own (PostgreSQL calls setsid in every
        # child), so killpg of the postmaster would miss them: kill them by pid
        victims = [pid, *(_children(pid) if whole_server else [])]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        poll(lambda: not any(_alive(v) for v in victims), 30, f"{self.name} gone")
        poll(lambda: not self.accepts_tcp(), 30, f"{self.name}'s port closed")

    def _kill_leftovers(self) -> None:
        for pid in self.pids_seen:
            # a dead postmaster's pid may already be someone else's: check before killing
            if self._is_our_postmaster(pid):
                for victim in (pid, *_children(pid)):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(victim, signal.SIGKILL)

    def _is_our_postmaster(self, pid: int) -> bool:
        if not _alive(pid):
            return False
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, ProcessLookupError):
            return False
        return os.fsencode(self.data_dir) in argv

    def accepts_tcp(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """Immediate stop (the data is thrown away afterwards); SIGKILL whatever is left."""
        if self.running:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.pg_ctl("-m", "immediate", "-w", "-t", "30", "stop", timeout=60)
        self._kill_leftovers()

    def promote(self) -> None:
        """``pg_ctl promote``; returns once the server has left recovery."""
        self.pg_ctl("-w", "-t", "60", "promote")

    def sql(self, query: str, database: str = "postgres") -> str:
        """Run one SQL command with psql; the unaligned, tuples-only output, stripped."""
        return _run(
            [
                str(PG_BIN / "psql"),
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                self.dsn(database),
                "-c",
                query,
            ],
            f"psql on {self.name}: {query}",
            timeout=60,
        ).strip()

    def in_recovery(self) -> bool:
        return self.sql("SELECT pg_is_in_recovery()") == "t"

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_file.exists():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class PgCluster:
    """A primary and one streaming standby; ``base_dir`` receives the logs at the end."""

    base_dir: Path
    synchronous: bool = True
    standby_name: str = "standby"
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
        self.primary = PgServer("primary", self.work_dir / "primary")
        self.standby = PgServer("standby", self.work_dir / "standby")

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
        _run(
            _as_server_user(
                [
                    str(PG_BIN / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    DB_USER,
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                    "--no-instructions",
                ]
            ),
            "initdb",
        )
        sync_names = f"'{self.standby_name}'" if self.synchronous else "''"
        self._append_conf(
            data,
            f"""
listen_addresses = '127.0.0.1'
port = {self.primary.port}
unix_socket_directories = ''
shared_buffers = 32MB
wal_level = replica
max_wal_senders = 4
synchronous_commit = on
synchronous_standby_names = {sync_names}
""",
        )
        # trust, from 127.0.0.1 only: no local (socket) line, no ::1, no other address
        self._write_as_server_user(
            data / "pg_hba.conf",
            "host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n",
        )

    def _clone_standby(self) -> None:
        _run(
            _as_server_user(
                [
                    str(PG_BIN / "pg_basebackup"),
                    "-D",
                    str(self.standby.data_dir),
                    "-d",
                    f"host=127.0.0.1 port={self.primary.port} user={DB_USER} "
                    f"application_name={self.standby_name}",
                    "-R",  # standby.signal and primary_conninfo
                    "-X",
                    "stream",
                    "--checkpoint=fast",
                    "--no-sync",
                ]
            ),
            "pg_basebackup",
        )
        self._append_conf(
            self.standby.data_dir,
            f"""
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
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in servers)
        query = "&".join(
            f"{k}={v}" for k, v in {"target_session_attrs": "read-write", **params}.items()
        )
        return f"postgresql://{DB_USER}@{hosts}/{database}?{query}"

    def log_tails(self, lines: int = 20) -> str:
        return "\n".join(f"--- {s.name}\n{s.log_tail(lines)}" for s in (self.primary, self.standby))
