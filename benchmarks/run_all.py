"""Run the benchmark set, keep every table, draw the charts (``make bench``).

    python -m benchmarks.run_all                 # the standard set, ~10-15 min on 2 cores
    python -m benchmarks.run_all --full --out benchmarks/results   # RESULTS.md (~3 h)
    python -m benchmarks.run_all --only bench_e2e bench_sweep
    python -m benchmarks.run_all --only bench_growth           # its quick mode (a few minutes)

Each benchmark runs as its own process (``python -m benchmarks.<name> ...``); its tables go
to ``<out>/<name>.md`` (and to the screen), its raw figures to ``<out>/<name>.json``, and the
charts to ``<out>/*.png`` (when matplotlib, from the ``bench`` extra, is installed). The
exact command of every benchmark is written at the top of its .md file.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.support.env import REPO
from benchmarks.support.stats import progress

# name -> (standard arguments, full-size arguments)
BENCHMARKS: dict[str, tuple[list[str], list[str]]] = {
    "bench_decode": ([], ["--number", "50000", "--repeat", "9"]),
    "bench_limits": (
        ["--count", "15000"],
        ["--count", "50000", "--pg-count", "200000", "--pg-each-count", "5000"],
    ),
    "bench_writer": ([], ["--chunks", "50", "--prefill", "1000000"]),
    "bench_e2e": (
        ["--count", "15000", "--per-message-count", "5000", "--db-latency-ms", "0", "1"],
        ["--count", "200000", "--per-message-count", "30000", "--db-latency-ms", "0", "1"],
    ),
    "bench_profile": ([], ["--count", "60000"]),
    "bench_sweep": (["--count", "15000"], ["--count", "40000"]),
    "bench_latency": ([], ["--loads", "250", "1000", "2000", "4000", "--seconds", "20"]),
    "bench_memory": ([], ["--count", "300000"]),
    "bench_scale": ([], ["--count", "60000"]),
    # one PostgreSQL primary's ceiling for the recorder's flushes, 1-8 writers, no broker
    "bench_db_ceiling": (["--records", "20000", "--rounds", "1"], []),
    # full set only: a private PostgreSQL server, tens of millions of rows prefilled (~1-2 h)
    "bench_growth": (
        ["--quick"],
        [
            "--ids",
            "v4",
            "v7",
            "v7p",
            "--points",
            "0",
            "2000000",
            "10000000",
            "--rounds",
            "2",
            "--drop-in",
            "v7",
            "--spacing-in",
            "v4",
            "v7",
        ],
    ),
}
FULL_ONLY = {"bench_growth"}


def run(name: str, extra: list[str], out: Path) -> tuple[int, float]:
    """Run one benchmark from the repository root; paths in its command stay relative."""
    rel = out.relative_to(REPO) if out.is_relative_to(REPO) else out
    command = [sys.executable, "-m", f"benchmarks.{name}", *extra]
    if name != "bench_decode":  # owned elsewhere: no --json flag
        command += ["--json", str(rel / f"{name}.json")]
    if name == "bench_profile":
        command += ["--out", str(rel / "profile.txt")]
    shown = "python -m " + " ".join(shlex.quote(c) for c in command[2:])
    progress(f"{shown}")
    started = time.monotonic()
    with open(out / f"{name}.md", "w", encoding="utf-8") as md:
        md.write(f"<!-- command: {shown} -->\n")
        md.flush()
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            md.write(line)
        code = proc.wait()
    return code, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--full", action="store_true", help="the full sizes of RESULTS.md")
    parser.add_argument("--only", nargs="+", choices=tuple(BENCHMARKS), help="a subset")
    parser.add_argument("--out", default="benchmarks/out", help="where tables and charts go")
    args = parser.parse_args()
    out = (REPO / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    timings = []
    for name, (standard, full) in BENCHMARKS.items():
        if args.only and name not in args.only:
            continue
        if name in FULL_ONLY and not args.full and not args.only:
            continue
        code, seconds = run(name, full if args.full else standard, out)
        timings.append((name, seconds, code))
        if code:
            failed.append(name)
    try:
        from benchmarks.charts import draw_all

        for path in draw_all(out):
            progress(f"chart {path}")
    except ImportError:
        progress("matplotlib not installed (pip install -e '.[bench]'): no charts")
    for name, seconds, code in timings:
        progress(f"{name:<14} {seconds:7.0f} s  {'ok' if code == 0 else f'FAILED ({code})'}")
    if failed:
        sys.exit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
