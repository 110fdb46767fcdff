"""The growth benchmark (benchmarks/bench_growth.py) runs end to end in its quick mode, so that it
cannot rot between the long runs that fill benchmarks/RESULTS.md: a private PostgreSQL server
(skipped without the PostgreSQL 15 binaries), a prefill, drains through a real recorder, the
per-relation WAL, one round without an index, the checkpoint-spacing rounds, the tables.

The quick run takes some 30 s and proves no promise of the service, only that the benchmark
still runs: it is part of ``make soak`` (``SOAK=1``), not of ``make test``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.support.growth_sql import with_fillfactor
from tests.faults.conftest import SOAK
from tests.rigs import postgres_server

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.postgres, pytest.mark.rabbitmq, pytest.mark.slow]


def test_fillfactor_goes_before_a_partial_index_predicate() -> None:
    plain = "CREATE INDEX a ON public.t USING btree (x)"
    partial = "CREATE INDEX b ON public.t USING btree (job_id) WHERE (job_id IS NOT NULL)"
    assert with_fillfactor(plain, 70) == plain + " WITH (fillfactor = 70)"
    assert with_fillfactor(partial, 90) == (
        "CREATE INDEX b ON public.t USING btree (job_id) WITH (fillfactor = 90) "
        "WHERE (job_id IS NOT NULL)"
    )


@pytest.mark.skipif(not SOAK, reason="the growth benchmark's quick run is in make soak (SOAK=1)")
@pytest.mark.skipif(not postgres_server.available(), reason="no PostgreSQL 15 server binaries")
def test_quick_mode_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "growth.json"
    data_base = Path("/var/tmp")  # the postgres OS user must reach it (pytest's tmp is 0700)
    before = set(data_base.glob("br-growth-pg-*"))
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_growth", "--quick", "--ids", "v7",
         "--types", "transaction", "--optional-indexes", "--drop-indexes", "operations_account_idx",
         "--data-base", str(data_base), "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    left = set(data_base.glob("br-growth-pg-*")) - before
    assert not left, f"the private server's folder was left behind: {left}"
    data = json.loads(out.read_text())
    rounds = {(r["size"], r["compression"]): r for r in data["rounds"]}
    assert set(rounds) == {(0, "off"), (0, "on"), (50_000, "off"), (50_000, "on")}
    for r in rounds.values():
        assert r["wal_bytes"] > 0
        assert r["checkpoints"] == 0
        assert "operations_account_idx" in r["per_relation"]
    # A CHECKPOINT before each round: new pages need no full-page image, the prefilled ones do.
    assert rounds[(50_000, "off")]["wal_fpi"] > rounds[(0, "off")]["wal_fpi"]
    assert [r["dropped"] for r in data["index_rounds"]] == ["operations_account_idx"]
    assert [r["every"] for r in data["checkpoint_spacing"]] == [1_000, 0]
    assert data["checkpoint_spacing"][0]["forced_checkpoints"] >= 1
    for title in ("Growth:", "WAL per relation", "Indexes:", "Checkpoint spacing", "Extrapolation"):
        assert title in result.stdout
