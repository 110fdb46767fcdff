"""Microseconds per ``decode()`` (parse + validate) for each record type.

Run with ``python -m benchmarks.bench_decode [--number N] [--repeat R]``. The decoder before
msgspec (hand-written checks on the stdlib parser, kept as the oracle of the differential test in
``tests/unit/decode_oracle.py``) is timed in the same run, so the ratio holds on a busy machine
too, and so is the standard library's bare ``json.loads`` of the same body: issue 30's target is
``decode`` at no more than 1.0x of it (the ``vs json.loads`` column). Each figure is the
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
import time
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


def measure(
    calls: dict[str, Callable[[], object]], number: int, repeat: int, timer: Callable[[], float]
) -> dict[str, float]:
    """Median microseconds per call of each, the calls taking turns in every round (so a
    neighbour's burst slows all of them alike, not one block of runs)."""
    runs: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeat):
        for name, call in calls.items():
            runs[name].append(timeit.Timer(call, timer=timer).timeit(number))
    return {name: statistics.median(times) / number * 1e6 for name, times in runs.items()}


TIMERS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--number", type=int, default=20_000, help="calls per timed run")
    parser.add_argument("--repeat", type=int, default=7, help="timed runs (median is printed)")
    parser.add_argument(
        "--timer",
        choices=sorted(TIMERS),
        default="wall",
        help="wall clock, or this thread's CPU time (steadier when other processes share the "
        "cores: time spent preempted is not counted)",
    )
    args = parser.parse_args()

    print(
        f"python {platform.python_version()}, median of {args.repeat} runs x {args.number} calls,"
        f" {args.timer} time"
    )
    for record_type, body in CASES.items():
        record = decode(body, record_type)  # fail fast if the sample is invalid
        calls: dict[str, Callable[[], object]] = {
            "decode": partial(decode, body, record_type),
            "loads": partial(json.loads, body),
            "msgspec": partial(msgspec.json.decode, body),
        }
        if old_decode is not None:
            assert repr(old_decode(body, record_type)) == repr(record)
            calls["oracle"] = partial(old_decode, body, record_type)
        us = measure(calls, args.number, args.repeat, TIMERS[args.timer])
        line = (
            f"{record_type:<18} {len(body):>4} bytes  decode+validate {us['decode']:6.2f} us/msg"
            f"  json.loads {us['loads']:6.2f} us, vs json.loads {us['decode'] / us['loads']:4.2f}x"
            f"  (msgspec.json.decode alone {us['msgspec']:5.2f} us"
        )
        if "oracle" in us:
            line += f"; before msgspec {us['oracle']:6.2f} us, {us['oracle'] / us['decode']:4.1f}x"
        print(line + ")")


if __name__ == "__main__":
    main()
