"""The pipeline of docker-compose.yml up with podman-compose: every service healthy, a job in
through the API with a key made as the README says, two recorders sharing the queue, and every
Prometheus scrape target up.

RabbitMQ, PostgreSQL and Prometheus run from stand-ins built from Debian's packages
(tests/compose/standins.yml); Grafana is not run. The project's services are built and run as
docker-compose.yml defines them, on podman's bridge network; only ports on 127.0.0.1 are
published, to ports the test chose.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import asyncpg
import httpx
import pytest

from consumer.tools.generator import Generator
from tests.compose.conftest import HEALTH_CHECKED, Pipeline, health_status
from tests.conftest import wait_for
from tests.image import podman
from tests.integration.producer_support import balances, expected_balances

pytestmark = [pytest.mark.compose]


async def _all_healthy(pipeline: Pipeline, services: tuple[str, ...], timeout: float = 180) -> None:
    seen: dict[str, str] = {}

    def healthy() -> bool:
        for service in services:
            names = pipeline.containers(service)
            seen[service] = ",".join(f"{n}={health_status(n)}" for n in names) or "no container"
            if not names or any(health_status(n) != "healthy" for n in names):
                return False
        return True

    try:
        await wait_for(healthy, timeout=timeout, interval=2)
    except AssertionError:
        raise AssertionError(f"not all healthy: {seen}") from None


def _database_url(pipeline: Pipeline) -> str:
    password = pipeline.env["POSTGRES_PASSWORD"]
    port = pipeline.ports["postgres"]
    return f"postgresql://postgres:{password}@127.0.0.1:{port}/bulk_recorder"


def _api(pipeline: Pipeline, key: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{pipeline.ports['api']}",
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


async def test_every_service_is_healthy_and_publishes_on_the_loopback_only(
    pipeline: Pipeline,
) -> None:
    await _all_healthy(pipeline, HEALTH_CHECKED)
    for name in pipeline.containers():
        bindings = json.loads(podman.podman("inspect", name).stdout)[0]["HostConfig"]
        for binds in (bindings.get("PortBindings") or {}).values():
            assert all(b["HostIp"] == "127.0.0.1" for b in binds or []), (name, binds)
    async with httpx.AsyncClient(timeout=10) as client:
        ready = await client.get(f"http://127.0.0.1:{pipeline.ports['prometheus']}/-/ready")
    assert ready.status_code == 200, ready.text


_KEYS: dict[str, str] = {}


def _key(pipeline: Pipeline) -> str:
    """An API key made as the README says, through the owner's one-shot service (the API's own
    role may only read keys): `docker compose run --rm migrate api-key create shop`."""
    if "shop" not in _KEYS:
        made = pipeline.compose("run", "--rm", "--no-deps", "migrate", "api-key", "create", "shop")
        assert made.returncode == 0, made.stderr[-2000:]
        keys = [line for line in made.stdout.split() if line.startswith("brk_")]
        assert len(keys) == 1, made.stdout
        _KEYS["shop"] = keys[0]
    return _KEYS["shop"]


async def test_the_services_connect_as_their_own_least_privilege_logins(
    pipeline: Pipeline,
) -> None:
    """`migrate` ran as the owner and exited 0; every database session of the recorder, the
    relay and the API is its own login role, none the superuser."""
    await _all_healthy(pipeline, HEALTH_CHECKED)
    (migrate,) = pipeline.containers("migrate", exited=True)
    state = json.loads(podman.podman("inspect", migrate).stdout)[0]["State"]
    assert (state["Status"], state["ExitCode"]) == ("exited", 0), state
    conn = await asyncpg.connect(_database_url(pipeline))
    try:
        users = await conn.fetch(
            "SELECT usename, count(*) FROM pg_stat_activity "
            "WHERE datname = 'bulk_recorder' AND pid <> pg_backend_pid() GROUP BY usename"
        )
        member_of = await conn.fetch(
            "SELECT m.rolname AS login, r.rolname AS role, m.rolsuper "
            "FROM pg_auth_members a JOIN pg_roles r ON r.oid = a.roleid "
            "JOIN pg_roles m ON m.oid = a.member WHERE m.rolname LIKE '%_login'"
        )
    finally:
        await conn.close()
    assert {row["usename"] for row in users} == {"recorder_login", "relay_login", "api_login"}
    assert {(r["login"], r["role"], r["rolsuper"]) for r in member_of} == {
        ("recorder_login", "bulk_recorder", False),
        ("relay_login", "bulk_relay", False),
        ("api_login", "bulk_api", False),
    }


async def test_a_job_in_through_the_api_with_a_readme_key_is_recorded_exactly(
    pipeline: Pipeline,
) -> None:
    await _all_healthy(pipeline, HEALTH_CHECKED)
    key = _key(pipeline)
    gen = Generator.create(seed=404)
    annotations = [gen.credit_annotation() for _ in range(200)]
    transactions = [gen.transaction() for _ in range(30)]
    async with _api(pipeline, key) as client:
        async with httpx.AsyncClient(timeout=10) as anonymous:
            url = f"http://127.0.0.1:{pipeline.ports['api']}/v1/transactions"
            assert (await anonymous.post(url, json=transactions[0])).status_code == 401
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
        status_url = job.json()["status_url"]

        async def job_done() -> bool:
            status = (await client.get(status_url)).json()
            return bool(status["status"] == "completed")

        await wait_for(job_done, timeout=120, interval=1)

    conn = await asyncpg.connect(_database_url(pipeline))
    try:

        async def recorded() -> bool:
            count = await conn.fetchval("SELECT count(*) FROM transactions")
            return bool(count >= len(transactions))

        await wait_for(recorded, timeout=120, interval=0.5)
        ann_ids = {r[0] for r in await conn.fetch("SELECT id::text FROM credit_annotations")}
        tx_ids = {r[0] for r in await conn.fetch("SELECT id::text FROM transactions")}
        got = await balances(conn)
    finally:
        await conn.close()
    assert ann_ids == {a["id"] for a in annotations}
    assert tx_ids == {t["id"] for t in transactions}
    want: dict[tuple[str, str], Decimal] = expected_balances(transactions)
    assert got == want


def _acked(container: str) -> float:
    """bulk_recorder_messages_acked_total of one recorder, read inside its container."""
    script = (
        "import urllib.request;"
        "print(urllib.request.urlopen('http://127.0.0.1:9464/metrics', timeout=5).read().decode())"
    )
    text = podman.podman("exec", container, "python", "-c", script).stdout
    total = 0.0
    for line in text.splitlines():
        if line.startswith("bulk_recorder_messages_acked_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_scale_recorder_2_shares_the_queue(pipeline: Pipeline) -> None:
    scaled = pipeline.compose(
        "up", "-d", "--no-build", "--no-deps", "--scale", "recorder=2", "recorder"
    )
    assert scaled.returncode == 0, scaled.stderr[-3000:]
    await _all_healthy(pipeline, ("recorder",))
    recorders = pipeline.containers("recorder")
    assert len(recorders) == 2, recorders
    (rabbit,) = pipeline.containers("rabbitmq")
    queues = podman.podman("exec", rabbit, "rabbitmqctl", "-q", "list_queues", "name", "consumers")
    consumers = dict(line.split("\t") for line in queues.stdout.strip().splitlines()[1:])
    assert consumers["bulk_recorder.records"] == "2", queues.stdout

    before = {name: _acked(name) for name in recorders}
    gen = Generator.create(seed=2)
    transactions = [gen.transaction() for _ in range(300)]
    async with _api(pipeline, _key(pipeline)) as client:
        for tx in transactions:
            assert (await client.post("/v1/transactions", json=tx)).status_code == 202

    def all_acked() -> bool:
        return sum(_acked(n) - before[n] for n in recorders) >= len(transactions)

    await wait_for(all_acked, timeout=120, interval=1)
    each = {name: _acked(name) - before[name] for name in recorders}
    assert all(count > 0 for count in each.values()), each


async def test_prometheus_reports_every_scrape_target_up(pipeline: Pipeline) -> None:
    """Both recorders (found by DNS on the bridge network), the relay and the API."""
    url = f"http://127.0.0.1:{pipeline.ports['prometheus']}/api/v1/targets"
    seen: list[Any] = []

    async def every_target_up() -> bool:
        async with httpx.AsyncClient(timeout=10) as client:
            targets = (await client.get(url)).json()["data"]["activeTargets"]
        seen[:] = [(t["labels"]["job"], t["labels"]["instance"], t["health"]) for t in targets]
        jobs = [job for job, _, _ in seen]
        wanted = jobs.count("recorder") == len(pipeline.containers("recorder"))
        return wanted and {"relay", "api"} <= set(jobs) and all(h == "up" for *_, h in seen)

    try:
        await wait_for(every_target_up, timeout=120, interval=2)
    except AssertionError:
        raise AssertionError(f"targets: {seen}") from None
