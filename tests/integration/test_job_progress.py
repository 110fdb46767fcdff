"""A job's progress counts its own lines, also those whose id another job recorded first.

The recorder's insert keeps the first row of an annotation id (``ON CONFLICT (id) DO NOTHING``),
so a line of job B whose id job A recorded carries A's ``job_id`` in ``credit_annotations``.
B's progress must still count it, exactly once, whatever the redeliveries.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import asyncpg
import pytest

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.recorder.writer import PgWriter
from bulk_recorder.records import CreditAnnotation, decode
from consumer.tools.generator import Generator
from tests.conftest import wait_for
from tests.integration.producer_support import api_client, ndjson, running_relay

pytestmark = [pytest.mark.postgres, pytest.mark.ledger_layouts]

NDJSON = {"content-type": "application/x-ndjson"}
JOBS = "/v1/credit-annotation-jobs"


async def _post_job(client: Any, lines: list[dict[str, Any]]) -> dict[str, Any]:
    response = await client.post(JOBS, content=ndjson(lines), headers=NDJSON)
    assert response.status_code == 202, response.text
    body: dict[str, Any] = response.json()
    return body


async def _status_once_settled(client: Any, url: str) -> dict[str, Any]:
    """The job's status once it is completed, or the last status seen if it never is."""
    last: dict[str, Any] = {}

    async def completed() -> bool:
        nonlocal last
        last = (await client.get(url)).json()
        return bool(last["status"] == "completed")

    with contextlib.suppress(AssertionError):  # the caller's assertions show what was wrong
        await wait_for(completed, timeout=15)
    return last


@pytest.mark.rabbitmq
async def test_a_job_repeating_an_id_another_job_recorded_completes_with_exact_counts(
    make_settings, start_recorder, db
) -> None:
    settings = make_settings(bulk_recorder_size=10, bulk_recorder_flush_timeout_ms=20)
    gen = Generator.create(81)
    shared = gen.credit_annotation()
    job_a_lines = [shared, *(gen.credit_annotation() for _ in range(3))]
    fresh = [gen.credit_annotation() for _ in range(5)]
    job_b_lines = [*fresh[:2], shared, *fresh[2:]]
    async with api_client(settings) as (client, _):
        recorder = await start_recorder(settings)
        async with running_relay(settings):
            job_a = await _post_job(client, job_a_lines)
            status_a = await _status_once_settled(client, job_a["status_url"])
            assert status_a["status"] == "completed", status_a

            job_b = await _post_job(client, job_b_lines)
            assert (job_b["accepted"], job_b["rejected"]) == (6, 0)
            # Every message of both jobs recorded and acked: nothing is left in flight.
            await wait_for(
                lambda: recorder.value("bulk_recorder_messages_acked_total") >= 10, timeout=30
            )
            status_b = await _status_once_settled(client, job_b["status_url"])
    assert status_b["status"] == "completed", status_b
    assert status_b["progress"] == 1.0
    assert (status_b["accepted"], status_b["published"], status_b["recorded"]) == (6, 6, 6)
    assert status_b["dead_lettered"] == 0
    assert status_a["recorded"] == 4
    conn = await db()
    owners = dict(
        await conn.fetch("SELECT id::text, job_id::text FROM credit_annotations ORDER BY id")
    )
    assert len(owners) == 9  # the shared id is stored once, with the job that recorded it first
    assert owners[shared["id"]] == job_a["id"]
    assert {owners[line["id"]] for line in fresh} == {job_b["id"]}


@pytest.mark.rabbitmq
async def test_a_job_recorded_before_the_relay_counted_its_rows_is_not_yet_completed(
    make_settings, start_recorder
) -> None:
    """The relay counts a batch as published in the transaction that deletes it, after the
    broker's confirm; the recorder may commit those lines first. A status read in between must
    not freeze the job as completed while its rows are still unsent: it completes once the
    relay's count is in."""
    settings = make_settings(bulk_recorder_size=10, bulk_recorder_flush_timeout_ms=20)
    gen = Generator.create(83)
    lines = [gen.credit_annotation() for _ in range(3)]
    async with api_client(settings) as (client, _):
        job = await _post_job(client, lines)  # no relay yet: every row still in the outbox
        pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=1)
        try:  # the recorder's commit, landing before the relay's
            records = [
                decode(ndjson([dict(line, job_id=job["id"])]).strip(), "credit_annotation")
                for line in lines
            ]
            await PgWriter(pool).write(records)
        finally:
            await pool.close()
        early = (await client.get(job["status_url"])).json()
        assert early["status"] == "publishing", early
        assert early["completed_at"] is None, early
        assert (early["recorded"], early["published"], early["unsent"]) == (3, 0, 3), early

        await start_recorder(settings)
        async with running_relay(settings):
            settled = await _status_once_settled(client, job["status_url"])
    assert settled["status"] == "completed", settled
    assert (settled["accepted"], settled["published"], settled["recorded"]) == (3, 3, 3)
    assert (settled["unsent"], settled["oldest_unsent_age_s"]) == (0, None)


async def test_the_writer_counts_a_repeat_once_per_job_within_a_flush_and_on_redelivery(
    database_url: str, db
) -> None:
    """In-flush duplicates from two jobs, redeliveries, ids recorded outside any job: each job
    gets each of its ids counted exactly once (own rows + repeats)."""
    await migrate(database_url)
    gen = Generator.create(82)

    def annotation(job_id: str | None, line: dict[str, Any]) -> CreditAnnotation:
        record = decode(ndjson([dict(line, job_id=job_id)]).strip(), "credit_annotation")
        assert isinstance(record, CreditAnnotation)
        return record

    job_a, job_b, job_c = (gen.credit_annotation()["id"] for _ in range(3))
    x, y, z, w = (gen.credit_annotation() for _ in range(4))
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        writer = PgWriter(pool)
        # One flush: x from A and from B (same id, two jobs), y from B, w outside any job.
        await writer.write([annotation(job_b, x), annotation(job_a, x), annotation(job_b, y)])
        await writer.write([annotation(None, w)])
        # Redeliveries of everything, and C repeating ids owned by B and by no job.
        for _ in range(2):
            await writer.write(
                [
                    annotation(job_a, x),
                    annotation(job_b, x),
                    annotation(job_b, y),
                    annotation(job_c, y),
                    annotation(job_c, w),
                    annotation(job_c, z),
                ]
            )
    finally:
        await pool.close()
    conn = await db()

    async def progress(job_id: str) -> int:
        return int(
            await conn.fetchval(
                "SELECT (SELECT count(*) FROM credit_annotations WHERE job_id = $1)"
                " + (SELECT count(*) FROM credit_annotation_job_repeats WHERE job_id = $1)",
                job_id,
            )
        )

    assert (await progress(job_a), await progress(job_b), await progress(job_c)) == (1, 2, 3)


async def test_two_jobs_sending_one_id_in_one_flush_each_count_it_after_that_flush(
    database_url: str, db
) -> None:
    """The same id from job A and job B in one flush: one row is stored (A's, the first), and
    B's progress counts its line at once, not only after a redelivery repairs it."""
    await migrate(database_url)
    gen = Generator.create(83)
    job_a, job_b = (gen.credit_annotation()["id"] for _ in range(2))
    line = gen.credit_annotation()

    def annotation(job_id: str) -> CreditAnnotation:
        record = decode(ndjson([dict(line, job_id=job_id)]).strip(), "credit_annotation")
        assert isinstance(record, CreditAnnotation)
        return record

    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    try:
        result = await PgWriter(pool).write([annotation(job_a), annotation(job_b)])
    finally:
        await pool.close()
    assert (
        result.tables["credit_annotations"].inserted,
        result.tables["credit_annotations"].ignored,
    ) == (1, 1)
    conn = await db()
    own = dict(await conn.fetch("SELECT job_id::text, count(*) FROM credit_annotations GROUP BY 1"))
    repeats = dict(
        await conn.fetch(
            "SELECT job_id::text, count(*) FROM credit_annotation_job_repeats GROUP BY 1"
        )
    )
    recorded = {job: own.get(job, 0) + repeats.get(job, 0) for job in (job_a, job_b)}
    assert recorded == {job_a: 1, job_b: 1}


async def test_a_status_read_never_waits_for_the_recount_of_a_job(
    make_settings, db, monkeypatch
) -> None:
    """A job's recorded count is a count over its rows (~0.1 s at 300,000 on a busy machine):
    after its first read it is redone off the request path, so a read answers with the last
    count at once. Here the recount is held at a lock: the read still answers, and the new
    count shows once the lock is gone."""
    import bulk_recorder.producer.api.jobs as jobs_module

    settings = make_settings()
    gen = Generator.create(84)
    lines = [gen.credit_annotation() for _ in range(3)]
    async with api_client(settings) as (client, _):
        job = await _post_job(client, lines)  # no relay: its rows stay in the outbox
        first = (await client.get(job["status_url"])).json()
        assert first["recorded"] == 0, first
        monkeypatch.setattr(jobs_module, "RECORDED_COUNT_TTL_S", 0.0)  # every read is stale
        pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=1)
        try:  # two lines recorded, as the recorder writes them
            records = [
                decode(ndjson([dict(line, job_id=job["id"])]).strip(), "credit_annotation")
                for line in lines[:2]
            ]
            await PgWriter(pool).write(records)
        finally:
            await pool.close()
        holder = await db()
        await holder.execute("BEGIN")
        await holder.execute("LOCK TABLE credit_annotation_job_repeats IN ACCESS EXCLUSIVE MODE")
        held = (await asyncio.wait_for(client.get(job["status_url"]), 10)).json()
        assert (held["status"], held["recorded"]) == ("publishing", 0), held
        await holder.execute("ROLLBACK")

        async def counted() -> bool:
            return bool((await client.get(job["status_url"])).json()["recorded"] == 2)

        await wait_for(counted, timeout=10)
