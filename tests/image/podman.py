"""The container engine for tests/image: podman (Debian's), with this folder's containers.conf.

Every container runs on the host's network (loopback only: the tests set API_HOST and
METRICS_HOST to 127.0.0.1 and every port explicitly), as the image's non-root user, with a
read-only root filesystem and no capabilities.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONF = Path(__file__).with_name("containers.conf")

_GIVEN: set[int] = set()
_RANDOM = random.Random()


def fresh_port() -> int:
    """A free port on the loopback, below the kernel's ephemeral range (32768 and up, where every
    outgoing connection of the machine takes its local port, and where free_port() finds its
    ports), never handed out twice in a session: a port is free only until its container binds
    it, seconds later. Clear of the ports other work here keeps (5790-5799, 25790-25799)."""
    while True:
        port = _RANDOM.randrange(26_000, 32_768)
        if port in _GIVEN:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port


def podman(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(CONF))
    done = subprocess.run(
        ["podman", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done


def unique_name(what: str) -> str:
    return f"brtest-{what}-{uuid.uuid4().hex[:10]}"


# What every container of the tests gets: the image's own user, nothing writable but a tmpfs.
CONFINED = (
    "--network=host",
    "--read-only",
    "--read-only-tmpfs=false",
    "--tmpfs=/tmp:rw,size=16m,mode=1777",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
)


def env_args(env: dict[str, str]) -> list[str]:
    return [f"--env={name}={value}" for name, value in env.items()]


def run_once(image: str, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a one-shot command of the image (``migrate``, ``api-key create``) to its end."""
    name = unique_name(argv[0])
    try:
        return podman(
            "run", "--rm", f"--name={name}", *CONFINED, *env_args(env), image, *argv, check=False
        )
    finally:
        podman("rm", "--force", "--time=0", "--ignore", name, check=False)


@dataclass
class Container:
    name: str
    role: str

    def inspect(self) -> dict[str, Any]:
        return dict(json.loads(podman("inspect", self.name).stdout)[0])

    def logs(self) -> str:
        done = podman("logs", self.name, check=False)
        return done.stdout + done.stderr

    def running(self) -> bool:
        return bool(self.inspect()["State"]["Running"])

    def healthcheck(self) -> tuple[int, str]:
        """Run the image's HEALTHCHECK now, as the engine would; (exit code, what it said)."""
        done = podman("healthcheck", "run", self.name, check=False, timeout=60)
        return done.returncode, (done.stdout + done.stderr).strip()

    def health_status(self) -> str:
        state = self.inspect()["State"]
        health = state.get("Health") or state.get("Healthcheck") or {}
        return str(health.get("Status", ""))

    def last_health_output(self) -> str:
        state = self.inspect()["State"]
        health = state.get("Health") or state.get("Healthcheck") or {}
        log = health.get("Log") or []
        return str(log[-1].get("Output", "")) if log else ""

    def exec(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return podman("exec", self.name, *argv, check=False)

    def stop(self, grace_s: float) -> tuple[float, int]:
        """SIGTERM (the image's STOPSIGNAL), SIGKILL after ``grace_s``; (seconds, exit code)."""
        started = time.monotonic()
        podman("stop", f"--time={int(grace_s)}", self.name, timeout=grace_s + 60)
        took = time.monotonic() - started
        return took, int(self.inspect()["State"]["ExitCode"])

    def remove(self) -> None:
        podman("rm", "--force", "--time=0", "--ignore", self.name, check=False)


def start(image: str, role: str, env: dict[str, str], *extra: str) -> Container:
    name = unique_name(role)
    podman("run", "--detach", f"--name={name}", *CONFINED, *extra, *env_args(env), image, role)
    return Container(name, role)
