"""Microseconds per ``decode()`` (parse + validate) for each record type.

Run with ``python -m benchmarks.bench_decode [--number N] [--repeat R]``. The decoder before
msgspec (hand-written checks on the stdlib parser, kept as the oracle of the differential test in
``tests/unit/decode_oracle.py``) is timed in the same run, so the ratio holds on a busy machine
too. Each figure is the
median over ``repeat`` timeit runs of ``number`` calls, so one slow run (a GC pass, a noisy
neighbour) does not move it. The messages are the typical shapes of docs/messages.md: a
transaction with two operations and a small metadata object (~600 bytes) and a credit
annotation with a formatted CPF.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import timeit
from collections.abc import Callable
from functools import partial
from typing import Any

import msgspec

from bulk_recorder.records import decode

old_decode: Callable[..., Any] | None
try:  # the repository's tests/ (not installed with the package)
    from tests.unit.decode_oracle import decode as old_decode
except ImportError:  # pragma: no cover
    old_decode = None

TRANSACTION = json.dumps(
    {
        "id": "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a7b",
        "organization_id": "0193a3c4-0000-7000-8000-000000000001",
        "ledger_id": "0193a3c4-0000-7000-8000-000000000002",
        "description": "Payment for invoice 2026-11-0042 (monthly subscription)",
        "status": "APPROVED",
        "asset_code": "BRL",
        "amount": "150.00",
        "created_at": "2026-11-29T12:00:00Z",
        "metadata": {"channel": "pix", "invoice": "2026-11-0042", "attempt": 1},
        "operations": [
            {
                "id": "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a01",
                "account_id": "0193a3c4-0000-7000-8000-0000000000a1",
                "type": "DEBIT",
                "amount": "150.00",
                "asset_code": "BRL",
            },
            {
                "id": "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a02",
                "account_id": "0193a3c4-0000-7000-8000-0000000000a2",
                "type": "CREDIT",
                "amount": "150.00",
                "asset_code": "BRL",
            },
        ],
    }
).encode()

CREDIT_ANNOTATION = json.dumps(
    {
        "id": "0193a3c4-5b6e-7f80-9a1b-2c3d4e5f6a7c",
        "job_id": "0193a3c4-0000-7000-8000-0000000000f1",
        "document": "529.982.247-25",
        "kind": "RESTRICTION",
        "creditor": "Banco Exemplo S.A.",
        "amount": "1200.00",
        "occurred_on": "2026-11-20",
        "reason": "overdue loan installment",
    }
).encode()

CASES: dict[str, bytes] = {"transaction": TRANSACTION, "credit_annotation": CREDIT_ANNOTATION}


def measure(call: Callable[[], object], number: int, repeat: int) -> float:
    """Median microseconds per call."""
    runs = timeit.repeat(call, number=number, repeat=repeat)
    return statistics.median(runs) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--number", type=int, default=20_000, help="calls per timed run")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs (median is printed)")
    args = parser.parse_args()

    print(f"python {platform.python_version()}, median of {args.repeat} runs x {args.number} calls")
    for record_type, body in CASES.items():
        record = decode(body, record_type)  # fail fast if the sample is invalid
        decode_us = measure(partial(decode, body, record_type), args.number, args.repeat)
        parse_us = measure(partial(msgspec.json.decode, body), args.number, args.repeat)
        line = (
            f"{record_type:<18} {len(body):>4} bytes  decode+validate {decode_us:6.2f} us/msg"
            f"  (msgspec.json.decode alone {parse_us:5.2f} us"
        )
        if old_decode is not None:
            assert repr(old_decode(body, record_type)) == repr(record)
            old_us = measure(partial(old_decode, body, record_type), args.number, args.repeat)
            line += f"; before msgspec {old_us:6.2f} us, {old_us / decode_us:4.1f}x"
        print(line + ")")


if __name__ == "__main__":
    main()
