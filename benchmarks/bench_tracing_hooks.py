"""The recorder's tracing hooks alone, in-process: what one flush of N deliveries costs in CPU
for its span, off / ratio 0.01 / ratio 1.0, with no broker and no database in the way.

    python -m benchmarks.bench_tracing_hooks --flushes 5000 --size 50

Each flush runs :func:`bulk_recorder.recorder.flush_tracing.flush_span` over N deliveries whose
headers carry a ``traceparent`` each, with a ``settle`` child span, as the flusher does; spans
go to a batch processor whose exporter drops them (the export thread's work is left out: it is
measured end to end by ``bench_e2e --tracing``). Off, the flusher does not call it at all: the
"off" row times the flusher's own test of ``tracing.active()``. The modes alternate, and each
figure is the median of ``--runs`` rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider, sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from bulk_recorder.infra import tracing
from bulk_recorder.recorder.flush_tracing import flush_span


class _Drop(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def _tracer(ratio: float | None) -> object:
    if ratio is None:
        return None
    provider = TracerProvider(sampler=sampling.ParentBased(sampling.TraceIdRatioBased(ratio)))
    provider.add_span_processor(BatchSpanProcessor(_Drop()))
    return provider.get_tracer("bench")


def _round(ratio: float | None, flushes: int, carriers: list[dict[str, str]]) -> float:
    """CPU seconds per flush."""
    tracing._tracer = _tracer(ratio)  # type: ignore[assignment]
    started = time.process_time()
    for _ in range(flushes):
        if not tracing.active():
            continue
        with flush_span("q", "size", len(carriers), iter(carriers)), tracing.child_span("settle"):
            pass
    spent = time.process_time() - started
    tracing._tracer = None
    return spent / flushes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--flushes", type=int, default=5000)
    parser.add_argument("--size", type=int, default=50, help="deliveries a flush")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    carriers = [
        {"traceparent": f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"}
        for _ in range(args.size)
    ]
    modes: dict[str, float | None] = {"off": None, "ratio 0.01": 0.01, "ratio 1.0": 1.0}
    figures: dict[str, list[float]] = {m: [] for m in modes}
    for run in range(args.runs):
        order = list(modes)[run % 3 :] + list(modes)[: run % 3]
        for mode in order:
            figures[mode].append(_round(modes[mode], args.flushes, carriers))
    print(f"flush of {args.size} traced deliveries, median of {args.runs} rounds (CPU time)\n")
    print("| mode | us a flush | us a message |")
    print("|---|---|---|")
    for mode, values in figures.items():
        per_flush = statistics.median(values) * 1e6
        print(f"| {mode} | {per_flush:.1f} | {per_flush / args.size:.2f} |")


if __name__ == "__main__":
    main()
