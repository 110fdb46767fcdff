"""Every lock wait of a throwaway PostgreSQL server, from the server's own log.

:class:`LockLogServer` runs a private PostgreSQL 15 (never the machine's own: these are server
settings) with ``log_lock_waits = on`` and ``deadlock_timeout = 1ms``, so that the server writes
a line for every lock wait longer than a millisecond, naming the waiting backend, the lock, the
backends holding it ("still waiting ... after 1.0 ms") and, once granted, how long the wait was
("acquired ... after N ms"). With ``log_connections`` and each backend's pid in the line prefix,
:func:`read_log` tells which backends a command opened (by its ``application_name``) and every
wait on them, measured by PostgreSQL itself rather than by a loaded client's clock.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.rigs.postgres_server import OS_USER, PgServer

_PREFIX = r"^\S+ \S+ \S+ \[(?P<pid>\d+)\] "
_CONNECTED = re.compile(_PREFIX + r"LOG:  connection authorized: .*application_name=(?P<app>\S+)")
_STILL_WAITING = re.compile(
    _PREFIX + r"LOG:  process \d+ still waiting for (?P<lock>.+?) after [\d.]+ ms"
)
_HOLDERS = re.compile(_PREFIX + r"DETAIL:  Process(?:es)? holding the lock: (?P<holders>[\d, ]+)\.")
_ACQUIRED = re.compile(
    _PREFIX + r"LOG:  process \d+ acquired (?P<lock>.+?) after (?P<ms>[\d.]+) ms"
)

CONF = """
# bulk-recorder lock-wait rig
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = ''
shared_buffers = 128MB
max_connections = 200
log_lock_waits = on
deadlock_timeout = '1ms'
log_connections = on
log_line_prefix = '%m [%p] '
"""


@dataclass
class LockWait:
    """One wait longer than ``deadlock_timeout``: who waited, for what, on whom, how long."""

    waiter: int
    lock: str
    holders: set[int]
    ms: float | None = None  # None: never granted (cancelled, or the run ended first)


@dataclass
class LockLog:
    apps: dict[int, str] = field(default_factory=dict)  # backend pid -> application_name
    waits: list[LockWait] = field(default_factory=list)

    def backends(self, application_name: str) -> set[int]:
        return {pid for pid, app in self.apps.items() if app == application_name}

    def waits_on(self, holders: set[int]) -> list[LockWait]:
        """Waits of other backends for a lock that one of ``holders`` held."""
        return [w for w in self.waits if w.holders & holders and w.waiter not in holders]


def read_log(text: str) -> LockLog:
    out = LockLog()
    open_waits: dict[int, LockWait] = {}
    last_waiting: LockWait | None = None
    for line in text.splitlines():
        if m := _CONNECTED.match(line):
            out.apps[int(m["pid"])] = m["app"]
        elif m := _STILL_WAITING.match(line):
            pid = int(m["pid"])
            last_waiting = open_waits.get(pid)
            if last_waiting is None or last_waiting.lock != m["lock"]:
                last_waiting = LockWait(pid, m["lock"], set())
                open_waits[pid] = last_waiting
                out.waits.append(last_waiting)
        elif (m := _HOLDERS.match(line)) and last_waiting is not None:
            if int(m["pid"]) == last_waiting.waiter:
                last_waiting.holders |= {int(p) for p in m["holders"].split(",")}
        elif m := _ACQUIRED.match(line):
            wait = open_waits.pop(int(m["pid"]), None)
            if wait is not None:
                wait.ms = float(m["ms"])
    return out


class LockLogServer:
    """A private server that logs every lock wait over 1 ms; ``dsn(name)`` for its databases."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        if os.geteuid() == 0:  # PostgreSQL refuses root: its files belong to the postgres user
            user = pwd.getpwnam(OS_USER)
            self.work_dir = Path(tempfile.mkdtemp(prefix="br-pglocks-"))
            os.chown(self.work_dir, user.pw_uid, user.pw_gid)
        else:
            self.work_dir = Path(tempfile.mkdtemp(prefix="pglocks-", dir=base_dir))
        self.server = PgServer("locks", self.work_dir / "data")

    def dsn(self, database: str) -> str:
        return self.server.dsn(database)

    def log(self) -> LockLog:
        return read_log(self.server.log_file.read_text(errors="replace"))

    def start(self) -> LockLogServer:
        data = self.server.data_dir
        try:
            self.server.initdb()
            conf = data / "postgresql.conf"
            self._write(conf, conf.read_text() + CONF.format(port=self.server.port))
            self._write(data / "pg_hba.conf", "host all all 127.0.0.1/32 trust\n")
            self.server.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.server.stop()
        if self.server.log_file.exists():
            shutil.copyfile(self.server.log_file, self.base_dir / "postgresql-locks.log")
        shutil.rmtree(self.work_dir, ignore_errors=True)

    @staticmethod
    def _write(path: Path, text: str) -> None:
        stat = path.stat() if path.exists() else path.parent.stat()
        path.write_text(text)
        if os.geteuid() == 0:
            os.chown(path, stat.st_uid, stat.st_gid)
