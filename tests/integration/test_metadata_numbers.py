"""A metadata number is accepted exactly when PostgreSQL's jsonb stores it, whatever its spelling.

PostgreSQL 15's numeric holds up to 131,072 digits before the decimal point and 16,383 after
(the scale as written: trailing zeros count, an exponent moves the point), and it reads an
exponent of 1,073,741,823 or more either way as out of range before it counts any digit, even
on a zero. The values here sit on each side of each limit, written plainly and with an
exponent; each one is put to the real server (``SELECT $1::jsonb``) and through ``decode``
and the writer: decode accepts exactly what the server stores, and what it accepts lands. A
property test draws more about the same limits, and the API answers each as decode does.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from decimal import Decimal
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bulk_recorder.infra.migrate import migrate
from bulk_recorder.recorder.writer import PgWriter
from bulk_recorder.records import RecordError, Transaction, decode
from consumer.tools.generator import Generator
from tests.conftest import Services
from tests.integration.producer_support import api_client

pytestmark = [pytest.mark.postgres]

# (number as written, whether PostgreSQL 15 stores it): the expectation is checked against the
# server too, so a server with other limits fails here first.
BOUNDARIES: tuple[tuple[str, bool], ...] = (
    ("0." + "1" * 16_383, True),  # 16,383 digits after the point
    ("0." + "1" * 16_384, False),
    ("-0." + "1" * 16_382 + "0", True),  # a trailing zero is a digit PostgreSQL keeps
    ("0." + "1" * 16_383 + "0", False),
    ("1e-16383", True),
    ("1e-16384", False),
    ("0.0e-16382", True),  # zero, scale 16,383
    ("0.0e-16383", False),
    ("10e-16384", False),  # the value 1e-16383, written with a scale of 16,384
    ("1.5e-16382", True),
    ("1e131071", True),  # 131,072 digits before the point
    ("1e131072", False),
    ("-9.9e131071", True),
    ("99E+131070", True),
    ("99E+131071", False),
    ("0e200000", True),  # zero has no digits before the point
    ("1e1001", True),  # once refused ("exponent beyond 1000") though stored
    ("1" + "0" * 1001, True),  # the same number written plainly
    ("1e-1001", True),
    ("0." + "0" * 1000 + "1", True),
    # The exponent as written, at 1,073,741,822 and either side: a zero has no digits to count,
    # yet PostgreSQL refuses 0e1073741823, whatever the digits after its point.
    ("0e1073741822", True),
    ("0e1073741823", False),
    ("0e1073741824", False),
    ("-0E+1073741822", True),
    ("-0E+1073741823", False),
    ("-0e1073741824", False),
    ("0.000e1073741822", True),  # Decimal reads 0E+1073741819
    ("0.000e1073741823", False),  # Decimal reads 0E+1073741820, which 0e1073741820 also is
    ("0.000e1073741824", False),
    ("0e+0001073741822", True),
    ("0e00000000000000000001073741823", False),
    ("0e-16383", True),  # a zero's negative exponent: its scale, bounded long before
    ("0e-16384", False),
    ("0.000e-16380", True),
    ("0.000e-16381", False),
    ("-0.0e-1073741822", False),
    ("0e-1073741823", False),
    ("0e-1073741824", False),
    ("1e1073741822", False),  # not zero: far past 131,072 digits already
    ("-1.5E+1073741823", False),
    ("1e-1073741822", False),
    ("-1e-1073741824", False),
    # Exponents beyond Decimal's own (its Emax is 999999999999999999): once "internal error
    # while decoding: InvalidOperation", the reason meant for a bug.
    ("1e99999999999999999999", False),
    ("-1e99999999999999999999", False),
    ("1e-99999999999999999999", False),
    ("-1e-99999999999999999999", False),
    ("0e99999999999999999999", False),
    ("-0.0E-99999999999999999999", False),
    # Whole, past the interpreter's digit limit once explain re-encodes it (the digit run
    # skips the first pass): once "internal error while decoding: ValidationError".
    ("1." + "0" * 16_380 + "e16380", True),
)
# Where a number sits in the metadata: an object, an array, arrays and objects mixed.
PLACES = ('{"x": %s}', '{"x": [%s]}', '{"x": [1, {"y": [[%s]]}]}')


def _body(number: str, seed: int = 27, place: str = PLACES[0], unknown: bool = False) -> bytes:
    """A transaction with ``number`` in its metadata; with an unknown field, which the first
    pass refuses, so that explain's parse (not the first pass's) reads the metadata."""
    return _transaction(seed, unknown).replace(b'"__M__"', (place % number).encode())


@functools.cache
def _transaction(seed: int, unknown: bool) -> bytes:
    raw = Generator.create(seed=seed).transaction()  # a tenth of a second: made once
    for op in raw["operations"]:
        op["amount"] = raw["amount"]
    raw["metadata"] = "__M__"
    if unknown:
        raw["note"] = 1
    return json.dumps(raw).encode()


async def _server_stores(conn: asyncpg.Connection, number: str, place: str = PLACES[0]) -> bool:
    try:
        await conn.fetchval("SELECT $1::jsonb", place % number)
    except asyncpg.NumericValueOutOfRangeError:
        return False
    return True


REFUSED = "metadata: number out of range (at most 131072 digits before the point and 16383 after)"


def _decoded(number: str, place: str = PLACES[0], unknown: bool = False) -> Transaction | str:
    """The record, or the reason it was refused."""
    try:
        record = decode(_body(number, place=place, unknown=unknown), "transaction")
    except RecordError as exc:
        return exc.reason
    assert isinstance(record, Transaction)
    return record


async def test_metadata_number_accepted_exactly_when_postgresql_stores_it(
    database_url: str,
) -> None:
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        stores = {number: await _server_stores(conn, number) for number, _ in BOUNDARIES}
        assert stores == dict(BOUNDARIES)  # the limits are the server's
        accepted = {number: _decoded(number) for number, _ in BOUNDARIES}
        wrong = {
            number[:24]: (record if isinstance(record, str) else "accepted", stores[number])
            for number, record in accepted.items()
            if (record if isinstance(record, str) else None)
            != (None if stores[number] else REFUSED)
        }
        assert wrong == {}, "(what decode said, whether PostgreSQL stores it)"
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
        try:
            for number, record in accepted.items():
                if isinstance(record, Transaction):
                    await PgWriter(pool).write([record])
                    stored = await conn.fetchval(
                        "SELECT metadata->>'x' FROM transactions WHERE id = $1", record.id
                    )
                    assert Decimal(stored) == Decimal(number)
                    await conn.execute("TRUNCATE transactions CASCADE")
        finally:
            await pool.close()
    finally:
        await conn.close()


async def test_the_api_answers_each_metadata_number_as_postgresql_stores_it(
    make_settings: Any, db: Any
) -> None:
    """Through a real API (sync mode: the 201 is the row written): every boundary number is
    201 and stored, or 422 with the digits' reason, exactly as the server stores it."""
    settings = make_settings(rabbitmq_transaction_async=False)
    answers = {}
    async with api_client(settings) as (client, _):
        for n, (number, _) in enumerate(BOUNDARIES):
            response = await client.post(
                "/v1/transactions",
                content=_body(number, seed=n),
                headers={"content-type": "application/json"},
            )
            answers[number] = (response.status_code, response.json().get("detail"))
    expected = {number: (201, None) if stores else (422, REFUSED) for number, stores in BOUNDARIES}
    assert {k[:24]: v for k, v in answers.items()} == {k[:24]: v for k, v in expected.items()}
    conn = await db()
    stored = [
        Decimal(text)
        for text in await conn.fetch("SELECT metadata->>'x' FROM transactions")
        for text in text
    ]
    assert sorted(stored) == sorted(Decimal(number) for number, stores in BOUNDARIES if stores)


# Exponents about each limit PostgreSQL has: the scale (16,383), the digits before the point
# (131,072), the exponent as written (1,073,741,822); anywhere up to 2**31; beyond Decimal's.
_LIMITS = (16_383, 131_071, 131_072, 1_073_741_822)
_EXPONENTS = (
    st.sampled_from(_LIMITS).flatmap(lambda limit: st.integers(limit - 4, limit + 4))
    | st.integers(0, 2**31)
    | st.integers(10**17, 10**22)
)


@st.composite
def json_numbers(draw: st.DrawFn) -> str:
    """A JSON number with a fraction or an exponent (the ones the rule judges: an integer is
    stored whatever its size, up to the interpreter's digit limit), zeros as often as not."""
    sign = draw(st.sampled_from(["", "-"]))
    whole = draw(
        st.sampled_from(["0", "0", "0", "1", "9", "10", "1000"]) | st.integers(0, 10**40).map(str)
    )
    fraction = draw(
        st.sampled_from(["", "", ".0", ".000", ".5", ".001", ".250"])
        | st.integers(16_380, 16_386).map(lambda n: "." + "0" * n)
        | st.integers(16_380, 16_386).map(lambda n: "." + "0" * (n - 1) + "7")
    )
    exponent = ""
    if not fraction or draw(st.booleans()):
        marker = draw(st.sampled_from(["e", "E"]))
        exponent_sign = draw(st.sampled_from(["", "+", "-"]))
        zeros = draw(st.sampled_from(["", "", "0", "000"]))
        exponent = f"{marker}{exponent_sign}{zeros}{draw(_EXPONENTS)}"
    return f"{sign}{whole}{fraction}{exponent}"


def test_property_decode_refuses_a_metadata_number_exactly_when_postgresql_does(
    services: Services,
) -> None:
    """Drawn numbers, zeros included, put to the server (``SELECT $1::jsonb`` on the
    maintenance database: nothing is written) and to decode, by the first pass or explain's:
    decode refuses, with the documented reason, exactly what PostgreSQL refuses. Over 311
    numbers every disagreement once was a zero with an exponent of 1,073,741,823 or more."""
    with asyncio.Runner() as runner:
        conn = runner.run(asyncpg.connect(services.database_url))

        @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(number=json_numbers(), place=st.sampled_from(PLACES), unknown=st.booleans())
        def agree(number: str, place: str, unknown: bool) -> None:
            stores = runner.run(_server_stores(conn, number, place))
            decoded = _decoded(number, place, unknown)
            assert (decoded if isinstance(decoded, str) else None) == (None if stores else REFUSED)

        try:
            agree()
        finally:
            runner.run(conn.close())


# Numbers PostgreSQL refuses only by their exponent, or that Decimal cannot hold: each sign of
# mantissa and of exponent.
EXPONENT_REFUSED = (
    "0e1073741823",
    "-0.000E+1073741823",
    "0e-1073741823",
    "1e99999999999999999999",
    "-1e99999999999999999999",
    "1e-99999999999999999999",
    "-1e-99999999999999999999",
)


async def test_the_api_refuses_what_postgresql_would_refuse_by_its_exponent(
    make_settings: Any, db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Async mode (the default) answered ``{"x":0e1073741823}`` 202, and the recorder met
    ``22003 value overflows numeric format`` on every delivery, then dead-lettered it; an
    exponent beyond Decimal's was refused as an internal error with a WARNING. Now each is
    422 with the documented reason, in an object or an array, nothing logged and nothing in
    the outbox."""
    settings = make_settings(rabbitmq_transaction_async=True)
    answers = {}
    async with api_client(settings) as (client, _):
        with caplog.at_level(logging.WARNING):
            for n, (number, place) in enumerate(
                (number, place) for number in EXPONENT_REFUSED for place in PLACES
            ):
                response = await client.post(
                    "/v1/transactions",
                    content=_body(number, seed=n, place=place),
                    headers={"content-type": "application/json"},
                )
                answers[number, place] = (response.status_code, response.json().get("detail"))
    assert answers == {key: (422, REFUSED) for key in answers}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    conn = await db()
    assert await conn.fetchval("SELECT count(*) FROM outbox") == 0
