"""The request hash that tells a repeat from a different request (``Idempotency-Key`` and
transaction-id replays): the body's JSON with sorted keys, every number exact."""

from __future__ import annotations

import hashlib
import json

from bulk_recorder.producer.api.body import canonical_hash
from consumer.tools.generator import Generator
from tests.unit.test_records import tx

PLACEHOLDER = b'"__M__"'


def _with_metadata(raw: bytes) -> bytes:
    return json.dumps(tx(metadata="__M__")).encode().replace(PLACEHOLDER, raw)


def test_a_metadata_number_past_float_precision_is_a_different_request() -> None:
    # jsonb stores both exactly: they are different transactions' content, not a repeat.
    short, long = _with_metadata(b'{"x": 0.1}'), _with_metadata(b'{"x": 0.10000000000000000001}')
    assert canonical_hash(short) != canonical_hash(long)
    assert canonical_hash(_with_metadata(b'{"x": 2.50}')) != canonical_hash(
        _with_metadata(b'{"x": 2.5}')
    )


def test_spacing_and_key_order_are_the_same_request() -> None:
    record = tx(metadata={"b": [1, 2.5, None], "a": "\u00e7\u00e3o \n \x1f"})
    compact = json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()
    spaced = json.dumps(dict(reversed(list(record.items()))), indent=2).encode()
    assert canonical_hash(compact) == canonical_hash(spaced)


def test_a_body_without_fractions_hashes_as_it_did_before_msgspec() -> None:
    # Requests stored before the change must still be recognised when repeated.
    gen = Generator.create(11)
    bodies = [json.dumps(gen.transaction()).encode() for _ in range(20)]
    bodies.append(json.dumps(tx(metadata={"k": '\u00e9\U0001f600 \\ " \x00 \x7f \u2028'})).encode())
    for body in bodies:
        before = json.dumps(
            json.loads(body), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        )
        assert canonical_hash(body) == hashlib.sha256(before.encode()).digest()


def test_a_lone_surrogate_in_a_field_nobody_reads_still_hashes() -> None:
    # decode() accepts it there; msgspec's parser refuses it.
    body = json.dumps(tx(note="__N__")).encode().replace(b'"__N__"', b'"\\ud800"')
    assert canonical_hash(body) == canonical_hash(body.replace(b", ", b","))
