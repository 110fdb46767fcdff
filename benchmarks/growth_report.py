"""Tables of the growth benchmark, from its JSON (``bench_growth --json``), and the 50M model.

    python -m benchmarks.growth_report benchmarks/results/bench_growth.json [more.json ...]

Extrapolation (``predict``): a relation whose writes land on random pages (an index led by a
random key, the balances), P pages hit k times between two checkpoints, writes
P (1 - exp(-k / P)) full-page images: the first change of each page it touches after a
checkpoint writes the whole page. k is known (a round's records times the relation's writes per
record), P is measured and grows with the rows (balances stay at a million accounts), an image
costs its mean measured size. Appending relations write almost no images and stay flat. No
parameter is fitted; the table checks the model against the largest measured point.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.support.growth_sql import random_keyed
from benchmarks.support.stats import Stat, table

GROWING = ("transactions", "operations", "credit_annotations")


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _fmt(value: float, digits: int = 0) -> str:
    return "-" if math.isnan(value) else f"{value:,.{digits}f}"


def _size(n: int) -> str:
    return "empty" if n == 0 else (f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k")


def _group(rounds: list[dict[str, Any]]) -> dict[tuple[str, str, str, int], list[dict[str, Any]]]:
    out: dict[tuple[str, str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rounds:
        out[(r["type"], r["kind"], r["compression"], r["size"])].append(r)
    return out


def _per_record(rows: list[dict[str, Any]], key: str, count: int) -> Stat:
    return Stat([r[key] / count for r in rows])


def _ratio(
    rows: list[dict[str, Any]], base: list[dict[str, Any]], key: str, *, same_run: bool = True
) -> Stat:
    """Per-round ratios, round i against the empty point's round i of the same run; with
    ``same_run=False`` (deterministic figures such as WAL bytes) against the median of the
    empty point's rounds of any run."""
    if not same_run:
        mid = _median([b[key] for b in base])
        return Stat([r[key] / mid for r in rows] if base and mid else [])
    by_round = {(b.get("run", 0), b["round"]): b[key] for b in base}
    return Stat(
        [
            r[key] / by_round[(r.get("run", 0), r["round"])]
            for r in rows
            if by_round.get((r.get("run", 0), r["round"]))
        ]
    )


def avg_disk(points: list[dict[str, Any]], kind: str, size: int, record_type: str) -> float:
    for p in points:
        if p["kind"] == kind and p["size"] == size:
            if record_type == "transaction":
                rows = p["rows"]["transactions"]
                total = p["sizes"]["transactions"] + p["sizes"]["operations"]
            else:
                rows = p["rows"]["credit_annotations"]
                total = p["sizes"]["credit_annotations"]
            return total / rows if rows else float("nan")
    return float("nan")


def main_table(out: dict[str, Any]) -> str:
    count = out["count"]
    groups = _group(out["rounds"])
    rows = []
    for (record_type, kind, comp, size), rs in sorted(groups.items()):
        base = groups.get((record_type, kind, comp, 0), [])
        fpi = _per_record(rs, "wal_fpi", count)
        rows.append(
            (
                record_type,
                kind,
                comp,
                _size(size),
                Stat([r["rate"] for r in rs]).fmt(),
                _ratio(rs, base, "rate").fmt(2, "x"),
                Stat([r["cpu_us"] for r in rs]).fmt(0),
                _per_record(rs, "wal_bytes", count).fmt(0),
                _ratio(rs, base, "wal_bytes", same_run=False).fmt(2, "x"),
                fpi.fmt(2),
                _per_record(rs, "disk_bytes", count).fmt(0),
                _fmt(avg_disk(out["points"], kind, size, record_type)),
            )
        )
    return table(
        ["record", "ids", "wal_compression", "tables", "msg/s", "vs empty", "CPU us/record",
         "WAL B/record", "vs empty", "FPI/record", "disk B/record (round)",
         "disk B/record (table avg)"],
        rows,
    )  # fmt: skip


def _relation_rows(rs: list[dict[str, Any]], count: int) -> dict[str, tuple[float, float, float]]:
    """relation -> (WAL B/record, FPI/record, mean FPI bytes), medians over rounds."""
    acc: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for r in rs:
        for rel, v in (r.get("per_relation") or {}).items():
            mean = v["fpi_bytes"] / v["fpis"] if v["fpis"] else 0.0
            acc[rel].append((v["bytes"] / count, v["fpis"] / count, mean))
    return {
        rel: (_median([x[0] for x in xs]), _median([x[1] for x in xs]), _median([x[2] for x in xs]))
        for rel, xs in acc.items()
    }


def relation_table(out: dict[str, Any], record_type: str, kind: str, comp: str) -> str:
    count = out["count"]
    groups = _group(out["rounds"])
    sizes = sorted(s for (t, k, c, s) in groups if (t, k, c) == (record_type, kind, comp))
    per = {s: _relation_rows(groups[(record_type, kind, comp, s)], count) for s in sizes}
    rels = sorted(
        {rel for p in per.values() for rel in p}, key=lambda x: -per[sizes[-1]].get(x, (0, 0, 0))[0]
    )
    rows = []
    for rel in rels:
        if all(per[s].get(rel, (0, 0, 0))[0] < 1 for s in sizes):
            continue
        cells = []
        for s in sizes:
            b, f, _ = per[s].get(rel, (0.0, 0.0, 0.0))
            cells.append(f"{b:,.0f} B, {f:.2f} FPI")
        rows.append((rel, *cells))
    return table(["relation (WAL per record)", *(_size(s) for s in sizes)], rows)


def index_table(out: dict[str, Any]) -> str:
    count = out["count"]
    groups = _group(out["rounds"])
    rows = []
    for r in out["index_rounds"]:
        base = groups.get((r["type"], r["kind"], "off", r["size"]), [])
        if not base:
            continue
        rel = _relation_rows(base, count).get(r["dropped"], (float("nan"), float("nan"), 0.0))
        base_wal = _median([b["wal_bytes"] / count for b in base])
        base_us = _median([1e6 / b["rate"] for b in base])
        base_cpu = _median([b["cpu_us"] for b in base])
        rows.append(
            (
                r["dropped"],
                r["kind"],
                _size(r["size"]),
                _fmt(rel[0]),
                _fmt(rel[1], 2),
                _fmt(base_wal - r["wal_bytes"] / count),
                _fmt(r["rate"] / _median([b["rate"] for b in base]), 2) + "x",
                _fmt(base_us - 1e6 / r["rate"], 1),
                _fmt(base_cpu - r["cpu_us"], 1),
            )
        )
    return table(
        ["index", "ids", "tables", "its WAL B/record (walinspect)", "its FPI/record",
         "WAL saved B/record (dropped)", "rate without it vs with", "wall us/record saved",
         "CPU us/record saved"],
        rows,
    )  # fmt: skip


def spacing_table(out: dict[str, Any]) -> str:
    rows = []
    for r in out["checkpoint_spacing"]:
        n = r["count"]
        rows.append(
            (
                r["kind"],
                _size(r["size"]),
                f"{r['every']:,}" if r["every"] else f"none ({n:,} records)",
                r["forced_checkpoints"],
                _fmt(r["rate"]),
                _fmt(r["wal_bytes"] / n),
                _fmt(r["wal_fpi"] / n, 2),
                _fmt(r["cpu_us"]),
            )
        )
    return table(
        ["ids", "tables", "CHECKPOINT every N records", "checkpoints forced", "msg/s",
         "WAL B/record", "FPI/record", "CPU us/record"],
        rows,
    )  # fmt: skip


def _pages(out: dict[str, Any], kind: str, size: int) -> dict[str, int]:
    for p in out["points"]:
        if p["kind"] == kind and p["size"] == size:
            return dict(p["pages"])
    return {}


def _grows(rel: str) -> bool:
    return rel.startswith(GROWING)


def random_relation(rel: str, kind: str) -> bool:
    """A relation whose inserts (or updates) land on any of its pages: the balances, and the
    indexes led by a random key (growth_sql.random_keyed)."""
    return rel in ("balances", "balances_pkey") or random_keyed(rel, kind)


def touches(rel: str) -> int:
    """Inserts into (or updates of) ``rel`` a record makes: two operations, two balances."""
    return 2 if rel.startswith(("operations", "balances")) else 1


def touched_pages(pages: float, touches_: float) -> float:
    """Distinct pages of a relation of ``pages`` pages that ``touches_`` uniform hits reach."""
    return pages * (1 - math.exp(-touches_ / pages)) if pages > 0 else 0.0


def predict(
    out: dict[str, Any],
    record_type: str,
    kind: str,
    comp: str,
    from_size: int,
    to_size: int,
    per_checkpoint: int | None = None,
) -> tuple[float, float] | None:
    """(WAL B/record, FPI/record) at ``to_size`` rows and ``per_checkpoint`` records between
    two checkpoints (default: a round), from the rounds and pages measured at ``from_size``.

    Each random relation of P pages hit k times between two checkpoints writes
    P (1 - exp(-k / P)) full-page images (the first change of each page it touches), of their
    mean measured size; P scales with the rows (balances: a million accounts, fixed). The rest
    of the WAL per record (the records themselves, the appending relations' few images) is
    taken as measured."""
    count = out["count"]
    n = per_checkpoint or count
    rs = _group(out["rounds"]).get((record_type, kind, comp, from_size))
    pages = _pages(out, kind, from_size)
    if not rs or not pages or from_size == 0 or not rs[0].get("per_relation"):
        return None
    wal = _median([r["wal_bytes"] / count for r in rs])
    fpi = _median([r["wal_fpi"] / count for r in rs])
    for rel, (_, f_rec, mean_fpi) in _relation_rows(rs, count).items():
        p = pages.get(rel, 0)
        if not random_relation(rel, kind) or p <= 1:
            continue
        p_to = p * to_size / from_size if _grows(rel) else p
        f_to = touched_pages(p_to, touches(rel) * n) / n
        wal += (f_to - f_rec) * mean_fpi
        fpi += f_to - f_rec
    return wal, fpi


def extrapolation_table(
    out: dict[str, Any], target: int = 50_000_000, rates: tuple[int, ...] = (5_000,)
) -> str:
    """For each variant: the model checked against its largest point (from its smallest), then
    carried from the largest to ``target`` rows, at a round's records per checkpoint and at 5 and
    15 minutes of ``rates`` records/s."""
    groups = _group(out["rounds"])
    spans = [(f"{m} min at {r:,}/s", r * m * 60) for r in rates for m in (5, 15)]
    rows = []
    for record_type, kind, comp in sorted({(t, k, c) for (t, k, c, _) in groups}):
        sizes = sorted(s for (t, k, c, s) in groups if (t, k, c) == (record_type, kind, comp))
        sizes = [s for s in sizes if s > 0]
        if kind == "v7p" or not sizes:  # v7p: today's partition's size is set by the span
            continue
        measured = groups[(record_type, kind, comp, sizes[-1])]
        empty = groups.get((record_type, kind, comp, 0), [])
        m_wal = _median([r["wal_bytes"] / out["count"] for r in measured])
        e_wal = _median([r["wal_bytes"] / out["count"] for r in empty]) if empty else math.nan
        check = predict(out, record_type, kind, comp, sizes[0], sizes[-1])
        far = predict(out, record_type, kind, comp, sizes[-1], target)
        cells = [
            f"{_size(sizes[0])} -> {_size(sizes[-1])}: {_fmt(check[0])} (measured {_fmt(m_wal)})"
            if check and len(sizes) > 1
            else f"(one point, {_size(sizes[-1])}: measured {_fmt(m_wal)})",
            f"{_fmt(far[0])} ({_fmt(far[1], 2)} FPI)" if far else "-",
            (_fmt(far[0] / e_wal, 2) + "x") if far and e_wal == e_wal else "-",
        ]
        for _, n in spans:
            cp = predict(out, record_type, kind, comp, sizes[-1], target, per_checkpoint=n)
            cells.append(f"{_fmt(cp[0])} ({_fmt(cp[1], 2)} FPI)" if cp else "-")
        rows.append((record_type, kind, comp, *cells))
    far_s = _size(target)
    return table(
        ["record", "ids", "wal_compression", "model checked, WAL B/record",
         f"{far_s}, a round ({out['count']:,} records) between checkpoints",
         f"{far_s} vs empty", *(f"{far_s}, checkpoint every {label}" for label, _ in spans)],
        rows,
    )  # fmt: skip


def render(out: dict[str, Any]) -> list[tuple[str, str]]:
    count = out["count"]
    sections = [
        ("Private server", table(["setting", "value"], out.get("server", {}).items())),
        (
            f"Growth: {count:,} records a round, one recorder, CHECKPOINT before each round "
            f"(median (min-max) of the rounds; ratios against the empty tables' round of the "
            f"same run; prefill: {out['prefill']})",
            main_table(out),
        ),
    ]
    groups = _group(out["rounds"])
    for record_type, kind in sorted({(t, k) for (t, k, _, _) in groups}):
        if any(r.get("per_relation") for r in out["rounds"]):
            sections.append(
                (f"WAL per relation: {record_type}, {kind}, wal_compression off (pg_walinspect)",
                 relation_table(out, record_type, kind, "off"))
            )  # fmt: skip
    if out["index_rounds"]:
        sections.append(("Indexes: each dropped in turn (one round each)", index_table(out)))
    if out["checkpoint_spacing"]:
        sections.append(("Checkpoint spacing (wal_compression off)", spacing_table(out)))
    sections.append(
        ("Extrapolation (page-touch model, see growth_report.py)", extrapolation_table(out))
    )
    return sections


def merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' JSON as one (same records a round): each round keeps its run's number, so
    that rates are compared within a run only."""
    out = dict(runs[0])
    for key in ("points", "rounds", "index_rounds", "checkpoint_spacing"):
        out[key] = [{**x, "run": i} for i, run in enumerate(runs) for x in run.get(key, [])]
    if any(run["count"] != out["count"] for run in runs):
        raise SystemExit("runs with different records a round cannot be merged")
    return out


if __name__ == "__main__":
    data = merge([json.loads(Path(a).read_text(encoding="utf-8")) for a in sys.argv[1:]])
    for title, body in render(data):
        print(f"\n### {title}\n\n{body}\n")
