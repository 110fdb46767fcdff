"""Bad input never costs good data: each bad message reaches the DLQ with a clear reason while
its batch-mates are recorded; bad settings stop `consume` at start-up naming the variable."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from bulk_recorder.records import RecordError, decode
from consumer.delivery import ERROR_HEADER
from consumer.tools.generator import Generator
from settings import Settings
from tests.conftest import wait_for
from tests.faults.audit import settled_count
from tests.faults.conftest import REPO, settings_env

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq]

MAX_BYTES = 8192


def _dump(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def _edit(make: Callable[[], dict[str, Any]], change: Callable[[dict[str, Any]], Any]) -> bytes:
    record = make()
    change(record)
    return _dump(record)


def _oversized(record: dict[str, Any]) -> bytes:
    """A valid record padded to exactly one byte over the limit."""
    record["reason"] = ""
    record["reason"] = "x" * (MAX_BYTES + 1 - len(_dump(record)))
    body = _dump(record)
    assert len(body) == MAX_BYTES + 1
    return body


TX, ANN = "transaction", "credit_annotation"


def bad_inputs(gen: Generator) -> list[tuple[str, bytes, str | None, str]]:
    """(what, body, type property, what the reason must say)."""

    def tx(change: Callable[[dict[str, Any]], Any]) -> bytes:
        return _edit(gen.transaction, change)

    def ann(change: Callable[[dict[str, Any]], Any]) -> bytes:
        return _edit(gen.credit_annotation, change)

    nested: Any = 1
    for _ in range(40):
        nested = {"a": nested}
    # 1e400 is beyond a double but jsonb keeps it exactly (accepted); an exponent this large is
    # beyond what PostgreSQL's numeric can hold, so it is refused here with a reason.
    inf_metadata = tx(lambda t: t.update(metadata={"n": 0})).replace(b'"n": 0', b'"n": 1e999999')
    surrogate = _dump(gen.credit_annotation()).replace(b'"Banco', b'"\\ud800Banco')
    return [
        ("not JSON", b"{nope", TX, "invalid JSON"),
        ("NaN is not JSON", b'{"amount": NaN}', ANN, "invalid JSON"),
        ("JSON array", b"[1, 2]", TX, "must be a JSON object"),
        ("JSON string", b'"hello"', ANN, "must be a JSON object"),
        ("JSON null", b"null", TX, "must be a JSON object"),
        ("unknown type", _dump(gen.transaction()), "refund", "unknown type: refund"),
        ("missing type", _dump(gen.transaction()), None, "missing type"),
        ("missing field", tx(lambda t: t.pop("ledger_id")), TX, "ledger_id: missing"),
        ("missing operations", tx(lambda t: t.pop("operations")), TX, "operations: missing"),
        ("one operation", tx(lambda t: t["operations"].pop()), TX, "at least 2"),
        ("bool amount", tx(lambda t: t.update(amount=True)), TX, "not a boolean"),
        ("number creditor", ann(lambda a: a.update(creditor=5)), ANN, "must be a string"),
        ("string operations", tx(lambda t: t.update(operations="x")), TX, "must be an array"),
        ("invalid status", tx(lambda t: t.update(status="DONE")), TX, "must be one of"),
        ("invalid UUID", tx(lambda t: t.update(id="0193a3c4-xxxx")), TX, "id: invalid UUID"),
        (
            "invalid UUID in an operation",
            tx(lambda t: t["operations"][0].update(account_id="42")),
            TX,
            "operations[0].account_id: invalid UUID",
        ),
        (
            "CPF check digits",
            ann(lambda a: a.update(document="529.982.247-26")),
            ANN,
            "invalid CPF check digits",
        ),
        (
            "CPF length",
            ann(lambda a: a.update(document="529.982.247-2")),
            ANN,
            "must be a CPF (11 digits) or CNPJ",
        ),
        (
            "CNPJ check digits",
            ann(lambda a: a.update(document="11.222.333/0001-82")),
            ANN,
            "invalid CNPJ check digits",
        ),
        (
            "alphanumeric CNPJ check digits",
            ann(lambda a: a.update(document="12.ABC.345/01DE-36")),
            ANN,
            "invalid CNPJ check digits",
        ),
        (
            "CNPJ length",
            ann(lambda a: a.update(document="11.222.333/0001-8")),
            ANN,
            "must be a CPF (11 digits) or CNPJ",
        ),
        ("negative amount", ann(lambda a: a.update(amount="-1.00")), ANN, "must be >= 0"),
        ("negative integer", ann(lambda a: a.update(amount=-5)), ANN, "must be >= 0"),
        ("zero transaction", tx(lambda t: t.update(amount="0")), TX, "amount: must be > 0"),
        ("non-numeric amount", ann(lambda a: a.update(amount="12,50")), ANN, "invalid decimal"),
        ("float amount", tx(lambda t: t.update(amount=150.1)), TX, "not a float"),
        (
            "too many decimals",
            ann(lambda a: a.update(amount="1." + "1" * 19)),
            ANN,
            "more than 18 decimal places",
        ),
        (
            "unbalanced",
            tx(lambda t: t["operations"][1].update(amount="0.01")),
            TX,
            "!= credits 0.01",
        ),
        (
            "mixed assets",
            tx(lambda t: t["operations"][1].update(asset_code="USD")),
            TX,
            "USD != transaction asset BRL",
        ),
        ("NUL in text", tx(lambda t: t.update(description="a\u0000b")), TX, "contains NUL"),
        ("NUL in metadata", tx(lambda t: t.update(metadata={"k": "\u0000"})), TX, "contains NUL"),
        ("NUL in creditor", ann(lambda a: a.update(creditor="x\u0000")), ANN, "contains NUL"),
        ("huge amount", ann(lambda a: a.update(amount="1" + "0" * 30)), ANN, "out of range"),
        ("huge integer", ann(lambda a: a.update(amount=10**40)), ANN, "out of range"),
        ("number beyond numeric", inf_metadata, TX, "metadata: number out of range"),
        ("number of 4,500 digits", b'{"n": ' + b"9" * 4500 + b"}", TX, "invalid JSON"),
        (
            "oversized body",
            _oversized(gen.credit_annotation()),
            ANN,
            f"body too large ({MAX_BYTES + 1} bytes > {MAX_BYTES})",
        ),
        ("deep nesting", tx(lambda t: t.update(metadata=nested)), TX, "nesting deeper than 32"),
        ("invalid UTF-8", b'{"id": "\xff\xfe"}', TX, "not valid UTF-8"),
        ("Latin-1 text", '{"creditor": "Jo\u00e3o"}'.encode("latin-1"), ANN, "not valid UTF-8"),
        ("UTF-16", _dump(gen.credit_annotation()).decode().encode("utf-16"), ANN, "UTF-8"),
        ("lone surrogate", surrogate, ANN, "creditor: invalid unicode"),
        (
            "naive timestamp",
            tx(lambda t: t.update(created_at="2026-01-01T00:00:00")),
            TX,
            "timezone required",
        ),
        ("impossible date", ann(lambda a: a.update(occurred_on="2026-02-30")), ANN, "invalid date"),
    ]


async def test_each_bad_message_reaches_the_dlq_with_its_reason_and_batch_mates_are_recorded(
    make_settings, start_recorder, broker, db
) -> None:
    gen = Generator.create(seed=61)
    settings = make_settings(
        bulk_recorder_max_message_bytes=MAX_BYTES,
        bulk_recorder_size=25,
        bulk_recorder_flush_timeout_ms=200,
    )
    bad = bad_inputs(gen)
    assert len({body for _, body, _, _ in bad}) == len(bad)
    # Valid but extreme: a 400-digit number in metadata is kept exactly (jsonb numeric).
    big = gen.transaction()
    big["metadata"] = {"n": 10**400}
    good: list[dict[str, Any]] = [big]
    messages: list[tuple[bytes, str | None]] = [(_dump(big), "transaction")]
    for _, body, record_type, _ in bad:
        mate = gen.record(("transaction", "credit_annotation")[len(good) % 2])
        good.append(mate)
        messages += [
            (body, record_type),
            (_dump(mate), "transaction" if "operations" in mate else "credit_annotation"),
        ]

    rec = await start_recorder(settings)
    await broker.publish_many(messages)
    await wait_for(
        lambda: (
            rec.value("bulk_recorder_messages_acked_total") == len(good)
            and sum(
                rec.value("bulk_recorder_messages_dead_lettered_total", reason=r)
                for r in ("decode", "type", "validation")
            )
            == len(bad)
        )
    )
    await rec.shutdown()

    conn = await db()
    ids = {str(r[0]) for r in await conn.fetch("SELECT id FROM transactions")}
    ids |= {str(r[0]) for r in await conn.fetch("SELECT id FROM credit_annotations")}
    assert ids == {r["id"] for r in good}
    stored = await conn.fetchval("SELECT metadata->>'n' FROM transactions WHERE id = $1", big["id"])
    assert stored == str(10**400)

    dead = {m.body: m for m in await broker.drain(broker.topology.dead_letter_queue)}
    assert len(dead) == len(bad)
    problems = []
    for what, body, record_type, expected in bad:
        message = dead[body]
        reason = str(message.headers[ERROR_HEADER])
        if expected not in reason:
            problems.append(f"{what}: {reason!r} does not say {expected!r}")
        with pytest.raises(RecordError) as refused:
            decode(body, record_type, max_bytes=MAX_BYTES)
        assert reason == refused.value.reason, what
        assert message.type == record_type, what  # the original properties travel with it
        assert message.headers["x-bulk-recorder-original-exchange"] == settings.rabbitmq_exchange
    assert problems == []
    assert await settled_count(broker, broker.topology.queue) == 0
    print(
        f"bad inputs {len(bad)}, dead-lettered with their reason {len(bad) - len(problems)}; "
        f"batch-mates {len(good)}, recorded {len(ids)}"
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("RABBITMQ_NUMBERS_OF_WORKERS", "zero"),
        ("RABBITMQ_NUMBERS_OF_PREFETCH", "0"),
        ("BULK_RECORDER_SIZE", "-1"),
        ("BULK_RECORDER_FLUSH_TIMEOUT_MS", "0"),
        ("BULK_RECORDER_ENABLED", "maybe"),
        ("BULK_RECORDER_MAX_MESSAGE_BYTES", "10"),
        ("BULK_RECORDER_RELEASE_AFTER_S", "0"),
        ("BULK_RECORDER_DB_COMMAND_TIMEOUT_S", "-1"),
        ("DATABASE_URL", "mysql://localhost/db"),
        ("RABBITMQ_URL", "http://localhost"),
        ("METRICS_PORT", "70000"),
        ("LOG_LEVEL", "LOUD"),
    ],
)
def test_a_bad_setting_stops_consume_naming_the_variable(variable: str, value: str) -> None:
    env = settings_env(Settings())
    env[variable] = value
    done = subprocess.run(
        [sys.executable, "-m", "consumer"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr  # the documented exit code for bad settings
    assert variable in done.stderr, done.stderr
    assert value in done.stderr, done.stderr  # the offending value is shown too
    assert "Traceback" not in done.stderr
