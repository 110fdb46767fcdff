"""Fixtures for the container tests: the image named by TEST_IMAGE, built by `make test-image`.

Skipped unless TEST_IMAGE is set, so that plain `pytest` (make test) needs no container engine.
Each test's containers get unique names and are removed at the end, with their logs printed when
the test failed. They talk to the machine's PostgreSQL and RabbitMQ over the host's loopback,
each test with its own database and queue names (tests/conftest.py), and every port is set
explicitly to a free one.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from settings import Settings
from tests.image import podman

IMAGE = os.environ.get("TEST_IMAGE", "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IMAGE:
        return
    skip = pytest.mark.skip(reason="container tests: set TEST_IMAGE (make test-image builds it)")
    for item in items:
        if "image" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def image() -> str:
    return IMAGE


def container_env(settings: Settings, role: str, **extra: str) -> dict[str, str]:
    """The environment of a ``role`` container with these settings: only what the test sets
    (the image's own defaults for the rest), loopback only, the role's port free and explicit."""
    env = {
        "DATABASE_URL": settings.database_url,
        "RABBITMQ_URL": settings.rabbitmq_url,
        "RABBITMQ_EXCHANGE": settings.rabbitmq_exchange,
        "RABBITMQ_QUEUE": settings.rabbitmq_queue,
        "API_HOST": "127.0.0.1",
        "METRICS_HOST": "127.0.0.1",
    }
    if role == "api":
        env["API_PORT"] = str(podman.fresh_port())
    elif role in ("consume", "relay"):
        env["METRICS_PORT"] = str(podman.fresh_port())
    env.update(extra)
    return env


Start = Callable[..., podman.Container]


@pytest.fixture
def containers(image: str, request: pytest.FixtureRequest) -> Iterator[Start]:
    """``start(role, env, *podman_args)``: a detached container of the image running ``role``."""
    started: list[podman.Container] = []
    failed_before = request.session.testsfailed

    def start(role: str, env: dict[str, str], *extra: str) -> podman.Container:
        container = podman.start(image, role, env, *extra)
        started.append(container)
        return container

    yield start
    failed = request.session.testsfailed > failed_before
    for container in started:
        if failed:
            print(f"\n--- {container.role} ({container.name}) logs:\n{container.logs()[-4000:]}")
        container.remove()
