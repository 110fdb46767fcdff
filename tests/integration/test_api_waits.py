"""What an API request waits on is measured by the API itself: the event loop's lag
(``bulk_recorder_api_event_loop_lag_seconds``) and the wait for a pooled connection
(``bulk_recorder_api_db_acquire_seconds``); ``benchmarks/bench_api_latency.py`` reads both per
phase of the 300,000-line job."""

from __future__ import annotations

import time

import pytest

from consumer.tools.generator import Generator
from tests.conftest import wait_for
from tests.integration.producer_support import api_client

pytestmark = [pytest.mark.postgres]

LAG = "bulk_recorder_api_event_loop_lag_seconds"
ACQUIRE = "bulk_recorder_api_db_acquire_seconds"


async def test_a_loop_held_shows_as_lag_and_every_pooled_connection_wait_is_counted(
    make_settings,
) -> None:
    settings = make_settings(rabbitmq_transaction_async=True)
    async with api_client(settings) as (client, metrics):
        registry = metrics.registry

        def value(name: str, **labels: str) -> float:
            return registry.get_sample_value(name, labels or None) or 0.0

        def sampled() -> bool:
            return value(LAG + "_count") >= 1

        await wait_for(sampled, timeout=10)
        # the loop held for 0.3 s, as a handler computing between awaits would hold it
        late_before = value(LAG + "_count") - value(LAG + "_bucket", le="0.25")
        time.sleep(0.3)  # noqa: ASYNC251 - the point: hold the loop

        def lag_seen() -> bool:
            return value(LAG + "_count") - value(LAG + "_bucket", le="0.25") > late_before

        await wait_for(lag_seen, timeout=10)

        acquired = value(ACQUIRE + "_count")
        answer = await client.post("/v1/transactions", json=Generator.create(5).transaction())
        assert answer.status_code == 202, answer.text
        # one connection for the key, one for the request and its outbox row
        assert value(ACQUIRE + "_count") - acquired == 2
