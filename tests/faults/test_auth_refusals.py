"""The ingest API refuses who it must, against a real ``bulk-recorder api`` process and real
PostgreSQL: no key, a malformed, unknown or revoked key (401), a key without the scope (403),
another client's job (404, like a missing one); Idempotency-Keys are per client while a
transaction id stays unique in the ledger (409). Every refusal is counted by reason in
``bulk_recorder_api_auth_failures_total`` and logged, never with the key."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest

from bulk_recorder.producer.key_store import hash_key
from consumer.tools.generator import Generator
from settings import Settings
from tests.conftest import free_port, wait_for
from tests.faults.conftest import API, REPO, RecorderProcess, settings_env
from tests.integration.producer_support import bearer, ndjson, provision_key

pytestmark = [pytest.mark.postgres]

TX = "/v1/transactions"
JOBS = "/v1/credit-annotation-jobs"
NDJSON = {"content-type": "application/x-ndjson"}
PROBLEM = "application/problem+json"


class ApiProcess:
    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.settings = settings
        self.log_path = log_path
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{settings.api_port}", timeout=30)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    async def failures(self) -> dict[str, float]:
        """bulk_recorder_api_auth_failures_total by reason, scraped from /metrics (no key)."""
        text = (await self.http.get("/metrics")).text
        out = {}
        for line in text.splitlines():
            if line.startswith("bulk_recorder_api_auth_failures_total{"):
                reason = line.split('reason="', 1)[1].split('"', 1)[0]
                out[reason] = float(line.rsplit(" ", 1)[1])
        return out


@contextlib.asynccontextmanager
async def api_process(settings: Settings, log_path: Path) -> AsyncIterator[ApiProcess]:
    """A ``bulk-recorder api`` child process (the fault suite's runner), once it is ready."""
    proc = RecorderProcess(settings, log_path, API)
    await proc.start()
    api = ApiProcess(settings, log_path)
    try:

        async def up() -> bool:
            if not proc.running:
                raise AssertionError(f"the API exited: {api.log_text()}")
            try:
                return (await api.http.get("/readyz")).status_code == 200
            except httpx.TransportError:
                return False

        await wait_for(up, timeout=60)
        yield api
    finally:
        await api.http.aclose()
        if proc.running:
            with contextlib.suppress(AssertionError):  # killed after 30 s: the test has failed
                await proc.terminate(timeout=30)


def cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "consumer.cli", *args],
        env=settings_env(settings),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )


def assert_problem(
    response: httpx.Response, status: int, challenge: str, detail: str
) -> dict[str, Any]:
    """A problem+json refusal with its WWW-Authenticate challenge."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    assert response.headers["www-authenticate"] == challenge
    body = response.json()
    assert body["status"] == status
    assert body["title"] == ("Forbidden" if status == 403 else "Unauthorized")
    assert detail in body["detail"], body
    return dict(body)


def job_lines(gen: Generator, n: int) -> bytes:
    return ndjson([gen.credit_annotation() for _ in range(n)])


async def key_for(settings: Settings, name: str, scopes: Iterable[str]) -> str:
    return await provision_key(settings.database_url, name, scopes)


# -- 401 and 403 --------------------------------------------------------------------------------


async def test_no_bad_or_revoked_key_is_401_a_missing_scope_403_counted_and_never_logged(
    make_settings, tmp_path: Path
) -> None:
    settings = make_settings(api_port=free_port())
    gen = Generator.create(1401)
    created = cli(settings, "api-key", "create", "shop")
    assert created.returncode == 0, created.stderr
    good = created.stdout.strip()  # the key alone on stdout, shown this once
    reader = await key_for(settings, "dashboard", ["jobs:read"])
    unknown = "brk_" + "A" * 43  # well formed, never issued
    async with api_process(settings, tmp_path / "api.log") as api:
        # Probes and scrapers need no key.
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await api.http.get(path)).status_code == 200, path

        realm = 'Bearer realm="bulk-recorder"'
        invalid = f'{realm}, error="invalid_token"'
        tx = gen.transaction()
        missing = await api.http.post(TX, json=tx)
        assert_problem(missing, 401, realm, "an API key is required")
        for header in ("Basic c2hvcDpzZWNyZXQ=", "Bearer", "Bearer not-a-key", good):
            bad = await api.http.post(TX, json=tx, headers={"Authorization": header})
            assert_problem(bad, 401, invalid, "the Authorization header must be Bearer")
        wrong = await api.http.post(TX, json=tx, headers=bearer(unknown))
        assert_problem(wrong, 401, invalid, "the API key is not valid")
        # Each /v1 route refuses a request without a key, GET included.
        assert (
            await api.http.post(JOBS, content=job_lines(gen, 1), headers=NDJSON)
        ).status_code == 401
        assert (await api.http.get(f"{JOBS}/{gen.credit_annotation()['id']}")).status_code == 401

        # A key without the route's scope: 403, naming the scope.
        denied = await api.http.post(TX, json=tx, headers=bearer(reader))
        challenge = f'{realm}, error="insufficient_scope", scope="transactions:write"'
        assert_problem(denied, 403, challenge, "lacks the scope transactions:write")
        denied_job = await api.http.post(
            JOBS, content=job_lines(gen, 1), headers={**NDJSON, **bearer(reader)}
        )
        assert denied_job.status_code == 403

        # The good key works, until it is revoked; then it is refused from the next request on.
        accepted = await api.http.post(TX, json=tx, headers=bearer(good))
        assert accepted.status_code == 202, accepted.text
        revoked = cli(settings, "api-key", "revoke", "shop")
        assert revoked.returncode == 0, revoked.stderr
        assert "revoked" in revoked.stdout
        after = await api.http.post(TX, json=gen.transaction(), headers=bearer(good))
        assert_problem(after, 401, invalid, "the API key was revoked")
        # Nothing left to revoke: one line and exit 1 (a bad name or scope is exit 2).
        again = cli(settings, "api-key", "revoke", "shop")
        assert again.returncode == 1, again.stderr
        assert "bulk-recorder api-key: no live API key has the name or id 'shop'" in again.stderr

        expected = {"missing": 3, "malformed": 4, "unknown": 1, "revoked": 1, "scope": 2}
        assert await api.failures() == expected
        await wait_for(lambda: "API request refused (revoked" in api.log_text(), timeout=10)

    log = api.log_text()
    assert log.count("API request refused (") == sum(expected.values()), log
    assert "API request refused (revoked, client 'shop' key " in log
    assert "API request refused (scope, client 'dashboard' key " in log
    for key in (good, reader, unknown):  # never a key, nor its random part
        assert key not in log
        assert key[4:] not in log
    assert good not in created.stderr  # the CLI prints the key on stdout only


# -- per-client isolation -----------------------------------------------------------------------


async def test_another_clients_job_is_404_like_a_missing_one_and_an_admin_key_reads_every_job(
    make_settings, tmp_path: Path
) -> None:
    settings = make_settings(api_port=free_port())
    gen = Generator.create(1402)
    alice = await key_for(settings, "alice", ["jobs:write", "jobs:read"])
    bob = await key_for(settings, "bob", ["jobs:write", "jobs:read"])
    admin = await key_for(settings, "ops", ["admin"])
    async with api_process(settings, tmp_path / "api.log") as api:
        posted = await api.http.post(
            JOBS, content=job_lines(gen, 3), headers={**NDJSON, **bearer(alice)}
        )
        assert posted.status_code == 202, posted.text
        job = posted.json()["id"]
        nowhere = gen.credit_annotation()["id"]

        own = await api.http.get(f"{JOBS}/{job}", headers=bearer(alice))
        assert own.status_code == 200
        assert own.json()["accepted"] == 3
        others = await api.http.get(f"{JOBS}/{job}", headers=bearer(bob))
        missing = await api.http.get(f"{JOBS}/{nowhere}", headers=bearer(bob))
        assert others.status_code == missing.status_code == 404
        # Not told apart: the same answer as for an id that does not exist.
        assert others.json()["detail"] == f"no credit-annotation job {job}"
        assert missing.json()["detail"] == f"no credit-annotation job {nowhere}"
        assert others.headers.keys() == missing.headers.keys()

        every = await api.http.get(f"{JOBS}/{job}", headers=bearer(admin))
        assert every.status_code == 200
        assert every.json()["id"] == job
        # admin reads; it does not write.
        assert (
            await api.http.post(
                JOBS, content=job_lines(gen, 1), headers={**NDJSON, **bearer(admin)}
            )
        ).status_code == 403


async def test_idempotency_keys_are_per_client_and_the_transaction_id_409_stays_global(
    make_settings, db, tmp_path: Path
) -> None:
    settings = make_settings(api_port=free_port())
    gen = Generator.create(1403)
    alice = await key_for(settings, "alice", ["transactions:write", "jobs:write", "jobs:read"])
    bob = await key_for(settings, "bob", ["transactions:write", "jobs:write", "jobs:read"])
    async with api_process(settings, tmp_path / "api.log") as api:

        async def post_tx(body: dict[str, Any], key: str, idem: str | None) -> httpx.Response:
            headers = {**bearer(key), **({"Idempotency-Key": idem} if idem else {})}
            return await api.http.post(TX, json=body, headers=headers)

        # Same Idempotency-Key, two clients, two different transactions: two requests.
        tx_a, tx_b = gen.transaction(), gen.transaction()
        first_a = await post_tx(tx_a, alice, "same-key")
        first_b = await post_tx(tx_b, bob, "same-key")
        assert first_a.status_code == first_b.status_code == 202, (first_a.text, first_b.text)
        assert "idempotent-replayed" not in first_b.headers
        assert first_b.json()["id"] == tx_b["id"]
        # Each client's repeat is answered from its own request.
        again_b = await post_tx(tx_b, bob, "same-key")
        assert again_b.status_code == 202
        assert again_b.headers["idempotent-replayed"] == "true"
        assert (await post_tx(tx_b, alice, "same-key")).status_code == 422  # alice's key: tx_a

        # A transaction id is unique in the ledger whoever sends it: bob cannot replay or
        # overwrite alice's, with an Idempotency-Key or none, with the same body or not.
        for body, idem in (
            (tx_a, "other-key"),
            (tx_a, None),
            ({**tx_a, "description": "x"}, "k3"),
        ):
            clash = await post_tx(body, bob, idem)
            assert clash.status_code == 409, clash.text
            assert clash.json()["detail"] == (
                f"transaction {tx_a['id']} was already accepted from another client"
            )

        # Jobs: the same key and the same body from two clients are two jobs.
        job_body = job_lines(gen, 2)
        jobs = []
        for key in (alice, bob, alice):
            headers = {**NDJSON, **bearer(key), "Idempotency-Key": "job-key"}
            response = await api.http.post(JOBS, content=job_body, headers=headers)
            assert response.status_code == 202, response.text
            jobs.append(response.json()["id"])
        assert jobs[0] != jobs[1]
        assert jobs[2] == jobs[0]

    conn = await db()
    rows = await conn.fetch(
        "SELECT client, count(*) AS n FROM credit_annotation_jobs GROUP BY client ORDER BY 1"
    )
    assert [(r["client"], r["n"]) for r in rows] == [("alice", 1), ("bob", 1)]
    requests = await conn.fetch(
        "SELECT client, idempotency_key FROM transaction_requests ORDER BY client"
    )
    assert [(r["client"], r["idempotency_key"]) for r in requests] == [
        ("alice", "same-key"),
        ("bob", "same-key"),
    ]


# -- the key store and the switch ---------------------------------------------------------------


async def test_a_key_is_stored_only_as_its_hash_and_api_auth_off_lets_requests_in(
    make_settings, db, tmp_path: Path
) -> None:
    settings = make_settings(api_port=free_port())
    created = cli(settings, "api-key", "create", "shop", "--scope", "jobs:read")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert "shown once" in created.stderr
    conn = await db()
    [row] = await conn.fetch("SELECT * FROM api_keys")
    assert bytes(row["key_hash"]) == hash_key(key)
    assert key not in json.dumps({k: str(v) for k, v in dict(row).items()})
    assert row["prefix"] == key[:12]
    assert list(row["scopes"]) == ["jobs:read"]
    listed = cli(settings, "api-key", "list")
    assert "shop" in listed.stdout
    assert key[:12] in listed.stdout
    assert key not in listed.stdout

    bad = cli(settings.model_copy(update={"api_auth": "maybe"}), "api")
    assert bad.returncode == 2
    assert "API_AUTH" in bad.stderr
    assert "Traceback" not in bad.stderr

    off = settings.model_copy(update={"api_auth": "off"})
    async with api_process(off, tmp_path / "api-off.log") as api:
        gen = Generator.create(1404)
        response = await api.http.post(TX, json=gen.transaction())
        assert response.status_code == 202, response.text
    assert "API_AUTH=off: every /v1 request is accepted without a key" in api.log_text()
