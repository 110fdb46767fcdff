"""docs/security.md: a key's name is its client. Keys made under one name share that client's
jobs and ``Idempotency-Key``s, so a client rotates its key by making a second one under the same
name, switching, then revoking the first by id; revocation applies from the key's next request.
Every other auth test gives each client one key, so a client told by its key passed them."""

from __future__ import annotations

import pytest

from bulk_recorder.producer.key_store import revoke_keys
from consumer.tools.generator import Generator
from tests.integration.producer_support import api_client, bearer, ndjson, provision_key

pytestmark = [pytest.mark.postgres]

JOBS = "/v1/credit-annotation-jobs"


async def test_a_second_key_of_a_client_shares_its_jobs_and_keys_and_the_first_is_revoked(
    make_settings, db
) -> None:
    settings = make_settings(api_auth="on")
    gen = Generator.create(2704)
    body = ndjson([gen.credit_annotation() for _ in range(2)])
    headers = {"content-type": "application/x-ndjson", "Idempotency-Key": "rotation-1"}
    async with api_client(settings, client_name="shop") as (client, _):
        first_key = client.headers["authorization"].removeprefix("Bearer ")
        posted = await client.post(JOBS, content=body, headers=headers)
        assert posted.status_code == 202, posted.text
        job = posted.json()["id"]

        second = bearer(await provision_key(settings.database_url, "shop"))
        seen = await client.get(f"{JOBS}/{job}", headers=second)
        assert seen.status_code == 200, seen.text  # the client's job, whichever its key
        again = await client.post(JOBS, content=body, headers={**headers, **second})
        assert again.status_code == 202, again.text
        assert again.headers.get("idempotent-replayed") == "true"
        assert again.json()["id"] == job  # the client's Idempotency-Key: the same job

        conn = await db()
        first = await conn.fetchval("SELECT id FROM api_keys WHERE prefix = $1", first_key[:12])
        assert [k.id for k in await revoke_keys(conn, str(first))] == [first]
        refused = await client.get(f"{JOBS}/{job}")  # the first key, at its next request
        assert refused.status_code == 401, refused.text
        assert (await client.get(f"{JOBS}/{job}", headers=second)).status_code == 200
