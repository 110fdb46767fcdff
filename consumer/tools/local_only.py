"""``publish`` and ``demo`` write generated records: to this machine's services only, unless
``--allow-remote``. A load test pointed at production by a stale ``RABBITMQ_URL`` is refused
before anything is reached (exit 2, naming the setting)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from bulk_recorder.exceptions import EXIT_SETTINGS, BulkRecorderError
from bulk_recorder.infra import pg_hosts
from bulk_recorder.infra.broker import split_urls
from settings import Settings

# The commands that write generated records: on this machine's services unless told otherwise.
LOAD_COMMANDS = ("publish", "demo")


class RemoteTarget(BulkRecorderError):
    """``publish`` or ``demo`` pointed at another host without ``--allow-remote``."""

    exit_code = EXIT_SETTINGS


def refuse_remote_targets(command: str, settings: Settings) -> None:
    """Raise :class:`RemoteTarget` naming the setting when a target host is not loopback."""
    hosts: list[tuple[str, str | None]] = [
        ("RABBITMQ_URL", urlsplit(url).hostname) for url in split_urls(settings.rabbitmq_url)
    ]
    if command == "demo":
        for hostport in pg_hosts.parse(settings.database_url).hosts:
            hosts.append(("DATABASE_URL", urlsplit("//" + hostport).hostname))
    for variable, host in hosts:
        if host and not _loopback(host):  # no host: a Unix socket, or the local default
            raise RemoteTarget(
                f"{variable} points at {host}, not this machine; test records go to the "
                "local services only (pass --allow-remote to write them there)"
            )


def _loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
