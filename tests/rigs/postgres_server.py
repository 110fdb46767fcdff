"""One throwaway PostgreSQL 15 server from the installed binaries, for the cluster rig.

:class:`PgServer` wraps a data directory and a port: ``pg_ctl`` start, immediate stop and
promote, a SIGKILL of the postmaster with (or without) every process it started, and one-shot
SQL through ``psql``. :class:`~tests.rigs.postgres_cluster.PgCluster` builds the primary and its
standby from two of them.

PostgreSQL refuses to run as root: under root every server command runs as the ``postgres`` OS
user (``runuser``). Every method blocks; from async tests call the slow ones through
``asyncio.to_thread``.

``host`` (a :class:`~tests.rigs.netns.Host`) runs the server inside that network namespace, and
every command of ours against it (``pg_ctl``, ``psql``, the port probe) from inside it too; the
server then listens on the host's address (the cluster rig writes ``listen_addresses``).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.rigs.rabbitmq_node import free_port
from tests.rigs.wait import poll

if TYPE_CHECKING:
    from tests.rigs.netns import Host

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


def as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", OS_USER, "--", *cmd]
    return cmd


def _clean_env() -> dict[str, str]:
    # PGHOST, PGPORT ... of the caller must not redirect the rig's tools
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PGCONNECT_TIMEOUT"] = "5"
    return env


def run(cmd: list[str], what: str, timeout: float = 120) -> str:
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
    host: Host | None = None  # in this network namespace (tests/rigs/netns.py)

    @property
    def address(self) -> str:
        return self.host.address if self.host is not None else "127.0.0.1"

    def argv(self, cmd: list[str]) -> list[str]:
        """``cmd`` as run against this server: inside its namespace, if it has one."""
        return self.host.argv(cmd) if self.host is not None else cmd

    @property
    def log_file(self) -> Path:
        return self.data_dir.parent / f"{self.name}.log"

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{DB_USER}@{self.address}:{self.port}/{database}"

    def pg_ctl(self, *args: str, timeout: float = 120) -> str:
        return run(
            self.argv(as_server_user([str(PG_BIN / "pg_ctl"), "-D", str(self.data_dir), *args])),
            f"pg_ctl {args[-1]} on {self.name}",
            timeout,
        )

    def initdb(self) -> None:
        """A new cluster in ``data_dir``: trust auth, UTF8, no fsync of the new files."""
        run(
            as_server_user(
                [
                    str(PG_BIN / "initdb"), "-D", str(self.data_dir), "-U", DB_USER,
                    "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions",
                ]
            ),
            f"initdb for {self.name}",
        )  # fmt: skip

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
        if self.host is not None:
            return self.host.port_open(self.port)
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
        return run(
            self.argv(
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
                ]
            ),
            f"psql on {self.name}: {query}",
            timeout=60,
        ).strip()

    def in_recovery(self) -> bool:
        return self.sql("SELECT pg_is_in_recovery()") == "t"

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_file.exists():
            return ""
        return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
