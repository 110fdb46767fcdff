"""docs/producer.md: an ``Idempotency-Key`` is 1 to 255 printable ASCII characters. The tests
refused 0 and 256; none sent the longest key allowed, so a bound of 254 passed them all."""

from __future__ import annotations

import string

import pytest

from consumer.tools.generator import Generator
from tests.integration.producer_support import api_client, ndjson

pytestmark = [pytest.mark.postgres]

# 255 printable ASCII characters, a space among them (only spaces around a value are trimmed)
LONGEST = ((string.ascii_letters + string.digits + string.punctuation + " ") * 3)[:255]


async def test_the_longest_idempotency_key_is_accepted_and_replays(make_settings) -> None:
    assert len(LONGEST) == 255
    assert LONGEST.isascii()
    assert LONGEST.isprintable()
    assert LONGEST.strip() == LONGEST
    gen = Generator.create(2703)
    tx = gen.transaction()
    line = gen.credit_annotation()
    async with api_client(make_settings()) as (client, _):
        for _ in range(2):  # the second is a replay of the first, by its key
            posted = await client.post(
                "/v1/transactions", json=tx, headers={"Idempotency-Key": LONGEST}
            )
            assert posted.status_code == 202, posted.text
            job = await client.post(
                "/v1/credit-annotation-jobs",
                content=ndjson([line]),
                headers={"content-type": "application/x-ndjson", "Idempotency-Key": LONGEST},
            )
            assert job.status_code == 202, job.text
        assert posted.headers.get("idempotent-replayed") == "true"
        assert job.headers.get("idempotent-replayed") == "true"
