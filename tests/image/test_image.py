"""The image, built from the Dockerfile and run with podman: every role end to end, confined.

`make test-image` builds the image (on a stand-in base where no registry is reachable, see
tests/image/base.sh) and runs these with TEST_IMAGE set; plain `pytest` skips them. Each role
runs as the image's non-root user with a read-only root filesystem, on the host's loopback, with
the machine's RabbitMQ and PostgreSQL.
"""

from __future__ import annotations

import json
import re
import subprocess
from decimal import Decimal
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml

import bulk_recorder
from consumer.tools.generator import Generator
from settings import Settings
from tests.compiled import compiled_sources, module_name
from tests.conftest import REPO, SettingsFactory, wait_for
from tests.image import podman
from tests.image.conftest import Start, container_env
from tests.integration.producer_support import balances, expected_balances

pytestmark = [pytest.mark.image, pytest.mark.postgres, pytest.mark.rabbitmq]

IMAGE_UID = "10001"


def _grace_s(role: str = "consume") -> float:
    """The compose file's stop_grace_period for ``role`` (each is its role's stop budget plus
    a margin: tests/ops/test_compose.py)."""
    service = {"consume": "recorder"}.get(role, role)
    period = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"][service]
    match = re.fullmatch(r"(\d+)s", period["stop_grace_period"])
    assert match, "stop_grace_period is not in seconds"
    return float(match.group(1))


def _migrated(image: str, settings: Settings) -> None:
    done = podman.run_once(image, ["migrate"], container_env(settings, "migrate"))
    assert done.returncode == 0, done.stdout + done.stderr


def _json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of a container's log as JSON; fails on the first line that is not."""
    out = []
    for line in text.splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                raise AssertionError(f"not a JSON line: {line!r}\nin:\n{text}") from None
    return out


async def _healthy(container: podman.Container, timeout: float = 90) -> str:
    """Run the image's health check until it passes; the line it printed."""
    said: list[str] = []

    def passes() -> bool:
        assert container.running(), container.logs()
        code, output = container.healthcheck()
        said.append(f"{code} {output} | {container.last_health_output()}")
        return code == 0

    try:
        await wait_for(passes, timeout=timeout, interval=1)
    except AssertionError:
        raise AssertionError(f"never healthy; last: {said[-3:]}") from None
    return container.last_health_output()


@pytest.mark.parametrize("role", ["consume", "relay", "api"])
async def test_each_role_is_healthy_on_its_own_port_as_non_root_on_a_read_only_root(
    image: str, make_settings: SettingsFactory, containers: Start, role: str
) -> None:
    settings = make_settings()
    if role != "consume":
        _migrated(image, settings)
    env = container_env(settings, role)
    port = env["API_PORT" if role == "api" else "METRICS_PORT"]
    container = containers(role, env)

    said = await _healthy(container)
    assert f"healthy: {role} " in said, said
    assert f":{port}/healthz answered 200" in said, said
    assert container.health_status() == "healthy"

    state = container.inspect()
    assert state["Config"]["User"] == f"{IMAGE_UID}:{IMAGE_UID}"
    assert state["HostConfig"]["ReadonlyRootfs"] is True
    uid = container.exec("python", "-c", "import os; print(os.getuid(), os.getgid())")
    assert uid.stdout.split() == [IMAGE_UID, IMAGE_UID], uid.stderr
    write = container.exec("python", "-c", "open('/opt/venv/written', 'w')")
    assert write.returncode != 0
    assert "Read-only file system" in write.stderr, write.stderr

    grace = _grace_s(role)
    took, code = container.stop(grace)
    logs = container.logs()
    assert code == 0, logs
    assert took < grace, f"SIGTERM took {took:.1f} s, the grace period is {grace:.0f} s"
    lines = _json_lines(logs)
    assert lines, "the container logged nothing"
    assert "Traceback" not in logs, logs


@pytest.mark.parametrize("role", ["consume", "relay", "api"])
async def test_each_roles_health_check_is_healthy_while_the_role_is_alive_but_not_ready(
    image: str, make_settings: SettingsFactory, containers: Start, role: str
) -> None:
    """The role serves its port, but the service it needs refuses it: /readyz is 503, and the
    image's health check (liveness, /healthz) passes: an outage never marks every container
    unhealthy. `healthcheck --ready` fails (and not on a port that nothing listens on)."""
    nowhere = podman.fresh_port()
    if role == "api":
        settings = make_settings(database_url=f"postgresql://postgres@127.0.0.1:{nowhere}/x")
    else:
        settings = make_settings(rabbitmq_url=f"amqp://guest:guest@127.0.0.1:{nowhere}/")
    env = container_env(settings, role)
    port = env["API_PORT" if role == "api" else "METRICS_PORT"]
    container = containers(role, env)
    said: list[tuple[int, str]] = []

    def answered() -> bool:
        assert container.running(), container.logs()
        ready = container.exec("bulk-recorder", "healthcheck", "--ready")
        said.append((ready.returncode, (ready.stdout + ready.stderr).strip()))
        return " answered " in said[-1][1]

    await wait_for(answered, timeout=90, interval=1)
    code, line = said[-1]
    assert code == 1, line
    assert f"unhealthy: {role} " in line, line
    assert f":{port}/readyz answered 503" in line, line
    code, _ = container.healthcheck()
    line = container.last_health_output()
    assert code == 0, line
    assert f":{port}/healthz answered 200" in line, line
    assert container.health_status() == "healthy", line


async def test_an_api_job_goes_through_the_relay_and_recorder_containers_exactly(
    image: str, make_settings: SettingsFactory, containers: Start, database_url: str
) -> None:
    settings = make_settings()
    _migrated(image, settings)
    made = podman.run_once(
        image, ["api-key", "create", "image-test"], container_env(settings, "api-key")
    )
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key, made.stderr
    assert "\n" not in key, made.stdout

    roles = {role: container_env(settings, role) for role in ("consume", "relay", "api")}
    running = {role: containers(role, env) for role, env in roles.items()}
    for container in running.values():
        await _healthy(container)

    gen = Generator.create(seed=19)
    annotations = [gen.credit_annotation() for _ in range(300)]
    transactions = [gen.transaction() for _ in range(40)]
    base = f"http://127.0.0.1:{roles['api']['API_PORT']}"
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
        body = b"".join(json.dumps(a).encode() + b"\n" for a in annotations)
        job = await client.post(
            "/v1/credit-annotation-jobs",
            content=body,
            headers={"Content-Type": "application/x-ndjson"},
        )
        assert job.status_code == 202, job.text
        for tx in transactions:
            answer = await client.post("/v1/transactions", json=tx)
            assert answer.status_code == 202, answer.text
        refused = await client.post(
            "/v1/transactions", json=transactions[0], headers={"Authorization": "Bearer wrong"}
        )
        assert refused.status_code == 401, refused.text

    conn = await asyncpg.connect(database_url)
    try:

        async def recorded() -> bool:
            done_a = await conn.fetchval("SELECT count(*) FROM credit_annotations")
            done_t = await conn.fetchval("SELECT count(*) FROM transactions")
            return bool(done_a >= len(annotations) and done_t >= len(transactions))

        await wait_for(recorded, timeout=120, interval=0.5)
        ann_ids = {r[0] for r in await conn.fetch("SELECT id::text FROM credit_annotations")}
        tx_ids = {r[0] for r in await conn.fetch("SELECT id::text FROM transactions")}
        got_balances = await balances(conn)
        left = await conn.fetchval("SELECT count(*) FROM outbox")
    finally:
        await conn.close()
    assert ann_ids == {a["id"] for a in annotations}
    assert tx_ids == {t["id"] for t in transactions}
    want: dict[tuple[str, str], Decimal] = expected_balances(transactions)
    assert got_balances == want
    assert left == 0

    for role, container in running.items():
        grace = _grace_s(role)
        took, code = container.stop(grace)
        assert (code, took < grace) == (0, True), f"{role}: exit {code} after {took:.1f} s"
        _json_lines(container.logs())


def _started_lines(container: podman.Container, pattern: str) -> list[dict[str, Any]]:
    return [line for line in _json_lines(container.logs()) if pattern in str(line)]


async def test_the_contracts_settings_take_effect_in_the_container(
    image: str, make_settings: SettingsFactory, containers: Start, database_url: str
) -> None:
    """BULK_RECORDER_SIZE and BULK_RECORDER_ENABLED shape the recorder (its start-up lines say
    how); RABBITMQ_TRANSACTION_ASYNC=false makes the API write a transaction itself (201), with
    no relay or recorder running."""
    settings = make_settings()
    _migrated(image, settings)
    sized = containers("consume", container_env(settings, "consume", BULK_RECORDER_SIZE="7"))
    single = containers(
        "consume", container_env(settings, "consume", BULK_RECORDER_ENABLED="false")
    )
    direct = containers(
        "consume", container_env(settings, "consume", RABBITMQ_TRANSACTION_ASYNC="false")
    )
    for container in (sized, single, direct):
        await _healthy(container)
    assert _started_lines(sized, "Bulk mode is ACTIVE")
    assert _started_lines(sized, "size=7 "), sized.logs()
    assert _started_lines(single, "Bulk mode is INACTIVE (BULK_RECORDER_ENABLED=false)")
    assert _started_lines(single, "size=1 "), single.logs()
    assert _started_lines(direct, "Bulk mode is INACTIVE (RABBITMQ_TRANSACTION_ASYNC=false)")
    for container in (sized, single, direct):
        container.stop(_grace_s())

    sync_env = container_env(settings, "api", RABBITMQ_TRANSACTION_ASYNC="false", API_AUTH="off")
    api = containers("api", sync_env)
    await _healthy(api)
    assert _started_lines(api, "transactions sync (201)"), api.logs()
    tx = Generator.create(seed=7).transaction()
    async with httpx.AsyncClient(timeout=30) as client:
        answer = await client.post(
            f"http://127.0.0.1:{sync_env['API_PORT']}/v1/transactions", json=tx
        )
    assert answer.status_code == 201, answer.text
    conn = await asyncpg.connect(database_url)
    try:
        stored = await conn.fetchval(
            "SELECT id::text FROM transactions WHERE id = $1::uuid", tx["id"]
        )
        queued = await conn.fetchval("SELECT count(*) FROM outbox")
    finally:
        await conn.close()
    assert (stored, queued) == (tx["id"], 0)


def test_the_image_is_the_dockerfiles_with_its_health_check_kept(image: str) -> None:
    """Built with --format docker: the HEALTHCHECK survives (OCI images drop it)."""
    config = json.loads(podman.podman("image", "inspect", image).stdout)[0]
    check = config.get("Healthcheck") or {}
    assert check.get("Test") == ["CMD", "bulk-recorder", "healthcheck"], check
    dockerfile = (REPO / "Dockerfile").read_text()
    assert 'CMD ["bulk-recorder", "healthcheck"]' in dockerfile
    assert "9464/healthz" not in dockerfile


def test_the_machines_ca_bundle_used_by_the_build_is_in_no_layer(image: str) -> None:
    """The build mounts the machine's CA bundle for pip (TLS to the index goes through it here);
    the image keeps its base's own bundle."""
    host = Path("/etc/ssl/certs/ca-certificates.crt")
    if not host.exists():
        pytest.skip("no CA bundle on this machine")
    done = podman.podman(
        "run", "--rm", "--network=none", "--entrypoint=cat", image, str(host), check=False
    )
    assert done.stdout.encode() != host.read_bytes()


def test_the_image_is_labelled_with_its_version_revision_licence_and_source(image: str) -> None:
    """The OCI labels of the Dockerfile, with the version run.sh passes (--build-arg VERSION)."""
    config = json.loads(podman.podman("image", "inspect", image).stdout)[0]
    labels = config.get("Labels") or config.get("Config", {}).get("Labels") or {}
    assert labels.get("org.opencontainers.image.version") == bulk_recorder.__version__, labels
    assert labels.get("org.opencontainers.image.title") == "bulk-recorder", labels
    assert labels.get("org.opencontainers.image.licenses") == "Apache-2.0", labels
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert labels.get("org.opencontainers.image.revision") == head.stdout.strip(), labels
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", labels["org.opencontainers.image.created"]
    )
    assert labels.get("org.opencontainers.image.source", "").startswith("https://"), labels
    # the image's own build says the same revision as its label
    shown = podman.podman("run", "--rm", "--network=none", image, "--version").stdout
    assert (
        shown.strip()
        == f"bulk-recorder {bulk_recorder.__version__} (revision {head.stdout.strip()})"
    )


def test_the_record_rules_run_compiled_in_the_image(image: str) -> None:
    """The build stage compiles setup.py's modules; a build that could not (no compiler) would
    only warn and ship them interpreted, the image working but slower than measured."""
    modules = [module_name(source) for source in compiled_sources()]
    script = f"import importlib; print(*(importlib.import_module(m).__file__ for m in {modules!r}))"
    done = podman.podman(
        "run", "--rm", "--network=none", "--entrypoint=python", image, "-c", script
    )
    files = done.stdout.split()
    assert len(files) == len(modules), done.stdout
    assert all(f.endswith(".so") for f in files), files
