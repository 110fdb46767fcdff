"""The indexes earn their cost (issue 28, item 3): after ``migrate`` the recorder's tables hold
exactly the indexes docs/performance.md names, each for a query this project runs. Two indexes
of 001 that no query of the project reads, led by a random key (their WAL grows with the table),
are gone since migration 011; a deployment that reads statements or documents adds them back.
"""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg
import pytest

from bulk_recorder.infra.migrate import migrate

pytestmark = [pytest.mark.postgres]

DOC = Path(__file__).resolve().parents[2] / "docs" / "performance.md"
LEDGER = ("transactions", "operations", "credit_annotations", "balances")
UNREAD = {"operations_account_idx", "credit_annotations_document_idx"}


def _documented() -> dict[str, str]:
    """The index table of docs/performance.md: name -> whether the schema ships it."""
    section = DOC.read_text().split("### The indexes and the queries they serve", 1)[1]
    section = section.split("\n#", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \|.*\| (shipped|dropped by 011) \|$", section, re.M)
    return dict(rows)


async def test_the_recorders_tables_hold_exactly_the_indexes_the_docs_name(
    database_url: str,
) -> None:
    await migrate(database_url)
    conn = await asyncpg.connect(database_url)
    try:
        present = {
            r["indexname"]
            for r in await conn.fetch(
                "SELECT indexname FROM pg_indexes WHERE tablename = ANY($1::text[])", list(LEDGER)
            )
        }
    finally:
        await conn.close()
    documented = _documented()
    assert {name for name, state in documented.items() if state == "shipped"} == present
    assert {name for name, state in documented.items() if state == "dropped by 011"} == UNREAD
    assert not present & UNREAD
