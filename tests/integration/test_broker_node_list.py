"""RABBITMQ_URL as a list of nodes: the recorder and the relay use whichever node answers.

One node of the list is a port where nothing listens (a node that is down); whichever node the
random start picks, both must end up on the live one and do their work.
"""

from __future__ import annotations

from consumer.tools.generator import Generator
from consumer.tools.loadgen import LoadSpec, publish_load
from tests.conftest import SettingsFactory, free_port, wait_for
from tests.integration.producer_support import api_client, ndjson, running_relay


def _with_a_dead_node(live: str) -> str:
    return f"amqp://guest:guest@127.0.0.1:{free_port()}/,{live}"


async def test_recorder_and_relay_reach_the_live_node_of_the_list(
    make_settings: SettingsFactory, start_recorder, db, services
) -> None:
    settings = make_settings(rabbitmq_url=_with_a_dead_node(services.rabbitmq_url))
    for _ in range(3):  # three starts: the random first node is the dead one at least once
        rec = await start_recorder(settings)
        assert rec.recorder.ready()[0]
        await rec.shutdown()
    rec = await start_recorder(settings)
    report = await publish_load(
        settings.rabbitmq_url, settings.rabbitmq_exchange, LoadSpec("mixed", 200, seed=3)
    )
    conn = await db()

    async def recorded() -> bool:
        total = 0
        for table in ("transactions", "credit_annotations"):
            total += int(await conn.fetchval(f"SELECT count(*) FROM {table}"))
        return total == report.valid

    await wait_for(recorded, timeout=60)
    gen = Generator.create(5)
    lines = [gen.credit_annotation() for _ in range(50)]
    async with api_client(settings) as (client, _):
        answer = await client.post(
            "/v1/credit-annotation-jobs",
            content=ndjson(lines),
            headers={"content-type": "application/x-ndjson"},
        )
        assert answer.status_code == 202, answer.text
    job_id = answer.json()["id"]
    async with running_relay(settings) as relay:
        await wait_for(lambda: relay.published == len(lines), timeout=60)

    async def job_recorded() -> bool:
        n = await conn.fetchval(
            "SELECT count(*) FROM credit_annotations WHERE job_id = $1::uuid", job_id
        )
        return int(n) == len(lines)

    await wait_for(job_recorded, timeout=60)
