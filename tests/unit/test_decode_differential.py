"""The msgspec decoder gives every body the verdict and the reason the hand-written one gave.

The old decoder is kept as the oracle in ``tests/unit/decode_oracle.py``. Each body goes to both;
they must agree on accept/reject, on the reason text (the DLQ header), and on the record itself
(``repr``, so an amount's scale counts): every case of ``test_records.py`` (its tests run again
here with ``decode`` answering through both), the fault suite's bad messages and the load
generator's invalid kinds, and bodies hypothesis draws -- big integers, NaN/Infinity, duplicate
keys, deep nesting, huge strings, lone surrogates, NUL, invalid UTF-8, a BOM.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bulk_recorder.records import RecordError, decode
from consumer.tools.generator import Generator, valid_document
from tests.faults.conftest import SOAK
from tests.faults.test_bad_input import MAX_BYTES, bad_inputs
from tests.unit import decode_oracle, test_records
from tests.unit.test_records import *  # noqa: F403 - its tests run again here, through both

# It swaps the new decoder's builders for a broken one: not a verdict to compare.
globals().pop("test_unexpected_exception_becomes_record_error")

Verdict = tuple[str, str]  # ("accepted", repr of the record) or ("rejected", reason)
compared = {"bodies": 0}


def _verdict(decoder: Callable[..., Any], body: bytes, record_type: str | None, **kw: Any) -> Any:
    try:
        return decoder(body, record_type, **kw)
    except RecordError as exc:
        return exc


def both(body: bytes, record_type: str | None, **kw: Any) -> Any:
    """``decode`` through the old and the new decoder; they must agree. Answers as ``decode``."""
    old = _verdict(decode_oracle.decode, body, record_type, **kw)
    new = _verdict(decode, body, record_type, **kw)
    compared["bodies"] += 1
    if not _near_the_recursion_limit(body, _words(old), _words(new)):
        assert _words(new) == _words(old), body[:300]
    if isinstance(new, RecordError):
        raise new
    return new


DEEP_OR_BAD = {("rejected", "invalid JSON"), ("rejected", "JSON nesting deeper than 32 levels")}


def _near_the_recursion_limit(body: bytes, old: Verdict, new: Verdict) -> bool:
    """The one place the reasons may differ: a body malformed *and* nested some 1000 levels
    deep. Which fault the old parser met first depended on the interpreter's stack at the call
    (its recursion limit counts the caller's frames); msgspec's limit is a few levels further.
    Both refuse the body, with one of the two reasons."""
    return {old, new} == DEEP_OR_BAD and body.count(b"[") + body.count(b"{") >= 900


def _words(outcome: Any) -> Verdict:
    if isinstance(outcome, RecordError):
        return ("rejected", outcome.reason)
    return ("accepted", repr(outcome))


@pytest.fixture(autouse=True)
def _decode_through_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(test_records, "decode", both)


# -- the fault suite's bad messages and the load generator's invalid kinds -------------------


def test_the_fault_suites_bad_messages_get_the_same_reasons() -> None:
    bad = bad_inputs(Generator.create(seed=61))
    for _what, body, record_type, _expected in bad:
        with pytest.raises(RecordError):
            both(body, record_type, max_bytes=MAX_BYTES)
    assert len(bad) > 40


def test_the_load_generators_invalid_kinds_get_the_same_reasons() -> None:
    gen = Generator.create(seed=7)
    for n in range(30):
        body, record_type, _what = gen.invalid(n)
        with pytest.raises(RecordError):
            both(body, record_type)
    for _ in range(50):
        both(json.dumps(gen.transaction()).encode(), "transaction")
        both(json.dumps(gen.credit_annotation()).encode(), "credit_annotation")


# -- hypothesis: bodies written token by token ------------------------------------------------


class Raw:
    """JSON text written as is: what json.dumps cannot (or will not) write."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Raw({self.text[:40]!r})"


class Pairs(list[tuple[str, Any]]):
    """An object that may repeat a key."""


def write(node: Any) -> str:
    if isinstance(node, Raw):
        return node.text
    if isinstance(node, Pairs):
        return "{" + ",".join(f"{json.dumps(k)}: {write(v)}" for k, v in node) + "}"
    if isinstance(node, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {write(v)}" for k, v in node.items()) + "}"
    if isinstance(node, list):
        return "[" + ",".join(write(v) for v in node) + "]"
    return json.dumps(node)


RAW_TOKENS = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1" + "0" * 4300,  # at the interpreter's digit limit
    "1" + "0" * 4301,  # over it
    "-" + "9" * 4400,
    "1e400",
    "1e999999",
    "1E-1001",
    "0." + "0" * 1001 + "1",
    "-0",
    "-0.0",
    "1.0",
    "0.30000000000000000001",
    "150.1",
    '"\\ud800"',
    '"x\\udfffy"',
    '"\\ud83d\\ude00"',
    '"\\ud800\\ud83d\\ude00"',
    '"\\\\ud800"',
    '"a\\u0000b"',
    '"\\u00e9\\/"',
    "[" * 33 + "]" * 33,
    "[" * 32 + "]" * 32,
    "[" * 31 + "]" * 31,
    "{" + '"a":{' * 31 + "}" * 32,
    "[" * 1200 + "]" * 1200,
    "[1,,2]",
    "tru",
    "",
    "0e1073741822",  # PostgreSQL bounds an exponent as written, even a zero's
    "0.000e1073741823",
    "-0e-1073741823",
    "1e99999999999999999999",  # beyond Decimal's exponents
    "-1.5E-99999999999999999999",
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**25), max_value=10**25)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(RAW_TOKENS).map(Raw)
)
wild = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


def _formatted(doc: str) -> str:
    if len(doc) == 11:
        return f"{doc[:3]}.{doc[3:6]}.{doc[6:9]}-{doc[9:]}"
    return f"{doc[:2]}.{doc[2:5]}.{doc[5:8]}/{doc[8:12]}-{doc[12:]}"


_rng = random.Random(5)
DOCUMENTS = [valid_document(_rng, kind) for kind in ("CPF", "CNPJ") * 10]
WIDE = st.sampled_from(["", " ", "x" * 1001, "x" * 70_000, "a\x00", "\t\n"])

uuid_values = (
    st.uuids().map(str)
    | st.uuids().map(lambda u: str(u).upper())
    | st.uuids().map(lambda u: u.hex)
    | st.uuids().map(lambda u: f"{u}\n")
    | st.just(test_records.OP1_ID)
    | st.just(test_records.TX_ID)
)
amount_values = (
    st.from_regex(r"-?[0-9]{0,22}(\.[0-9]{0,20})?", fullmatch=True)
    | st.integers(min_value=-(10**21), max_value=10**21)
    | st.sampled_from(["150.00", "150", 150, "0", 0, "1e3", " 1", "\u0661"])
    | st.decimals(allow_nan=False, allow_infinity=False, places=3).map(lambda d: Raw(str(d)))
)
text_values = st.text(max_size=30) | WIDE | st.sampled_from(RAW_TOKENS[15:22]).map(Raw)
date_values = (
    st.dates().map(lambda d: d.isoformat())
    | st.from_regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", fullmatch=True)
    | st.sampled_from(["2026-02-30", "2026-11-20T00:00:00", "2026-1-20", "0000-01-01"])
)
datetime_values = (
    st.datetimes().map(lambda d: d.isoformat())
    | st.datetimes().map(lambda d: d.isoformat() + "Z")
    | st.datetimes().map(lambda d: d.isoformat(sep=" ") + "-03:00")
    | st.sampled_from(["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00", "20261129T1200Z"])
)
choice_values = st.sampled_from(
    ["PENDING", "APPROVED", "CANCELED", "RESTRICTION", "RELEASE", "DEBIT", "CREDIT", "debit", ""]
)
asset_values = st.from_regex(r"[A-Z][A-Z0-9]{0,10}", fullmatch=True) | st.sampled_from(
    ["BRL", "USD", "brl", "1BR", ""]
)
document_values = (
    st.sampled_from(DOCUMENTS)
    | st.sampled_from(DOCUMENTS).map(_formatted)
    | st.sampled_from(DOCUMENTS).map(str.lower)
    | st.from_regex(r"[0-9A-Z.\-/ ]{10,19}", fullmatch=True)
    | st.sampled_from(["11111111111", "123", ""])
)
metadata_values = st.dictionaries(st.text(max_size=6), wild, max_size=5) | st.sampled_from(
    [{"k": "x" * 65_528}, {"k": "x" * 65_529}, {"k": "\u00e9" * 40_000}]
)

FIELD_VALUES: dict[str, Any] = {
    "id": uuid_values,
    "organization_id": uuid_values,
    "ledger_id": uuid_values,
    "account_id": uuid_values,
    "job_id": uuid_values | st.none(),
    "description": text_values | st.none(),
    "creditor": text_values,
    "reason": text_values | st.none(),
    "status": choice_values,
    "kind": choice_values,
    "type": choice_values,
    "asset_code": asset_values,
    "amount": amount_values,
    "created_at": datetime_values | st.none(),
    "occurred_on": date_values,
    "document": document_values,
    "metadata": metadata_values | st.none(),
}


def _value(data: st.DataObject, key: str) -> Any:
    strategy = FIELD_VALUES.get(key, wild)
    return data.draw(strategy | wild if data.draw(st.booleans()) else strategy)


def _mutate(data: st.DataObject, obj: dict[str, Any]) -> Any:
    """Change, drop, repeat and add keys of one object."""
    keys = list(obj)
    for key in data.draw(st.lists(st.sampled_from(keys), max_size=3, unique=True)):
        action = data.draw(st.sampled_from(["change", "change", "drop", "repeat"]))
        if action == "change":
            obj[key] = _value(data, key)
        elif action == "drop":
            del obj[key]
        else:  # the same key twice: the last one counts
            pairs = Pairs(obj.items())
            first = data.draw(st.booleans())
            extra = (key, _value(data, key))
            return Pairs([extra, *pairs] if first else [*pairs, extra])
    if data.draw(st.booleans()):
        obj[data.draw(st.text(max_size=5))] = data.draw(wild)
    return obj


def _body(data: st.DataObject, record_type: str) -> bytes:
    if record_type == "transaction":
        record = test_records.tx()
        ops = record["operations"]
        if data.draw(st.booleans()):
            ops.append(
                test_records.op(
                    "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a03",
                    data.draw(st.sampled_from(["DEBIT", "CREDIT"])),
                    data.draw(amount_values),
                )
            )
        for index in data.draw(st.lists(st.sampled_from(range(len(ops))), max_size=2, unique=True)):
            ops[index] = _mutate(data, ops[index])
    else:
        record = test_records.ann(document=data.draw(document_values))
    text = write(_mutate(data, record)).encode("utf-8", "surrogatepass")
    damage = data.draw(st.sampled_from(["none"] * 6 + ["bom", "cut", "tail", "byte", "space"]))
    at = data.draw(st.integers(min_value=0, max_value=len(text)))
    if damage == "bom":
        return b"\xef\xbb\xbf" + text
    if damage == "cut":
        return text[:at]
    if damage == "tail":
        return text + data.draw(st.sampled_from([b" ", b"\n", b"x", b"{}", b"\x00"]))
    if damage == "byte":
        return (
            text[:at] + data.draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + text[at:]
        )
    if damage == "space":
        return b" \t\r\n" + text + b"\n"
    return text


# 400 drawn bodies a run in make test (~10 s), 1,500 under SOAK=1 (make soak)
@settings(
    max_examples=1500 if SOAK else 400,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(st.data(), st.sampled_from(["transaction", "credit_annotation"]))
def test_drawn_bodies_get_the_same_verdict_and_reason(
    data: st.DataObject, record_type: str
) -> None:
    body = _body(data, record_type)
    for kind in (
        record_type,
        "credit_annotation" if record_type == "transaction" else "transaction",
    ):
        with contextlib.suppress(RecordError):
            both(body, kind)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200) | wild.map(lambda v: write(v).encode("utf-8", "surrogatepass")))
def test_any_bytes_get_the_same_verdict_and_reason(body: bytes) -> None:
    for kind in ("transaction", "credit_annotation"):
        with contextlib.suppress(RecordError):
            both(body, kind)


def test_a_body_malformed_and_nested_near_the_recursion_limit_is_refused_either_way() -> None:
    for depth in range(980, 1010):
        body = b'{"a":' + b"[" * depth + b"x"
        old = _words(_verdict(decode_oracle.decode, body, "transaction"))
        new = _words(_verdict(decode, body, "transaction"))
        assert old in DEEP_OR_BAD
        assert new in DEEP_OR_BAD
        assert new == old or _near_the_recursion_limit(body, old, new)


@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("description", '"\ue000\\ud800"'),  # a stand-in character beside a lone surrogate
        ("description", '"\ue000\ue001"'),  # the stand-ins alone are fine text
        ("description", '"\\ue000\\ud800\\ue001"'),
        ("metadata", '{"\ue001": "\\udc00", "k": "\ue000"}'),
        ("metadata", '{"\ue000": "\ue001"}'),
        ("note", '"\\ud800"'),  # a field nobody reads: accepted
    ],
)
def test_lone_surrogates_beside_the_stand_in_characters(field: str, raw: str) -> None:
    body = json.dumps(test_records.tx(**{field: "__X__"}), ensure_ascii=False)
    with contextlib.suppress(RecordError):
        both(body.replace('"__X__"', raw).encode(), "transaction")


def test_max_bytes_is_applied_alike() -> None:
    body = json.dumps(test_records.tx()).encode()
    for limit in (0, 10, len(body) - 1, len(body)):
        with contextlib.suppress(RecordError):
            both(body, "transaction", max_bytes=limit)
