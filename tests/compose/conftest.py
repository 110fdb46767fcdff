"""The compose pipeline on podman-compose, with stand-ins for the third-party images.

Skipped unless TEST_COMPOSE is set (`make test-compose` sets it after building the stand-ins).
One project a module, with a unique name, its own bridge network, volumes and pod, all removed at
the end. podman 4.3 without systemd runs no health check on its own (nor does podman-compose wait
on `service_healthy` with it): a thread here runs every container's health check every two
seconds, as an engine's timer would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.image import podman

ENABLED = os.environ.get("TEST_COMPOSE", "") not in ("", "0")
COMPOSE = os.environ.get("PODMAN_COMPOSE", "podman-compose")
OVERRIDE = Path(__file__).with_name("standins.yml")
SECRETS_SCRIPT = REPO / "deploy" / "compose" / "secrets.sh"
# The services run here: every one of docker-compose.yml but Grafana (no Debian package).
# `migrate` is one-shot: it runs to exit 0 before the recorder, relay and API start.
SERVICES = ("rabbitmq", "postgres", "migrate", "recorder", "relay", "api", "prometheus")
BUILT = ("migrate", "recorder", "relay", "api")
HEALTH_CHECKED = ("rabbitmq", "postgres", "recorder", "relay", "api")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if ENABLED:
        return
    skip = pytest.mark.skip(reason="compose tests: set TEST_COMPOSE (make test-compose)")
    for item in items:
        if "compose" in item.keywords:
            item.add_marker(skip)


@dataclass
class Pipeline:
    project: str
    env: dict[str, str]
    env_file: Path
    override: Path
    ports: dict[str, int]

    def compose(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        build = f"--format docker --network host --volume {CA_BUNDLE}:{CA_BUNDLE}:ro"
        argv = [
            COMPOSE,
            "-p",
            self.project,
            "--env-file",
            str(self.env_file),
            "--podman-build-args",
            build,
            "-f",
            str(REPO / "docker-compose.yml"),
            "-f",
            str(self.override),
            *args,
        ]
        env = dict(os.environ)
        env.setdefault("CONTAINERS_CONF", str(podman.CONF))
        return subprocess.run(
            argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def up(self, *services: str) -> None:
        """`up -d --build --no-deps SERVICES`: each started once what it depends on is met."""
        done = self.compose("up", "-d", "--build", "--no-deps", *services)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    def containers(self, service: str | None = None, *, exited: bool = False) -> list[str]:
        """The project's running containers (with ``exited``, those that have stopped too)."""
        argv = ["ps", "--format", "{{.Names}}", "--filter", f"label={_PROJECT}={self.project}"]
        if exited:
            argv.append("--all")
        if service:
            argv += ["--filter", f"label={_SERVICE}={service}"]
        return sorted(podman.podman(*argv).stdout.split())


_PROJECT = "com.docker.compose.project"
_SERVICE = "com.docker.compose.service"


def _render(ports: dict[str, int]) -> str:
    """The override with the test's ports in place of ${TEST_..._PORT:?}."""
    return re.sub(
        r"\$\{TEST_([A-Z]+)_PORT:\?\}",
        lambda m: str(ports[m.group(1).lower()]),
        OVERRIDE.read_text(),
    )


def _health_loop(pipeline: Pipeline, stop: threading.Event) -> None:
    while not stop.wait(2):
        for name in pipeline.containers():
            podman.podman("healthcheck", "run", name, check=False, timeout=60)


def _wait_healthy(pipeline: Pipeline, services: tuple[str, ...], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    states: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        states = {
            service: [health_status(name) for name in pipeline.containers(service)]
            for service in services
        }
        if all(s and all(h == "healthy" for h in s) for s in states.values()):
            return
        time.sleep(1)
    raise AssertionError(f"not healthy within {timeout:.0f} s: {states}")


def health_status(name: str) -> str:
    state = json.loads(podman.podman("inspect", name).stdout)[0]["State"]
    return str((state.get("Health") or state.get("Healthcheck") or {}).get("Status", ""))


def _remove(project: str) -> None:
    """Everything of the project, also what `down` does not know (scaled replicas)."""
    label = f"label={_PROJECT}={project}"
    ids = podman.podman("ps", "-aq", "--filter", label, check=False).stdout.split()
    if ids:
        podman.podman("rm", "--force", "--time=0", *ids, check=False)
    podman.podman("pod", "rm", "--force", "--ignore", f"pod_{project}", check=False)
    volumes = podman.podman(
        "volume", "ls", "-q", "--filter", f"label=io.podman.compose.project={project}", check=False
    ).stdout.split()
    if volumes:
        podman.podman("volume", "rm", "--force", *volumes, check=False)
    podman.podman("network", "rm", "--force", f"{project}_default", check=False)
    # The images podman-compose built under the project's name (their layers stay cached).
    built = [f"localhost/{project}_{service}" for service in BUILT]
    podman.podman("rmi", "--force", "--ignore", *built, check=False)


@pytest.fixture(scope="module")
def pipeline(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Pipeline]:
    failed_before = request.session.testsfailed
    where = tmp_path_factory.mktemp("compose")
    ports = {name: podman.fresh_port() for name in ("rabbitmq", "postgres", "api", "prometheus")}
    # The passwords as docker-compose.yml reads them: files written by its own script, here in
    # the test's directory (never the developer's ./secrets/).
    secret_dir = where / "secrets"
    subprocess.run(["sh", str(SECRETS_SCRIPT), str(secret_dir)], check=True, capture_output=True)
    env_file = where / ".env"
    env_file.write_text(f"BULK_RECORDER_SECRETS={secret_dir}\n")
    env = {"POSTGRES_PASSWORD": (secret_dir / "postgres-password").read_text().strip()}
    override = where / "standins.yml"
    override.write_text(_render(ports))
    project = f"brtest{uuid.uuid4().hex[:8]}"
    running = Pipeline(project, env, env_file, override, ports)
    stop = threading.Event()
    checker = threading.Thread(target=_health_loop, args=(running, stop), daemon=True)
    try:
        checker.start()
        # In the order of docker-compose.yml's depends_on conditions, which podman-compose does
        # not keep with podman 4.3 (it skips service_healthy before podman 4.6, and a
        # container --requires'ing an exited one-shot cannot be started): the services, healthy;
        # then `migrate`, to exit 0; then the project's services.
        running.up("rabbitmq", "postgres")
        _wait_healthy(running, ("rabbitmq", "postgres"))
        running.up("migrate")
        (migrate,) = running.containers("migrate", exited=True)
        code = podman.podman("wait", migrate, timeout=300).stdout.strip()
        assert code == "0", podman.podman("logs", migrate, check=False).stderr[-2000:]
        running.up("recorder", "relay", "api", "prometheus")
        yield running
    finally:
        stop.set()
        if checker.is_alive():
            checker.join(120)
        if request.session.testsfailed > failed_before:
            for name in running.containers():
                logs = podman.podman("logs", name, check=False)
                print(f"\n--- {name}:\n{(logs.stdout + logs.stderr)[-1500:]}")
        running.compose("down", "-t", "40", timeout=300)
        _remove(project)
