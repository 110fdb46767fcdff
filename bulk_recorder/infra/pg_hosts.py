"""Connect to one of the hosts of a (multi-host) DATABASE_URL, each host within its own time.

A DATABASE_URL may list a primary and its standbys, libpq style:
``postgresql://user@db1:5432,db2:5432/name?target_session_attrs=read-write``. asyncpg
understands the syntax and tries the hosts in order, but its ``timeout`` bounds the whole
connect: a host that never answers (a dead machine whose packets vanish, a server that took the
socket and hangs) spends all of it, so the hosts after it are never tried and the connect
fails. :func:`connect` tries the hosts one at a time, each bounded by its own timeout, as libpq
does: the URL's ``connect_timeout`` (seconds, per host, libpq's parameter), else
:data:`DEFAULT_HOST_TIMEOUT_S`.

A host is passed over when it cannot be reached in time, refuses or drops the connection, is
starting up or shutting down, does not match ``target_session_attrs`` (a standby when a
read-write server is wanted), or refuses the session with an error of its own: a standby that
has not replayed a ``CREATE DATABASE`` yet answers "database does not exist" while the primary
after it has the database (``migrate`` creates it, then connects to it at once). When no host
is usable, the last host's error is raised.

Every connection of the service goes through here: the pools of the recorder, the relay and the
API (as asyncpg's ``connect`` callback), ``migrate`` and its create-if-missing, the relay's
LISTEN connection, and the reachability check of the one-shot commands.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from bulk_recorder.url_checks import UnreadableUrl

log = logging.getLogger(__name__)

DEFAULT_HOST_TIMEOUT_S = 5.0

# Failures of one host: try the next one. PostgresError: any refusal of the session by the
# server (57P0x shutting down or starting, 3D000 a database a lagging standby lacks yet, ...).
_NEXT_HOST: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.TargetServerAttributeNotMatched,
    asyncpg.ConnectionDoesNotExistError,  # the server went away during the handshake
    asyncpg.PostgresError,
)


@dataclass(frozen=True)
class PgTarget:
    """A DATABASE_URL split into one single-host URL per host, and the per-host timeout."""

    host_dsns: tuple[str, ...]
    host_timeout_s: float

    @property
    def hosts(self) -> tuple[str, ...]:
        """``host:port`` of each host, in order (for logs: no user, no password)."""
        return tuple(urlsplit(d).netloc.rpartition("@")[2] for d in self.host_dsns)


def _split_hosts(hostspec: str) -> list[str]:
    """``a:1,[::1]:2,b`` -> ``['a:1', '[::1]:2', 'b']`` (commas inside brackets do not split)."""
    hosts: list[str] = []
    depth = 0
    current = ""
    for ch in hostspec:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            hosts.append(current)
            current = ""
        else:
            current += ch
    hosts.append(current)
    return hosts


def parse(dsn: str) -> PgTarget:
    """Split ``dsn``; raises ``ValueError`` for an empty host entry or a bad ``connect_timeout``.

    ``connect_timeout`` is removed from the single-host URLs: asyncpg does not know it and would
    send it to the server as a setting. Hosts given some other way (a ``host=`` query
    parameter, a service file, a Unix socket path) are left to asyncpg: one URL, as it is.
    """
    parts = urlsplit(dsn)
    query = parse_qsl(parts.query, keep_blank_values=True)
    timeout = DEFAULT_HOST_TIMEOUT_S
    kept: list[tuple[str, str]] = []
    for key, value in query:
        if key != "connect_timeout":
            kept.append((key, value))
            continue
        try:
            timeout = float(value)
        except ValueError:
            raise ValueError(f"connect_timeout must be seconds, not {value!r}") from None
        if not 0 < timeout <= 3600:
            raise ValueError(f"connect_timeout must be > 0 and <= 3600 seconds, not {value!r}")
    userinfo, at, hostspec = parts.netloc.rpartition("@")
    hosts = _split_hosts(hostspec) if hostspec else [""]
    if len(hosts) > 1 and any(not h.strip() for h in hosts):
        raise ValueError("an empty host in the host list")
    rebuilt = urlencode(kept) if len(kept) < len(query) else parts.query
    if len(hosts) == 1:  # kept as written, but for connect_timeout
        head, _, _ = dsn.partition("?")
        head = head.partition("#")[0]
        tail = ("?" + rebuilt if rebuilt else "") + ("#" + parts.fragment if parts.fragment else "")
        return PgTarget((head + tail,), timeout)
    dsns = tuple(
        urlunsplit((parts.scheme, userinfo + at + h.strip(), parts.path, rebuilt, parts.fragment))
        for h in hosts
    )
    return PgTarget(dsns, timeout)


async def connect(dsn: str | None = None, **kwargs: Any) -> asyncpg.Connection:
    """``asyncpg.connect`` over the hosts of ``dsn``, one at a time, each within its timeout.

    Keyword arguments go to ``asyncpg.connect`` (the pool passes its own); a ``timeout`` among
    them is replaced by the per-host one. Raises the last host's error when none is usable, and
    :class:`UnreadableUrl` for a DSN asyncpg cannot parse (its error quotes the DSN).
    """
    if dsn is None:
        raise ValueError("a DSN is needed")
    kwargs.pop("timeout", None)
    target = parse(dsn)
    error: BaseException | None = None
    for host_dsn, where in zip(target.host_dsns, target.hosts, strict=True):
        try:
            conn: asyncpg.Connection = await asyncpg.connect(
                host_dsn, timeout=target.host_timeout_s, **kwargs
            )
        except _NEXT_HOST as exc:
            error = exc
            if len(target.host_dsns) > 1:
                log.debug("PostgreSQL host %s passed over: %r", where, exc)
            continue
        except ValueError as exc:  # its int() of a port, its strict query parse
            if isinstance(exc, asyncpg.InterfaceError):  # its own words: a setting named
                raise
            raise UnreadableUrl("DATABASE_URL") from None
        return conn
    assert error is not None
    raise error
