"""The ingest API's contract: status codes, idempotent repeats, validation errors with line
numbers, health and OpenAPI; in process (httpx + ASGITransport) and as a real uvicorn process."""

from __future__ import annotations

import asyncio
import copy
import json
import random
import re
import signal
import uuid
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from bulk_recorder.producer.parsers import CONTENT_TYPES
from bulk_recorder.records import CreditAnnotation, decode
from consumer.tools.generator import Generator
from tests.conftest import free_port, wait_for
from tests.integration.producer_support import (
    api_client,
    bearer,
    ndjson,
    provision_key,
    running_api,
)

pytestmark = [pytest.mark.postgres]

NDJSON = {"content-type": "application/x-ndjson"}
CSV = {"content-type": "text/csv"}
JOBS = "/v1/credit-annotation-jobs"


async def count(conn, table: str) -> int:
    return int(await conn.fetchval(f"SELECT count(*) FROM {table}"))


# -- transactions ---------------------------------------------------------------------------


async def test_async_transaction_202_with_one_outbox_row_and_repeats_answered_once(
    make_settings, db
) -> None:
    settings = make_settings(rabbitmq_transaction_async=True)
    tx = Generator.create(1).transaction()
    async with api_client(settings) as (client, _):
        first = await client.post("/v1/transactions", json=tx, headers={"Idempotency-Key": "k-1"})
        assert first.status_code == 202, first.text
        assert first.json() == {"id": tx["id"], "status": "accepted", "mode": "async"}

        # The same body again (spaced differently, keys reordered), with or without the key.
        respaced = json.dumps(dict(reversed(list(tx.items()))), indent=2)
        for headers in ({"Idempotency-Key": "k-1"}, {}):
            again = await client.post(
                "/v1/transactions",
                content=respaced,
                headers={"content-type": "application/json", **headers},
            )
            assert again.status_code == 202
            assert again.json() == first.json()
            assert again.headers["idempotent-replayed"] == "true"

        changed = copy.deepcopy(tx)
        changed["description"] = "something else"
        same_id = await client.post("/v1/transactions", json=changed)
        assert same_id.status_code == 409
        assert same_id.json()["detail"] == (
            f"transaction {tx['id']} was already accepted with other content"
        )
        other = Generator.create(2).transaction()
        same_key = await client.post(
            "/v1/transactions", json=other, headers={"Idempotency-Key": "k-1"}
        )
        assert same_key.status_code == 422
        assert "Idempotency-Key was already used" in same_key.json()["detail"]

        conn = await db()
        assert await count(conn, "transaction_requests") == 1
        [row] = await conn.fetch("SELECT record_type, record_id::text, body FROM outbox")
        assert (row["record_type"], row["record_id"]) == ("transaction", tx["id"])
        assert json.loads(row["body"]) == tx  # the accepted body, byte for byte its JSON
        assert await count(conn, "transactions") == 0  # recorded later, by the recorder


async def test_sync_transaction_201_written_at_once_and_balances_moved_once(
    make_settings, db
) -> None:
    settings = make_settings(rabbitmq_transaction_async=False)
    tx = Generator.create(3).transaction()
    debit, credit = tx["operations"]
    async with api_client(settings) as (client, _):
        for attempt in range(3):
            response = await client.post("/v1/transactions", json=tx)
            assert response.status_code == 201, response.text
            assert response.json() == {"id": tx["id"], "status": "recorded", "mode": "sync"}
            assert ("idempotent-replayed" in response.headers) == (attempt > 0)
        conn = await db()
        assert await count(conn, "transactions") == 1
        assert await count(conn, "operations") == 2
        assert await count(conn, "outbox") == 0
        amount = Decimal(tx["amount"])
        for op, sign in ((debit, -1), (credit, 1)):
            available = await conn.fetchval(
                "SELECT available FROM balances WHERE account_id = $1 AND asset_code = 'BRL'",
                op["account_id"],
            )
            assert available == sign * amount


async def test_sync_transaction_refused_by_the_database_is_a_4xx_and_leaves_nothing(
    make_settings, db
) -> None:
    """An operation id already used by another transaction: PostgreSQL refuses the row."""
    settings = make_settings(rabbitmq_transaction_async=False)
    gen = Generator.create(4)
    first, second = gen.transaction(), gen.transaction()
    second["operations"][0]["id"] = first["operations"][0]["id"]
    async with api_client(settings) as (client, _):
        assert (await client.post("/v1/transactions", json=first)).status_code == 201
        clash = await client.post("/v1/transactions", json=second)
        assert clash.status_code == 409
        assert clash.json()["detail"].startswith("refused by the database: 23505")
        conn = await db()
        assert await count(conn, "transaction_requests") == 1  # the refused request left nothing
        assert await count(conn, "transactions") == 1


JOB_EXTREME_AMOUNTS = (
    "0.0000001",  # str(Decimal) writes 1E-7, which no record's amount may be
    "0.000000000000000001",
    "99999999999999999999.999999999999999999",
    "10000000000000000000",
    "0",
    "0.000000000000000000",
)


async def test_a_job_lines_amount_is_published_as_the_recorder_decodes_it(
    make_settings, db
) -> None:
    """Every amount a job line may carry (the 18-decimal extremes, NDJSON and CSV) reaches the
    outbox as a body the recorder's decode accepts, with the same amount: a body it refused
    would be dead-lettered and the job would read `recording` for ever."""
    settings = make_settings()
    gen = Generator.create(27)
    lines = [dict(gen.credit_annotation(), amount=amount) for amount in JOB_EXTREME_AMOUNTS]
    rows = [
        f"{a['id']},{a['document']},{a['kind']},Banco,{a['amount']},{a['occurred_on']},"
        for a in (dict(gen.credit_annotation(), amount=x) for x in JOB_EXTREME_AMOUNTS)
    ]
    csv_body = "id,document,kind,creditor,amount,occurred_on,reason\n" + "\n".join(rows) + "\n"
    async with api_client(settings) as (client, _):
        for body, headers in ((ndjson(lines), NDJSON), (csv_body.encode(), CSV)):
            response = await client.post(JOBS, content=body, headers=headers)
            assert response.status_code == 202, response.text
            assert response.json()["rejected"] == 0, response.json()["rejections"]
    conn = await db()
    bodies = await conn.fetch("SELECT body FROM outbox ORDER BY id")
    amounts = []
    for row in bodies:
        record = decode(bytes(row["body"]), "credit_annotation")
        assert isinstance(record, CreditAnnotation)
        amounts.append(record.amount)
    expected = [Decimal(amount) for amount in JOB_EXTREME_AMOUNTS]
    assert amounts == expected + expected


@pytest.mark.parametrize(
    ("body", "headers", "status", "detail"),
    [
        (b"{not json", {}, 422, "invalid JSON"),
        (b"[]", {}, 422, "body must be a JSON object"),
        (b"", {}, 422, "invalid JSON"),
        (b"{}", {"content-type": "text/plain"}, 415, "Content-Type must be application/json"),
        (b"{}", {"Idempotency-Key": ""}, 400, "Idempotency-Key must be 1 to 255"),
        (b"{}", {"Idempotency-Key": "x" * 256}, 400, "Idempotency-Key must be 1 to 255"),
        (b" " * 2000, {}, 413, "body too large"),
    ],
)
async def test_transaction_bad_input_gets_a_precise_4xx(
    make_settings, body, headers, status, detail
) -> None:
    settings = make_settings(bulk_recorder_max_message_bytes=1024)
    async with api_client(settings) as (client, _):
        response = await client.post(
            "/v1/transactions",
            content=body,
            headers={"content-type": "application/json", **headers},
        )
    assert response.status_code == status, response.text
    assert response.json()["detail"].startswith(detail)


async def test_transaction_rule_violations_name_the_field(make_settings) -> None:
    settings = make_settings()
    gen = Generator.create(5)
    unbalanced = gen.transaction()
    unbalanced["operations"][1]["amount"] = "1.00"
    floaty = gen.transaction()
    floaty["amount"] = 1.5
    bad_status = gen.transaction()
    bad_status["status"] = "DONE"
    async with api_client(settings) as (client, _):
        answers = [
            (await client.post("/v1/transactions", json=body)).json()["detail"]
            for body in (unbalanced, floaty, bad_status)
        ]
    assert "credit" in answers[0], answers[0]
    assert "debit" in answers[0], answers[0]
    assert answers[1].startswith("amount:"), answers[1]
    assert answers[2].startswith("status:"), answers[2]


# -- jobs -----------------------------------------------------------------------------------


async def test_ndjson_job_counts_lines_and_lists_rejections_with_line_numbers(
    make_settings, db
) -> None:
    settings = make_settings()
    gen = Generator.create(6)
    good = [gen.credit_annotation() for _ in range(6)]
    bad_cpf = dict(gen.credit_annotation(), document="529.982.247-26")
    lines = [
        json.dumps(good[0]),
        "",  # blank lines are skipped but counted
        json.dumps(good[1]),
        "{oops",
        json.dumps(bad_cpf),
        json.dumps(good[2]),
        json.dumps(dict(good[3], amount="-1")),
        json.dumps(good[2]),  # the same id again
        json.dumps(good[4]),
        json.dumps(dict(good[5], job_id=str(uuid.uuid4()))),  # replaced by the job's id
    ]
    body = "\r\n".join(lines).encode()
    async with api_client(settings) as (client, _):
        response = await client.post(JOBS, content=body, headers=NDJSON)
        assert response.status_code == 202, response.text
        job = response.json()
        assert response.headers["location"] == job["status_url"] == f"{JOBS}/{job['id']}"
        assert (job["accepted"], job["rejected"]) == (5, 4)
        assert [r["line"] for r in job["rejections"]] == [4, 5, 7, 8]
        reasons = [r["reason"] for r in job["rejections"]]
        assert reasons[0] == "invalid JSON"
        assert reasons[1].startswith("document:")
        assert reasons[2].startswith("amount:")
        assert reasons[3] == "id: repeats line 6"
        assert job["rejections_truncated"] is False

        status = await client.get(job["status_url"])
        assert status.status_code == 200
        assert status.json()["status"] == "publishing"
        assert (status.json()["accepted"], status.json()["rejected"]) == (5, 4)

    conn = await db()
    rows = await conn.fetch("SELECT record_type, job_id::text, body FROM outbox ORDER BY id")
    assert len(rows) == 5
    for row in rows:
        assert row["record_type"] == "credit_annotation"
        assert row["job_id"] == job["id"]
        record = decode(bytes(row["body"]), "credit_annotation")
        assert isinstance(record, CreditAnnotation)
        assert record.job_id == job["id"]
    assert json.loads(rows[4]["body"])["id"] == good[5]["id"]


async def test_csv_and_json_array_jobs(make_settings, db) -> None:
    settings = make_settings()
    gen = Generator.create(7)
    a, b, c = (gen.credit_annotation() for _ in range(3))
    csv_body = (
        "id,document,kind,creditor,amount,occurred_on,reason\n"
        f'{a["id"]},{a["document"]},RESTRICTION,"Banco, Exemplo",10.00,2026-11-20,"two\nlines"\n'
        f"{b['id']},{b['document']},RELEASE,Banco,0,2026-11-21,\n"
        f"{c['id']},{c['document']},RESTRICTION,Banco,1.00\n"
        f"{c['id']},{c['document']},MAYBE,Banco,1.00,2026-11-22,\n"
    )
    async with api_client(settings) as (client, _):
        response = await client.post(JOBS, content=csv_body.encode(), headers=CSV)
        assert response.status_code == 202, response.text
        job = response.json()
        assert (job["accepted"], job["rejected"]) == (2, 2)
        assert job["rejections"] == [
            {"line": 5, "reason": "expected 7 fields, got 5"},
            {"line": 6, "reason": job["rejections"][1]["reason"]},
        ]
        assert job["rejections"][1]["reason"].startswith("kind:")

        array = json.dumps([c, {"id": 1}, a]).encode()
        response = await client.post(
            JOBS, content=array, headers={"content-type": "application/json"}
        )
        assert response.status_code == 202, response.text
        second = response.json()
        assert (second["accepted"], second["rejected"]) == (2, 1)
        assert second["rejections"] == [{"line": 2, "reason": "id: must be a string, not a number"}]

    conn = await db()
    [first_csv] = await conn.fetch(
        "SELECT body FROM outbox WHERE job_id = $1 ORDER BY id LIMIT 1", job["id"]
    )
    stored = json.loads(first_csv["body"])
    assert stored["creditor"] == "Banco, Exemplo"
    assert stored["reason"] == "two\nlines"
    assert stored["amount"] == "10.00"


@pytest.mark.parametrize(
    ("body", "headers", "status", "detail"),
    [
        (b"id,document,colour\n", CSV, 400, "CSV header: unknown column 'colour'"),
        (b"id,document\n", CSV, 400, "CSV header: missing column(s) amount, creditor"),
        (b"", CSV, 400, "empty body"),
        (b'[{"id": 1}, {"id": ', {"content-type": "application/json"}, 400, "unexpected end"),
        (b'{"id": 1}', {"content-type": "application/json"}, 400, "a JSON body must be an array"),
        (b'[{"a": 1} {"b": 2}]', {"content-type": "application/json"}, 400, "after element 1"),
        (b"{}", {"content-type": "application/xml"}, 415, "Content-Type must be one of"),
        (b"{}", {}, 415, "Content-Type must be one of"),
        (b"", NDJSON, 422, "the job has no lines"),
        (b"{}\n[]\n", NDJSON, 422, "no valid line in the job"),
    ],
)
async def test_job_bad_input_gets_a_precise_4xx_and_stores_nothing(
    make_settings, db, body, headers, status, detail
) -> None:
    settings = make_settings()
    async with api_client(settings) as (client, _):
        response = await client.post(JOBS, content=body, headers=headers)
        assert response.status_code == status, response.text
        assert response.json()["detail"].startswith(detail), response.json()
        conn = await db()
        assert await count(conn, "credit_annotation_jobs") == 0
        assert await count(conn, "outbox") == 0
    if detail == "no valid line in the job":
        assert [r["line"] for r in response.json()["rejections"]] == [1, 2]


async def test_job_line_limit_is_413(make_settings, db) -> None:
    settings = make_settings()
    gen = Generator.create(8)
    async with api_client(settings, max_job_lines=3) as (client, _):
        body = ndjson([gen.credit_annotation() for _ in range(4)])
        response = await client.post(JOBS, content=body, headers=NDJSON)
        assert response.status_code == 413
        assert response.json()["detail"] == "a job has at most 3 lines"
        assert await count(await db(), "outbox") == 0


async def test_job_idempotency_key_returns_the_same_job(make_settings, db) -> None:
    settings = make_settings()
    gen = Generator.create(9)
    body = ndjson([gen.credit_annotation() for _ in range(20)] + [{"bad": True}])
    headers = {**NDJSON, "Idempotency-Key": "run-2026-11-30"}
    async with api_client(settings) as (client, _):
        first, second, third = await asyncio.gather(
            *(client.post(JOBS, content=body, headers=headers) for _ in range(3))
        )
        jobs = [r.json() for r in (first, second, third)]
        assert {r.status_code for r in (first, second, third)} == {202}
        assert len({j["id"] for j in jobs}) == 1
        assert all(j["accepted"] == 20 and j["rejected"] == 1 for j in jobs)
        assert (
            sum(r.headers.get("idempotent-replayed") == "true" for r in (first, second, third)) == 2
        )
        other = await client.post(JOBS, content=ndjson([gen.credit_annotation()]), headers=headers)
        assert other.status_code == 422
        assert "Idempotency-Key was already used" in other.json()["detail"]
        without_key = await client.post(JOBS, content=body, headers=NDJSON)
        assert without_key.status_code == 202
        assert without_key.json()["id"] != jobs[0]["id"]
    conn = await db()
    assert await count(conn, "credit_annotation_jobs") == 2
    assert await count(conn, "outbox") == 40


async def test_job_uploads_beyond_half_the_pool_get_503_and_the_rest_still_works(
    make_settings, db
) -> None:
    settings = make_settings()
    gen = Generator.create(13)
    release = asyncio.Event()
    asked = asyncio.Event()  # the app holds the slot and asks for more of the body

    async def slow_body():
        yield ndjson([gen.credit_annotation()])
        asked.set()
        await release.wait()
        yield ndjson([gen.credit_annotation()])

    async with api_client(settings, pool_max_size=2) as (client, _):  # one job slot
        slow = asyncio.create_task(client.post(JOBS, content=slow_body(), headers=NDJSON))
        await asyncio.wait_for(asked.wait(), 10)
        busy = await client.post(JOBS, content=ndjson([gen.credit_annotation()]), headers=NDJSON)
        assert busy.status_code == 503
        assert busy.headers["retry-after"] == "5"
        tx = await client.post("/v1/transactions", json=gen.transaction())
        assert tx.status_code == 202  # single requests still find a connection
        release.set()
        done = await slow
        assert done.status_code == 202
        assert done.json()["accepted"] == 2


async def test_job_status_errors(make_settings) -> None:
    settings = make_settings()
    async with api_client(settings) as (client, _):
        missing = await client.get(f"{JOBS}/{uuid.uuid4()}")
        assert missing.status_code == 404
        assert missing.json()["detail"].startswith("no credit-annotation job")
        malformed = await client.get(f"{JOBS}/not-a-uuid")
        assert malformed.status_code == 422
        assert malformed.json()["detail"].startswith("path.job_id:")
        assert (await client.get("/v1/nothing")).status_code == 404
        assert (await client.put("/v1/transactions")).status_code == 405


async def test_health_ready_metrics_and_openapi(make_settings) -> None:
    settings = make_settings()
    gen = Generator.create(10)
    async with api_client(settings) as (client, _):
        assert (await client.get("/healthz")).text == "ok\n"
        ready = await client.get("/readyz")
        assert (ready.status_code, ready.text) == (200, "database up\n")
        await client.post(JOBS, content=ndjson([gen.credit_annotation()]), headers=NDJSON)
        metrics = (await client.get("/metrics")).text
        assert "bulk_recorder_outbox_backlog 1.0" in metrics
        assert "bulk_recorder_outbox_oldest_age_seconds" in metrics
        assert 'bulk_recorder_api_job_lines_total{outcome="accepted"} 1.0' in metrics
        assert (
            'bulk_recorder_api_requests_total{route="/v1/credit-annotation-jobs",status="202"} 1.0'
            in metrics
        )
        spec = (await client.get("/openapi.json")).json()
    assert set(spec["paths"]) >= {
        "/v1/transactions",
        "/v1/credit-annotation-jobs",
        "/v1/credit-annotation-jobs/{job_id}",
        "/healthz",
        "/readyz",
        "/metrics",
    }
    post_tx = spec["paths"]["/v1/transactions"]["post"]
    assert post_tx["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/TransactionIn"
    }
    assert {p["name"] for p in post_tx["parameters"]} == {"Idempotency-Key"}
    schemas = spec["components"]["schemas"]
    assert {"TransactionIn", "OperationIn", "CreditAnnotationIn", "JobStatus"} <= set(schemas)
    job_body = spec["paths"]["/v1/credit-annotation-jobs"]["post"]["requestBody"]["content"]
    # Every media type the API takes is documented; NDJSON and CSV as text a client can send.
    assert set(job_body) == set(CONTENT_TYPES)
    assert job_body["application/x-ndjson"]["x-itemSchema"] == {
        "$ref": "#/components/schemas/CreditAnnotationIn"
    }
    for media, name in (
        ("application/x-ndjson", "CreditAnnotationLines"),
        ("text/csv", "CreditAnnotationCsv"),
    ):
        assert job_body[media]["schema"] == {"$ref": f"#/components/schemas/{name}"}
        assert schemas[name]["type"] == "string"
        assert re.search(schemas[name]["pattern"], schemas[name]["examples"][0])


async def test_readyz_is_503_when_the_database_goes_away(make_settings, services) -> None:
    settings = make_settings()
    async with api_client(settings) as (client, _):
        assert (await client.get("/readyz")).status_code == 200
        import asyncpg

        admin = await asyncpg.connect(services.database_url)
        try:
            name = settings.database_url.rsplit("/", 1)[1]
            # Terminate the API's connections and forbid new ones, briefly.
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", name
            )
            ready = await client.get("/readyz")
            assert ready.status_code == 503
            posted = await client.post("/v1/transactions", json=Generator.create(11).transaction())
            assert posted.status_code == 503
            assert posted.headers["retry-after"] == "1"
        finally:
            await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
            await admin.close()
        await wait_for(lambda: _ready(client), timeout=15)


async def _ready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/readyz")).status_code == 200


async def test_mangled_bodies_never_get_a_5xx(make_settings) -> None:
    """Valid bodies with random bytes flipped, cut or repeated: always a 2xx or a 4xx."""
    settings = make_settings()
    gen = Generator.create(14)
    rng = random.Random(14)
    tx = json.dumps(gen.transaction()).encode()
    lines = ndjson([gen.credit_annotation() for _ in range(3)])
    csv_body = (
        "id,document,kind,creditor,amount,occurred_on\n"
        + "".join(
            f"{a['id']},{a['document']},{a['kind']},x,{a['amount']},{a['occurred_on']}\n"
            for a in (gen.credit_annotation() for _ in range(3))
        )
    ).encode()
    array = json.dumps([gen.credit_annotation() for _ in range(3)]).encode()
    cases = [
        ("/v1/transactions", "application/json", tx),
        (JOBS, "application/x-ndjson", lines),
        (JOBS, "text/csv", csv_body),
        (JOBS, "application/json", array),
    ]
    statuses = []
    async with api_client(settings) as (client, _):
        for i in range(240):
            path, ctype, body = cases[i % len(cases)]
            mangled = bytearray(body)
            for _ in range(rng.randint(1, 4)):
                how = rng.random()
                at = rng.randrange(len(mangled))
                if how < 0.5:
                    mangled[at] = rng.choice(b'{}[]",:\\\n\r 0x\xff\xc3')
                elif how < 0.75:
                    del mangled[at:]
                    if not mangled:
                        break
                else:
                    mangled[at:at] = mangled[: rng.randrange(1, 40)]
            response = await client.post(
                path, content=bytes(mangled), headers={"content-type": ctype}
            )
            assert response.status_code < 500, (path, bytes(mangled), response.text)
            if response.status_code >= 400:
                assert response.json()["detail"], response.text
            statuses.append(response.status_code)
    assert {202, 400, 422} <= set(statuses)


# -- a real uvicorn process -----------------------------------------------------------------


async def test_real_api_process_streams_a_job_drops_a_cut_upload_and_stops_on_sigterm(
    make_settings, db, tmp_path: Path
) -> None:
    port = free_port()
    settings = make_settings(api_port=port)
    log_path = tmp_path / "api.log"
    base = f"http://127.0.0.1:{port}"
    gen = Generator.create(12)
    key = await provision_key(settings.database_url)
    async with (
        running_api(settings, log_path) as proc,
        httpx.AsyncClient(base_url=base, timeout=30, headers=bearer(key)) as client,
    ):

        async def chunks():  # a chunked upload, 500 lines at a time
            for _ in range(4):
                yield ndjson([gen.credit_annotation() for _ in range(500)])

        response = await client.post(JOBS, content=chunks(), headers=NDJSON)
        assert response.status_code == 202, response.text
        assert response.json()["accepted"] == 2000

        # An upload cut in the middle: the job's transaction rolls back.
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        partial = ndjson([gen.credit_annotation() for _ in range(100)])
        writer.write(
            f"POST {JOBS} HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/x-ndjson\r\nContent-Length: {len(partial) * 10}"
            "\r\n\r\n".encode()
            + partial
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()

        async def cut_seen() -> bool:
            text = (await client.get("/metrics")).text
            return 'route="/v1/credit-annotation-jobs",status="400"' in text

        await wait_for(cut_seen, timeout=30)
        conn = await db()
        assert await count(conn, "credit_annotation_jobs") == 1
        assert await count(conn, "outbox") == 2000
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    log = log_path.read_text()
    assert "ingest API ready: transactions async (outbox, 202)" in log
    assert "client disconnected before the body was complete" in log
