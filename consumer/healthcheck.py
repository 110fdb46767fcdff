"""``bulk-recorder healthcheck``: the container's health check, whichever role the container runs.

The image has one HEALTHCHECK for every role. It finds the role the container runs (the command
of process 1, or of the first ``bulk-recorder`` process when an init runs as process 1) and asks
that role's own ``/healthz`` (alive: a database or broker outage does not make it unhealthy, so
an engine or autoheal never replaces a process that waits for its services), or ``/readyz``
with ``--ready``: ``consume`` and ``relay`` on METRICS_HOST:METRICS_PORT (the role's default
port when METRICS_PORT is unset, as the role itself resolves it), ``api`` on API_HOST:API_PORT.
Exit 0 when it answers 200, else 1 (a container engine reads 0 as healthy and 1 as unhealthy; 2
is reserved), with one line that says which port answered what.

It runs every 10 s in every container, so it imports only the standard library: it reads the
four settings it needs from the environment it is given, by the rules of ``settings.Settings``
(tests/unit/test_healthcheck_cost.py holds it to both).
"""

from __future__ import annotations

import argparse
import math
import os
import socket
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from bulk_recorder.exceptions import EXIT_SETTINGS, BulkRecorderError

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


# The roles' default ports, as settings.DEFAULT_METRICS_PORTS and Settings.api_port give them.
_DEFAULT_METRICS_PORTS = {"consume": 9464, "relay": 9465}
_DEFAULT_API_PORT = 8080
_DEFAULT_HOST = "127.0.0.1"
# Enough for the status line, the headers and the start of the body; the rest is not read.
_ANSWER_BYTES = 8192


def add_parser(sub: Any) -> None:
    health = sub.add_parser(
        "healthcheck",
        help="the container's health check: exit 0 when the role it runs (consume, relay or "
        "api) answers its own /healthz (alive), or /readyz with --ready, else 1",
    )
    health.add_argument(
        "--ready",
        action="store_true",
        help="ask /readyz (connected to what the role needs) instead of /healthz (alive)",
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
        name = os.path.basename(word)
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
            return _command_role(args[index + 1 :]) if os.path.basename(arg) == _SCRIPT else None
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


def _cmdline(proc: str | os.PathLike[str], pid: int) -> list[str]:
    try:
        with open(os.path.join(proc, str(pid), "cmdline"), "rb") as file:
            raw = file.read()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def find_role(
    pid: int | None = None, proc: str | os.PathLike[str] = "/proc"
) -> tuple[int, str] | None:
    """(pid, role) of the process to check: ``pid`` if given, else process 1, else the
    lowest-numbered bulk-recorder role process (when an init such as catatonit is process 1)."""
    if pid is not None:
        role = role_of(_cmdline(proc, pid))
        return (pid, role) if role else None
    role = role_of(_cmdline(proc, 1))
    if role:
        return 1, role
    pids = sorted(int(name) for name in os.listdir(proc) if name.isdigit())
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


class ProbeSettingsError(BulkRecorderError, ValueError):
    """A setting the check needs is malformed; the message names the variable (the check
    prints it and exits 1, as an engine reserves 2)."""

    exit_code = EXIT_SETTINGS


class ProbeSettings(NamedTuple):
    """The four settings of ``settings.Settings`` that say where a role listens."""

    metrics_host: str = _DEFAULT_HOST
    metrics_port: int | None = None  # unset: the role's own default
    api_host: str = _DEFAULT_HOST
    api_port: int = _DEFAULT_API_PORT

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ProbeSettings:
        """Read as ``Settings`` reads them: names in any case, a port an integer in range."""
        found = {name.lower(): value for name, value in environ.items()}
        metrics_port = found.get("metrics_port")
        return cls(
            metrics_host=_host("METRICS_HOST", found.get("metrics_host", _DEFAULT_HOST)),
            metrics_port=None if metrics_port is None else _port("METRICS_PORT", metrics_port, 0),
            api_host=_host("API_HOST", found.get("api_host", _DEFAULT_HOST)),
            api_port=_port("API_PORT", found.get("api_port", str(_DEFAULT_API_PORT)), 1),
        )


def _host(variable: str, text: str) -> str:
    if not text:
        raise ProbeSettingsError(f"invalid settings: {variable}: should not be empty")
    return text


def _port(variable: str, text: str, lowest: int) -> int:
    try:  # as pydantic's lax int: white space, a sign, "_" and a zero fraction ("9464.0") pass
        number: float = int(text) if "." not in text else float(text)
    except ValueError:
        number = math.nan
    whole = text.isascii() and math.isfinite(number) and number == int(number)
    if not whole or not lowest <= number <= 65_535:
        raise ProbeSettingsError(
            f"invalid settings: {variable}: should be an integer from {lowest} to 65535 "
            f"(got {text!r})"
        )
    return int(number)


def target(settings: ProbeSettings, role: str) -> tuple[str, int, str]:
    """(host, port, variable) where ``role`` serves /healthz and /readyz, as the role resolves
    its settings (``Settings.for_role``)."""
    if role == "api":
        return _probe_host(settings.api_host), settings.api_port, "API_PORT"
    port = settings.metrics_port
    if port is None:
        port = _DEFAULT_METRICS_PORTS.get(role, 0)
    return _probe_host(settings.metrics_host), port, "METRICS_PORT"


def check(
    settings: ProbeSettings, pid: int | None = None, timeout_s: float = 2.0, ready: bool = False
) -> tuple[int, str]:
    """(exit code, one line): is the role that this container runs alive (or, with ``ready``,
    ready) on its own port?"""
    found = find_role(pid)
    if found is None:
        where = f"process {pid}" if pid is not None else "this container"
        return UNHEALTHY, f"unhealthy: {where} runs no bulk-recorder role ({', '.join(ROLES)})"
    pid, role = found
    host, port, variable = target(settings, role)
    path = "/readyz" if ready else "/healthz"
    if not port:
        return UNHEALTHY, f"unhealthy: {role} serves no {path} ({variable}=0)"
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}{path}"
    try:
        status, detail = _get(host, port, path, timeout_s)
    except (OSError, ValueError) as exc:
        return UNHEALTHY, f"unhealthy: {role} (pid {pid}) at {url}: {exc or type(exc).__name__}"
    state = "healthy" if status == 200 else "unhealthy"
    line = f"{state}: {role} (pid {pid}) at {url} answered {status} {detail}".rstrip()
    return (HEALTHY if status == 200 else UNHEALTHY), line


def _get(host: str, port: int, path: str, timeout_s: float) -> tuple[int, str]:
    """(status, the first 200 characters of the body) of ``GET path``, HTTP/1.0 on a plain
    socket: both servers answer it and close, and http.client would double the check's imports."""
    answer = b""
    with socket.create_connection((host, port), timeout=timeout_s) as conn:
        conn.sendall(f"GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n".encode())
        while len(answer) < _ANSWER_BYTES and (chunk := conn.recv(_ANSWER_BYTES)):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    words = head.split(b"\r\n", 1)[0].split()
    if len(words) < 2 or not words[0].startswith(b"HTTP/") or not words[1].isdigit():
        raise ValueError(f"not an HTTP answer: {head[:80]!r}")
    return int(words[1]), body[:200].decode(errors="replace").strip()


def cmd_healthcheck(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    """Exit 0 or 1 only: a container engine reads 1 as unhealthy and reserves 2, so a bad
    setting is one line and exit 1."""
    try:
        settings = ProbeSettings.from_environ(environ)
    except ProbeSettingsError as exc:
        print(f"unhealthy: {exc}")
        return UNHEALTHY
    code, line = check(settings, pid=args.pid, timeout_s=args.timeout, ready=args.ready)
    print(line)
    return code
