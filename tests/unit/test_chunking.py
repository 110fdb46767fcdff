"""Chunk sizes at the boundaries, the parameter limit for wide tables, sorting and dedupe."""

from __future__ import annotations

import random
import uuid
from datetime import date
from decimal import Decimal

import pytest

from bulk_recorder.recorder.writer import (
    ANNOTATION_COLUMNS,
    OPERATION_COLUMNS,
    PG_MAX_PARAMETERS,
    TRANSACTION_COLUMNS,
    chunked,
    dedupe_sorted,
    rows_per_insert,
)
from bulk_recorder.records import CreditAnnotation


@pytest.mark.parametrize(
    ("rows", "expected"),
    [(999, [999]), (1000, [1000]), (1001, [1000, 1]), (2500, [1000, 1000, 500]), (0, [])],
)
def test_chunks_at_the_1000_row_boundary(rows: int, expected: list[int]) -> None:
    size = rows_per_insert(len(TRANSACTION_COLUMNS))
    assert size == 1000
    assert [len(c) for c in chunked(list(range(rows)), size)] == expected


def test_chunks_keep_every_item_in_order() -> None:
    items = list(range(2345))
    assert [x for c in chunked(items, 1000) for x in c] == items


@pytest.mark.parametrize("columns", [1, 9, 65, 66, 100, 1000, 65_535])
def test_rows_times_columns_never_reach_the_parameter_limit(columns: int) -> None:
    rows = rows_per_insert(columns)
    assert rows >= 1
    assert rows <= 1000
    if rows > 1:
        assert rows * columns <= PG_MAX_PARAMETERS
    if columns > 65:  # a wide table is capped below 1000 rows by the parameter limit
        assert rows == max(1, PG_MAX_PARAMETERS // columns)


def test_setting_lowers_the_cap_but_never_raises_it() -> None:
    assert rows_per_insert(9, 250) == 250
    assert rows_per_insert(9, 5000) == 1000
    assert rows_per_insert(len(OPERATION_COLUMNS), 1) == 1
    assert rows_per_insert(len(ANNOTATION_COLUMNS)) == 1000


def test_invalid_chunk_arguments() -> None:
    with pytest.raises(ValueError, match="columns"):
        rows_per_insert(0)
    with pytest.raises(ValueError, match="size"):
        list(chunked([1], 0))


def _annotation(record_id: str) -> CreditAnnotation:
    return CreditAnnotation(
        id=record_id,
        job_id=None,
        document="52998224725",
        document_type="CPF",
        kind="RESTRICTION",
        creditor="x",
        amount=Decimal("1.00"),
        occurred_on=date(2026, 11, 20),
        reason=None,
    )


def test_dedupe_sorted_orders_ids_and_counts_repeats() -> None:
    ids = [str(uuid.uuid4()) for _ in range(50)]
    records = [_annotation(i) for i in ids] + [_annotation(i) for i in ids[:7]]
    random.Random(1).shuffle(records)
    unique, repeats = dedupe_sorted(records)
    assert [r.id for r in unique] == sorted(ids)
    assert repeats == 7
