"""Statistics and tables: medians with min-max over runs, markdown tables, JSON results."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(slots=True)
class Stat:
    """Values of one figure over several runs."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def low(self) -> float:
        return min(self.values) if self.values else float("nan")

    @property
    def high(self) -> float:
        return max(self.values) if self.values else float("nan")

    def fmt(self, digits: int = 0, unit: str = "") -> str:
        """``median (min-max)``, e.g. ``9,812 (9,500-10,100)``."""
        if not self.values:
            return "-"
        f = f"{{:,.{digits}f}}"
        core = f.format(self.median) + unit
        if len(self.values) == 1 or self.low == self.high:
            return core
        return f"{core} ({f.format(self.low)}-{f.format(self.high)})"


def ratio(numerator: Stat, denominator: Stat) -> Stat:
    """Per-run ratios (runs paired in order: both were taken in the same round)."""
    out = Stat()
    for a, b in zip(numerator.values, denominator.values, strict=False):
        out.add(a / b if b else float("nan"))
    return out


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines)


def emit(title: str, body: str) -> None:
    print(f"\n### {title}\n\n{body}\n", flush=True)


def save_json(path: str | None, data: Any) -> None:
    """Write raw results for the charts (``--json PATH``)."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
