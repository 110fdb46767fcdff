"""The growth benchmark's extrapolation (benchmarks/growth_report.py): the page-touch model that
carries the measured WAL per record to table sizes this machine cannot hold."""

from __future__ import annotations

import math
from typing import Any

import pytest

from benchmarks.growth_report import predict

COUNT = 1_000


def _out(
    pages: dict[str, int], fpis: dict[str, int], fpi_bytes: int = 8_000, kind: str = "v4"
) -> dict[str, Any]:
    per_relation = {
        rel: {"records": n, "bytes": n * fpi_bytes, "fpi_bytes": n * fpi_bytes, "fpis": n}
        for rel, n in fpis.items()
    }
    wal = sum(v["bytes"] for v in per_relation.values())
    return {
        "count": COUNT,
        "points": [{"kind": kind, "size": 1_000_000, "pages": pages}],
        "rounds": [
            {"type": "transaction", "kind": kind, "compression": "off", "size": 1_000_000,
             "round": 0, "wal_bytes": wal, "wal_fpi": sum(fpis.values()),
             "per_relation": per_relation}
        ],
    }  # fmt: skip


def _fpi(out: dict[str, Any], kind: str = "v4", **kw: Any) -> float:
    result = predict(out, "transaction", kind, "off", 1_000_000, 5_000_000, **kw)
    assert result is not None
    return result[1]


def test_in_an_index_far_larger_than_its_inserts_each_insert_writes_a_page() -> None:
    # two operations a record, each on a page of its own of 5,000,000
    out = _out({"operations_account_idx": 1_000_000}, {"operations_account_idx": 1_000})
    assert _fpi(out) == pytest.approx(2.0, rel=1e-3)


def test_an_index_its_inserts_cover_writes_each_page_once() -> None:
    # one insert a record into a v4 primary key: 1,000 hits on 5,000 pages
    out = _out({"transactions_pkey": 1_000}, {"transactions_pkey": 600})
    assert _fpi(out) * COUNT == pytest.approx(5_000 * (1 - math.exp(-1_000 / 5_000)))


def test_balances_do_not_grow_with_the_ledger() -> None:
    out = _out({"balances": 1_000}, {"balances": 600})
    assert _fpi(out) * COUNT == pytest.approx(1_000 * (1 - math.exp(-2)))


def test_an_appending_index_keeps_its_measured_images() -> None:
    out = _out({"operations_pkey": 1_000}, {"operations_pkey": 3}, kind="v7")
    assert _fpi(out, kind="v7") * COUNT == pytest.approx(3)


def test_more_records_between_checkpoints_write_fewer_images_a_record() -> None:
    out = _out({"operations_account_idx": 1_000}, {"operations_account_idx": 1_000})
    assert _fpi(out, per_checkpoint=1_000_000) == pytest.approx(5_000 / 1_000_000, rel=1e-3)
