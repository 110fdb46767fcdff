"""The growth benchmark's extrapolation (benchmarks/growth_report.py): the page-touch model that
carries the measured WAL per record to table sizes this machine cannot hold."""

from __future__ import annotations

import math
from typing import Any

import pytest

from benchmarks.growth_report import predict

COUNT = 1_000


def _out(pages: dict[str, int], fpis: dict[str, int], fpi_bytes: int = 8_000) -> dict[str, Any]:
    per_relation = {
        rel: {"records": n, "bytes": n * fpi_bytes, "fpi_bytes": n * fpi_bytes, "fpis": n}
        for rel, n in fpis.items()
    }
    wal = sum(v["bytes"] for v in per_relation.values())
    return {
        "count": COUNT,
        "points": [{"kind": "v4", "size": 1_000_000, "pages": pages}],
        "rounds": [
            {"type": "transaction", "kind": "v4", "compression": "off", "size": 1_000_000,
             "round": 0, "wal_bytes": wal, "wal_fpi": sum(fpis.values()),
             "per_relation": per_relation}
        ],
    }  # fmt: skip


def test_a_relation_far_larger_than_its_touches_keeps_its_full_page_images() -> None:
    # 1,000 pages touched of 1,000,000: nearly every touch is a page of its own already
    out = _out({"operations_account_idx": 1_000_000}, {"operations_account_idx": 1_000})
    wal, fpi = predict(out, "transaction", "v4", "off", 1_000_000, 5_000_000) or (0.0, 0.0)
    assert fpi == pytest.approx(1.0, rel=1e-3)
    assert wal == pytest.approx(8_000, rel=1e-3)


def test_touches_that_cover_a_relation_grow_with_its_pages() -> None:
    # 600 of 1,000 pages touched: the same inserts spread over 5,000 pages touch more of them
    out = _out({"operations_pkey": 1_000}, {"operations_pkey": 600})
    k = -1_000 * math.log(1 - 0.6)
    expected = 5_000 * (1 - math.exp(-k / 5_000))
    _, fpi = predict(out, "transaction", "v4", "off", 1_000_000, 5_000_000) or (0.0, 0.0)
    assert fpi * COUNT == pytest.approx(expected, rel=1e-6)
    assert 600 < expected < k


def test_balances_do_not_grow_with_the_ledger() -> None:
    out = _out({"balances": 1_000}, {"balances": 600})
    _, fpi = predict(out, "transaction", "v4", "off", 1_000_000, 5_000_000) or (0.0, 0.0)
    assert fpi * COUNT == pytest.approx(600)
