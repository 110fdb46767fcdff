"""PNG charts from the benchmarks' ``--json`` files (needs matplotlib: the ``bench`` extra).

    python -m benchmarks.charts benchmarks/results

Bars are medians over the runs, whiskers the min and max.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

_MODE_ORDER = {"raw aio-pika": 0, "raw aiormq": 1, "per-message": 9}


def _load(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / f"{name}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _mid(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def _bars(ax: Any, labels: list[str], values: list[list[float]], color: str = "C0") -> None:
    mids = [_mid(v) for v in values]
    y = [m[0] for m in mids]
    err = [[m[0] - m[1] for m in mids], [m[2] - m[0] for m in mids]]
    ax.bar(labels, y, yerr=err, capsize=4, color=color)
    for i, v in enumerate(y):
        ax.annotate(f"{v:,.0f}", (i, v), ha="center", va="bottom", fontsize=8)


def e2e_chart(folder: Path) -> Path | None:
    data = _load(folder, "bench_e2e")
    if data is None:
        return None
    results = data["results"]
    latencies = sorted({r["db_latency_ms"] for r in results})
    types = sorted({r["type"] for r in results})
    fig, axes = plt.subplots(
        len(latencies), len(types), figsize=(6 * len(types), 4 * len(latencies)), squeeze=False
    )
    for i, latency in enumerate(latencies):
        for j, record_type in enumerate(types):
            ax = axes[i][j]
            rows = [r for r in results if r["type"] == record_type]
            labels, values = [], []
            for r in sorted(rows, key=lambda r: _MODE_ORDER.get(r["mode"], 2)):
                if r["db_latency_ms"] == latency or (r["mode"].startswith("raw") and i > 0):
                    labels.append(r["mode"])
                    values.append(r["rate"])
            _bars(ax, labels, values)
            where = "loopback" if latency == 0 else f"database +{latency:g} ms"
            ax.set_title(f"{record_type}, {where}")
            ax.set_ylabel("msg/s")
            ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle("Recorder bulk vs per-message vs raw consume limit (same rounds)")
    return _save(fig, folder / "e2e.png")


def sweep_chart(folder: Path) -> Path | None:
    data = _load(folder, "bench_sweep")
    if data is None:
        return None
    by_point: dict[tuple[int, ...], list[float]] = defaultdict(list)
    for r in data["results"]:
        by_point[tuple(r["point"])].append(r["rate"])
    fig, ax = plt.subplots(figsize=(8, 5))
    for point, rates in sorted(by_point.items()):
        workers, prefetch, size, timeout = point
        batch = size or workers * prefetch
        mid, low, high = _mid(rates)
        ax.errorbar(
            [batch], [mid], yerr=[[mid - low], [high - mid]], fmt="o", capsize=4, color="C0"
        )
        ax.annotate(
            f"w{workers} p{prefetch}{' s' + str(size) if size else ''} t{timeout}",
            (batch, mid),
            textcoords="offset points",
            xytext=(5, 5),
            fontsize=8,
        )
    ax.set_xscale("log")
    ax.set_xlabel("flush size (BULK_RECORDER_SIZE, or workers x prefetch)")
    ax.set_ylabel("msg/s")
    ax.set_title("Throughput vs batch size (transactions)")
    return _save(fig, folder / "sweep.png")


def latency_chart(folder: Path) -> Path | None:
    data = _load(folder, "bench_latency")
    if data is None:
        return None
    by_rate: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in data["results"]:
        for key in ("commit p50", "commit p99", "broker p99"):
            if key in r:
                by_rate[r["rate"]][key].append(r[key])
    rates = sorted(by_rate)
    fig, ax = plt.subplots(figsize=(8, 5))
    for key, color in (("commit p50", "C0"), ("commit p99", "C3"), ("broker p99", "C2")):
        if not all(by_rate[x][key] for x in rates):
            continue
        mids = [_mid(by_rate[x][key]) for x in rates]
        ax.errorbar(
            rates,
            [m[0] for m in mids],
            yerr=[[m[0] - m[1] for m in mids], [m[2] - m[0] for m in mids]],
            fmt="-o",
            capsize=4,
            color=color,
            label="broker-only p99 (no recorder)" if key == "broker p99" else key,
        )
    target = data.get("target_ms", 150)  # files written before target_ms: the default 100 + 50
    label = f"target p99 (timeout + 50 ms = {target:g} ms)"
    ax.axhline(target, color="grey", linestyle="--", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("offered load, msg/s")
    ax.set_ylabel("publish -> commit, ms")
    ax.set_title(f"Latency vs load ({data.get('config', '')})")
    ax.legend()
    return _save(fig, folder / "latency.png")


def writer_chart(folder: Path) -> Path | None:
    data = _load(folder, "bench_writer")
    if data is None:
        return None
    tables = sorted({r["table"] for r in data["results"]})
    fig, axes = plt.subplots(1, len(tables), figsize=(7 * len(tables), 4.5), squeeze=False)
    for ax, table_name in zip(axes[0], tables, strict=True):
        rows = [
            r
            for r in data["results"]
            if r["table"] == table_name and r["order"] == "sorted" and r["dup"] == 0
        ]
        _bars(ax, [r["method"] for r in rows], [r["values"] for r in rows], color="C2")
        ax.set_title(f"{table_name}: 1,000-row chunks, sorted ids, 0% duplicates")
        ax.set_ylabel("rows/s")
        ax.tick_params(axis="x", labelrotation=20)
    return _save(fig, folder / "writer.png")


def limits_chart(folder: Path) -> Path | None:
    data = _load(folder, "bench_limits")
    if data is None:
        return None
    prefetches = sorted({r["prefetch"] for r in data["consume"]})
    fig, axes = plt.subplots(1, len(prefetches), figsize=(6 * len(prefetches), 4.5), squeeze=False)
    for ax, prefetch in zip(axes[0], prefetches, strict=True):
        rows = [r for r in data["consume"] if r["prefetch"] == prefetch]
        _bars(ax, [r["kind"] for r in rows], [r["rate"] for r in rows], color="C1")
        ax.set_title(f"Consume + ack each, no work, QoS {prefetch}")
        ax.set_ylabel("msg/s")
        ax.tick_params(axis="x", labelrotation=20)
    return _save(fig, folder / "limits.png")


_GROWTH_PANELS = (
    ("rate", "msg/s"),
    ("cpu_us", "CPU us/record (recorder + backends)"),
    ("wal_bytes", "WAL bytes/record"),
    ("disk_bytes", "disk bytes/record added in the round (table + indexes)"),
)


def growth_chart(folder: Path) -> Path | None:
    """bench_growth (every bench_growth*.json of the folder): each figure against the rows
    already in the tables, a line per variant."""
    from benchmarks.growth_report import merge

    runs = [
        json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("bench_growth*.json"))
    ]
    if not runs:
        return None
    data = merge(runs)  # the main run and any smaller runs beside it (same records a round)
    if not data.get("rounds"):
        return None
    count = data["count"]
    types = sorted({r["type"] for r in data["rounds"]}, reverse=True)
    fig, axes = plt.subplots(len(types), 4, figsize=(20, 4.5 * len(types)), squeeze=False)
    for row, record_type in zip(axes, types, strict=True):
        lines: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
        for r in data["rounds"]:
            if r["type"] == record_type:
                label = f"{r['kind']}, wal_compression {r['compression']}"
                lines[label][r["size"]].append(r)
        for ax, (key, unit) in zip(row, _GROWTH_PANELS, strict=True):
            for label, by_size in sorted(lines.items()):
                sizes = sorted(by_size)
                per = [1.0 if key in ("rate", "cpu_us") else 1.0 / count]
                ys = [statistics.median(r[key] * per[0] for r in by_size[s]) for s in sizes]
                ax.plot([s / 1e6 for s in sizes], ys, "-o", label=label)
            ax.set_title(f"{record_type}: {unit}")
            ax.set_xlabel("rows already in the table (millions)")
            ax.set_ylim(bottom=0)
        row[0].legend(fontsize=8)
    fig.suptitle(f"Growth: {count:,} records a round, one recorder, CHECKPOINT before each round")
    return _save(fig, folder / "growth.png")


def draw_all(folder: Path) -> list[Path]:
    out = []
    for draw in (e2e_chart, sweep_chart, latency_chart, writer_chart, limits_chart, growth_chart):
        path = draw(folder)
        if path is not None:
            out.append(path)
    return out


if __name__ == "__main__":
    for p in draw_all(Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results")):
        print(p)
