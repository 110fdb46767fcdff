"""``bulk-recorder healthcheck``: the container's health check, whichever role the container runs.

The image has one HEALTHCHECK for every role. It finds the role the container runs (the command
of process 1, or of the first ``bulk-recorder`` process when an init runs as process 1) and asks
that role's own ``/readyz``: ``consume`` and ``relay`` on METRICS_HOST:METRICS_PORT (the role's
default port when METRICS_PORT is unset, as the role itself resolves it), ``api`` on
API_HOST:API_PORT. Exit 0 when it answers 200, else 1 (a container engine reads 0 as healthy and
1 as unhealthy; 2 is reserved), with one line that says which port answered what.
"""

from __future__ import annotations

import argparse
import http.client
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from settings import Settings

HEALTHY = 0
UNHEALTHY = 1

# The long-running commands, each with a /readyz of its own.
ROLES = ("consume", "relay", "api")
# The console script; ``python -m consumer.cli ROLE`` and ``python -m consumer`` (which runs
# ``consume``: docs/reference.md) are read from the interpreter's own options.
_SCRIPT = "bulk-recorder"
_MODULE_ROLES = {"consumer": "consume"}
_MODULE_CLI = "consumer.cli"
# The interpreter's options that take a value (``-X dev`` or ``-Xdev``); ``-c`` and ``-m`` end them.
_PYTHON_VALUED = ("-X", "-W", "-c", "-m")


def add_parser(sub: Any) -> None:
    health = sub.add_parser(
        "healthcheck",
        help="the container's health check: exit 0 when the role it runs (consume, relay or "
        "api) answers its own /readyz, else 1",
    )
    health.add_argument(
        "--pid",
        type=_pid,
        default=None,
        help="check the role that this process runs (default: process 1, else the first "
        "bulk-recorder role process)",
    )
    health.add_argument("--timeout", type=float, default=2.0, help="seconds for the answer")


def _pid(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def role_of(argv: Sequence[str]) -> str | None:
    """The role that the command line ``argv`` runs, or None when it is no bulk-recorder role.

    ``bulk-recorder relay --lanes 2`` (or ``python /venv/bin/bulk-recorder relay``, or
    ``python -m consumer.cli relay``) runs ``relay``; ``python -m consumer`` runs ``consume``;
    ``bulk-recorder migrate`` runs no role. An init's words before the program are skipped.
    """
    for index, word in enumerate(argv):
        name = Path(word).name
        if name == _SCRIPT:
            return _command_role(argv[index + 1 :])
        if name.startswith("python"):
            return _python_role(argv[index + 1 :])
    return None


def _command_role(args: Sequence[str]) -> str | None:
    return args[0] if args and args[0] in ROLES else None


def _python_role(args: Sequence[str]) -> str | None:
    """The role of ``python ARGS``: its options first, then ``-m MODULE``, ``-c`` or a script."""
    index = 0
    while index < len(args):
        arg = args[index]
        if not arg.startswith("-") or arg == "-":  # the script, then its own arguments
            return _command_role(args[index + 1 :]) if Path(arg).name == _SCRIPT else None
        option, value = arg[:2], arg[2:]
        index += 1
        if option in _PYTHON_VALUED and not arg.startswith("--") and not value:
            value = args[index] if index < len(args) else ""
            index += 1
        if option == "-c":
            return None
        if option == "-m":
            if value == _MODULE_CLI:
                return _command_role(args[index:])
            return _MODULE_ROLES.get(value)
    return None


def _cmdline(proc: Path, pid: int) -> list[str]:
    try:
        raw = (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def find_role(pid: int | None = None, proc: Path = Path("/proc")) -> tuple[int, str] | None:
    """(pid, role) of the process to check: ``pid`` if given, else process 1, else the
    lowest-numbered bulk-recorder role process (when an init such as catatonit is process 1)."""
    if pid is not None:
        role = role_of(_cmdline(proc, pid))
        return (pid, role) if role else None
    role = role_of(_cmdline(proc, 1))
    if role:
        return 1, role
    pids = sorted(int(entry.name) for entry in proc.iterdir() if entry.name.isdigit())
    for candidate in pids:
        if candidate != os.getpid() and (role := role_of(_cmdline(proc, candidate))):
            return candidate, role
    return None


def _probe_host(host: str) -> str:
    """Where to reach a server listening on ``host`` from inside its own network namespace."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "::1"
    return host


def target(settings: Settings, role: str) -> tuple[str, int, str]:
    """(host, port, variable) of ``role``'s /readyz, from the settings that role resolves."""
    resolved = settings.for_role(role)
    if role == "api":
        return _probe_host(resolved.api_host), resolved.api_port, "API_PORT"
    return _probe_host(resolved.metrics_host), resolved.metrics_port or 0, "METRICS_PORT"


def check(settings: Settings, pid: int | None = None, timeout_s: float = 2.0) -> tuple[int, str]:
    """(exit code, one line): is the role that this container runs ready on its own port?"""
    found = find_role(pid)
    if found is None:
        where = f"process {pid}" if pid is not None else "this container"
        return UNHEALTHY, f"unhealthy: {where} runs no bulk-recorder role ({', '.join(ROLES)})"
    pid, role = found
    host, port, variable = target(settings, role)
    if not port:
        return UNHEALTHY, f"unhealthy: {role} serves no /readyz ({variable}=0)"
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/readyz"
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        connection.request("GET", "/readyz")
        response = connection.getresponse()
        detail = response.read(200).decode(errors="replace").strip()
    except (OSError, http.client.HTTPException) as exc:
        return UNHEALTHY, f"unhealthy: {role} (pid {pid}) at {url}: {exc or type(exc).__name__}"
    finally:
        connection.close()
    state = "healthy" if response.status == 200 else "unhealthy"
    line = f"{state}: {role} (pid {pid}) at {url} answered {response.status} {detail}".rstrip()
    return (HEALTHY if response.status == 200 else UNHEALTHY), line
